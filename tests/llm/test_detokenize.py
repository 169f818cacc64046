"""Incremental detokenization (:class:`mgx_graph.llm.streaming.RowText`) against the tokenizer's own decode
of the whole sequence (transformers' ``decode``, an independent oracle): on byte-level BPE and Llama-style
byte-fallback pieces that split UTF-8 characters, with and without transformers' clean-up of spaces, the
streamed pieces join to exactly that text, never hold a partial character and each is a prefix of it; stop
strings that span pieces (and multi-byte characters) cut the text where ``str.find`` finds them, at the
token that completes them; the windows decoded per token stay short however long the text grows."""
from __future__ import annotations

import pytest

from mgx_graph.llm.streaming import RowText

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")

from text_tokenizers import TEXT, byte_level_bpe, llama_bpe  # noqa: E402

TOKENIZERS = {"byte_level": lambda: byte_level_bpe(), "byte_level_clean_up": lambda: byte_level_bpe(clean_up=True),
              "llama": llama_bpe}


@pytest.fixture(scope="module", params=sorted(TOKENIZERS))
def tok(request):
    return TOKENIZERS[request.param]()


class Counting:
    """``tok``'s decode, recording how many ids each call decodes."""

    def __init__(self, tok):
        self.tok, self.calls = tok, []

    def decode(self, ids, skip_special_tokens=True):
        self.calls.append(len(ids))
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)


def _stream(tok, ids, stop=()):
    """Feed ``ids`` to a RowText one by one: ``(pieces, final text, tokens taken, decode lengths of the adds)``;
    what was streamed after each token is a prefix of the final text."""
    counting = Counting(tok)
    pieces: list = []
    rt = RowText(counting, stop, pieces.append)
    joined = []
    for t in ids:
        stopped = rt.add(t)
        joined.append("".join(pieces))
        if stopped:
            break
    adds = list(counting.calls)
    final = rt.finish()
    assert all(final.startswith(j) for j in joined)
    return pieces, final, len(rt.tokens), adds


def test_streamed_pieces_join_to_the_decode_of_the_whole(tok):
    ids = tok(TEXT * 3)["input_ids"]
    whole = tok.decode(ids, skip_special_tokens=True)
    assert sum("\ufffd" in tok.decode(ids[:k]) for k in range(1, 200)) > 10  # pieces split characters
    counting = Counting(tok)
    pieces: list = []
    rt = RowText(counting, (), pieces.append)
    for t in ids:
        assert not rt.add(t)
        joined = "".join(pieces)
        assert "\ufffd" not in joined and whole.startswith(joined)
    adds = list(counting.calls)
    assert rt.finish() == whole and "".join(pieces) == whole
    # incremental: each token decodes a short window (a few tokens of context, a character's bytes), not
    # the whole output
    assert len(adds) >= len(ids) and max(adds) <= 2 * RowText.CONTEXT + 4
    assert sum(adds) <= 3 * RowText.CONTEXT * len(ids)


def test_a_lone_byte_gives_its_replacement_character_as_the_whole_decode_does():
    tok = byte_level_bpe()
    lone = tok.convert_tokens_to_ids("Ł")  # byte 0x9F alone: not a UTF-8 character
    ids = tok("plain ascii text, then")["input_ids"] + [lone] + tok(" more text after it, and more.")["input_ids"]
    whole = tok.decode(ids, skip_special_tokens=True)
    assert "\ufffd" in whole
    pieces, final, n, _ = _stream(tok, ids)
    assert final == whole == "".join(pieces) and n == len(ids)


def _first_stop(tok, ids, stops):
    """The oracle: tokens up to the first prefix whose decode holds a stop string, and the text before it."""
    for k in range(1, len(ids) + 1):
        text = tok.decode(ids[:k], skip_special_tokens=True)
        hits = [i for i in (text.find(s) for s in stops) if i >= 0]
        if hits:
            return k, text[:min(hits)]
    return len(ids), tok.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("stops", [("üß",), ("東京 🎉",), ("🎉🎉 d",), ("ok", "ünï"), ("lazy dog .", "Köln"),
                                   ("мир!",), ("🏳️‍🌈",), ("e\u0301 ß",), ("spaces.",), ("not in the text",),
                                   ("plain words again", "한국")])
def test_stop_strings_spanning_pieces_cut_where_they_start(tok, stops):
    ids = tok(TEXT)["input_ids"]
    want_n, want_text = _first_stop(tok, ids, stops)
    pieces, final, n, _ = _stream(tok, ids, stops)
    assert (n, final) == (want_n, want_text)
    assert "".join(pieces) == final
    if any(s in tok.decode(ids, skip_special_tokens=True) for s in stops):
        assert not any(s in final for s in stops)


def test_a_stop_string_after_the_window_moved_on(tok):
    """Stop strings far into a long output (the window has moved on many times), across a piece boundary."""
    ids = tok(TEXT * 3)["input_ids"]
    whole = tok.decode(ids, skip_special_tokens=True)
    at = whole.index("Здравствуй", len(TEXT) * 2)
    stops = (whole[at - 3:at + 4],)
    want_n, want_text = _first_stop(tok, ids, stops)
    pieces, final, n, adds = _stream(tok, ids, stops)
    assert (n, final) == (want_n, want_text) and "".join(pieces) == final
    assert max(adds) <= 2 * RowText.CONTEXT + 4


class _Framed:
    """A decode that writes ``[`` before the text: no window's text is ever the end of the whole's."""

    def __init__(self, tok):
        self.tok = tok

    def decode(self, ids, skip_special_tokens=True):
        return "[" + self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)


def test_a_window_that_never_matches_leaves_the_whole_decode():
    tok = _Framed(byte_level_bpe())
    ids = tok.tok(TEXT)["input_ids"]
    pieces, final, n, adds = _stream(tok, ids, ("🎉🎉 d",))
    want_n, want_text = _first_stop(tok, ids, ("🎉🎉 d",))
    assert (n, final) == (want_n, want_text) and "".join(pieces) == final and final.startswith("[Grüße")
    assert max(adds) == n  # every add decoded the sequence so far
