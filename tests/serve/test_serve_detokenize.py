"""``mgx-graph serve``'s text of a completion, streamed and not, when the tokens split UTF-8 characters: the
engine and the HTTP app as they run, over a runner that produces a fixed script of tokens (the ids of a
multilingual text under a byte-level BPE and a Llama-style byte-fallback tokenizer, trained in the test), so
that every piece boundary of the text is known. The oracle is the tokenizer's own decode of the script
(transformers) and ``str.find`` for the stop strings; the streamed chunks must join to the non-streamed text."""
from __future__ import annotations

import threading
import time
import types

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("tokenizers")
pytest.importorskip("transformers")

from mgx_graph.llm.runner import GenaiRunner  # noqa: E402
from text_tokenizers import TEXT, byte_level_bpe, llama_bpe  # noqa: E402

PROMPT = [5, 6, 7]
ROWS = 4


class ScriptedRunner(GenaiRunner):
    """A runner whose every row, after a prompt of ``len(PROMPT)`` tokens, produces ``script`` token by
    token (no model: the engine's scheduling, text and stop strings are what runs)."""

    def __init__(self, script: list, vocab_size: int):
        self.script = list(script)
        self.batch, self.max_len, self.vocab_size = ROWS, len(PROMPT) + len(script) + 8, vocab_size

    def run(self, S, tokens, lengths):
        return np.asarray(lengths, np.int64).copy()  # a row's next token follows from its length

    def pick(self, logits, rows_at, want_logits):
        at = np.clip(logits - len(PROMPT), 0, len(self.script) - 1)
        ids = np.asarray([self.script[i] for i in at], np.int64)
        if not want_logits:
            return ids, None
        rows = np.full((self.batch, self.vocab_size), -30.0, np.float32)
        rows[np.arange(self.batch), ids] = 30.0
        return ids, rows


@pytest.fixture(scope="module", params=["byte_level", "llama"])
def served(request):
    """``(base url, tokenizer, script)``: a server over a :class:`ScriptedRunner`, in a thread."""
    from mgx_graph.serve.app import Service
    from mgx_graph.serve.scheduler import Engine
    from mgx_graph.serve.server import make_server

    tok = byte_level_bpe() if request.param == "byte_level" else llama_bpe()
    script = tok(TEXT)["input_ids"]
    end = tok.convert_tokens_to_ids("<|end|>")
    assert end not in script
    engine = Engine(ScriptedRunner(script, len(tok)), tok, [end], max_queue=32)
    llm = types.SimpleNamespace(tokenizer=tok, encode=lambda p: [int(t) for t in p],
                                chat_ids=lambda m: list(PROMPT))
    service = Service(llm, engine, "scripted", max_tokens=len(script), timeout=None)
    port = free_port()
    srv = make_server(service, "127.0.0.1", port, grace=5, log_level="warning")
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    deadline = time.monotonic() + 60
    while not srv.started:
        assert th.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", tok, script
    srv.should_exit = True
    th.join(60)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _complete(url: str, stream: bool, **body):
    """``(text, finish_reason, completion tokens, chunks with text)`` of one completion of :data:`PROMPT`."""
    req = {"model": "scripted", "prompt": PROMPT, "temperature": 0, "stream": stream, **body}
    if not stream:
        r = httpx.post(url + "/v1/completions", json=req, timeout=120, trust_env=False)
        assert r.status_code == 200, r.text
        out = r.json()
        return out["choices"][0]["text"], out["choices"][0]["finish_reason"], out["usage"]["completion_tokens"], 0
    import json

    req["stream_options"] = {"include_usage": True}
    text, finish, tokens, chunks = "", None, None, 0
    with httpx.stream("POST", url + "/v1/completions", json=req, timeout=120, trust_env=False) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            tokens = obj["usage"]["completion_tokens"] if obj.get("usage") else tokens
            for c in obj["choices"]:
                assert "\ufffd" not in c["text"]
                text += c["text"]
                chunks += bool(c["text"])
                finish = c["finish_reason"] or finish
    return text, finish, tokens, chunks


def test_streamed_text_is_the_text_and_the_decode_of_the_tokens(served):
    url, tok, script = served
    n = len(script)
    whole = tok.decode(script, skip_special_tokens=True)
    assert sum("\ufffd" in tok.decode(script[:k]) for k in range(1, n)) > 10  # pieces split characters
    text, finish, tokens, _ = _complete(url, False, max_tokens=n)
    assert (text, finish, tokens) == (whole, "length", n)
    streamed, s_finish, s_tokens, chunks = _complete(url, True, max_tokens=n)
    assert (streamed, s_finish, s_tokens) == (whole, "length", n) and chunks > 20


@pytest.mark.parametrize("stops", [["üß"], ["東京 🎉"], ["🎉🎉 d"], ["мир!", "한국"], ["🏳️‍🌈"], ["not in it"]])
def test_stop_strings_across_pieces_streamed_and_not(served, stops):
    url, tok, script = served
    n = len(script)
    whole = tok.decode(script, skip_special_tokens=True)
    hits = [i for i in (whole.find(s) for s in stops) if i >= 0]
    want = whole[:min(hits)] if hits else whole
    # the oracle's token count: the first prefix of the script whose decode holds a stop string
    used = next((k for k in range(1, n + 1) if any(s in tok.decode(script[:k], skip_special_tokens=True)
                                                   for s in stops)), n)
    for stream in (False, True):
        text, finish, tokens, _ = _complete(url, stream, max_tokens=n, stop=stops)
        assert (text, finish, tokens) == (want, "stop" if hits else "length", used), stream


def test_concurrent_streams_each_get_the_whole_text(served):
    """Rows that join while others run, streamed at once: each joins its chunks to the same text."""
    url, tok, script = served
    whole = tok.decode(script, skip_special_tokens=True)
    out: list = [None] * (2 * ROWS)

    def one(i):
        out[i] = _complete(url, True, max_tokens=len(script) - i)[0]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(out))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i, text in enumerate(out):
        assert text == tok.decode(script[:len(script) - i], skip_special_tokens=True)
    assert out[0] == whole
