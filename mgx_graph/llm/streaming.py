"""Text of generated tokens as it grows: incremental detokenization, stop strings, streaming.

:class:`RowText` follows one generated sequence. After each token it decodes only a window of the
last tokens (``tokenizer.decode(ids, skip_special_tokens=True)``, transformers' tokenizer API), so a
step costs the same whatever the length of the output, and hands on only the new text that can no
longer change. This is the prefix-window approach of vLLM's incremental detokenizer: the text is
``head + decode(tokens[start:])``, where ``head`` is fixed and the window ``tokens[start:]`` begins
with a few tokens already in the text (context: a SentencePiece tokenizer drops the leading space of
the first token it decodes, a clean-up rule joins a token to the one before). Every few tokens the
window moves on to the last ``CONTEXT`` tokens (or a few more), where their decoded text is exactly
the end of the text so far (a window that starts inside a UTF-8 character split over tokens decodes
to U+FFFD there, so it never starts there); where that does not hold, the window grows and the move
is tried again a few tokens later. At the end the whole sequence is decoded once: the final text is
that, given that it begins with all that was handed on.

What is held back until a later token or the end settles it:

* trailing U+FFFD characters: a multi-byte UTF-8 character whose bytes are split over tokens
  decodes to U+FFFD until its last byte arrives, so a partial character is never handed on;
* trailing whitespace: the next token may change it (tokenizers' ``clean_up_tokenization_spaces``
  drops a space before punctuation, "a ," -> "a,"), so text is handed on up to its last
  non-space character;
* a suffix that could be the start of a stop string.

What is handed on is always a prefix of the final text, and at the end the rest follows, so the
pieces join to exactly the returned text (for tokenizers whose decoded text only changes at its
end as tokens are added, as byte-level BPE and SentencePiece tokenizers do).

Stop strings are searched in the decoded text. The returned text ends right before the first
occurrence of any stop string: the stop string is not part of it. This is the rule of the OpenAI
API's ``stop`` and the default of vLLM and OpenVINO GenAI (``include_stop_str_in_output=False``);
transformers' ``StopStringCriteria`` stops at the same token but leaves the stop string in the
output, and onnxruntime-genai has no stop strings. The generated token ids are kept up to and
including the token that completed the stop string.
"""
from __future__ import annotations

import sys
from typing import Callable, Sequence

from ..errors import ParameterError


def check_stop_strings(stop) -> tuple[str, ...]:
    """``stop`` (None, one string, or a list / tuple of strings) as a tuple of non-empty strings;
    ParameterError naming ``stop`` for anything else or an empty or non-string entry."""
    if stop is None:
        return ()
    if not isinstance(stop, (str, list, tuple)):
        raise ParameterError(f"stop must be a non-empty str or a list of them, got {type(stop).__name__} {stop!r}")
    items = [stop] if isinstance(stop, str) else list(stop)
    for s in items:
        if not isinstance(s, str) or not s:
            raise ParameterError(f"stop must be a non-empty str or a list of them; an entry is {s!r}")
    return tuple(items)


class RowText:
    """The decoded text of one generated sequence, its stop-string check and its stream.

    ``tokenizer`` has ``decode(ids, skip_special_tokens=True) -> str``; ``stop`` is a tuple of
    stop strings; ``streamer`` is called with each new piece of settled text (str), or is None.
    """

    #: Tokens of the text so far that begin the decoded window (see the module docstring).
    CONTEXT = 4

    def __init__(self, tokenizer, stop: Sequence[str] = (), streamer: Callable[[str], None] | None = None):
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.streamer = streamer
        self.tokens: list[int] = []
        self.text = ""            # the decoded text of ``tokens`` (cut at a stop string once stopped)
        self.stopped = False      # a stop string was found
        self.sent = 0             # characters of ``text`` handed to the streamer
        self._start = 0           # the window: tokens[_start:], decoded after ``_head``
        self._head = ""
        self._next_move = 2 * self.CONTEXT  # tokens at which the window is next moved on

    def _decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, token: int) -> bool:
        """Append ``token``; returns True when the text now holds a stop string (the text is then cut
        right before it and streamed up to there)."""
        self.tokens.append(int(token))
        self.text = self._head + self._decode(self.tokens[self._start:])
        cut = self._find_stop()
        if cut is not None:
            self.stopped = True
            self.text = self.text[:cut]
            self._send(len(self.text))
            return True
        self._send(self._settled())
        if len(self.tokens) >= self._next_move:
            self._move_window()
        return False

    def _move_window(self) -> None:
        """Start the window at the last :attr:`CONTEXT` tokens (or up to 3 more: a character's bytes) where
        their text is exactly the end of ``text`` (a window that starts inside a UTF-8 character decodes
        to U+FFFD there, which the text does not have); else leave it, to grow and be tried again
        :attr:`CONTEXT` tokens later. Not while the text ends in U+FFFD (tried again at the next token):
        a character still incomplete there would let a window that starts inside it match."""
        n = len(self.tokens)
        if self.text.endswith("\ufffd"):
            self._next_move = n + 1
            return
        for start in range(n - self.CONTEXT, n - self.CONTEXT - 4, -1):
            tail = self._decode(self.tokens[start:])
            if self.text.endswith(tail):
                self._start, self._head = start, self.text[:len(self.text) - len(tail)]
                self._next_move = start + 2 * self.CONTEXT
                return
        self._next_move = n + self.CONTEXT

    def _find_stop(self) -> int | None:
        """Index of the first stop string in ``text``, or None. Only the text from just before what was
        streamed is searched: the streamed part is settled and was searched when it was decoded."""
        if not self.stop:
            return None
        longest = max(len(s) for s in self.stop)
        start = max(0, self.sent - longest + 1)
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        return min(hits) if hits else None

    def _settled(self) -> int:
        """How much of ``text`` no later token can change (the rules of the module docstring)."""
        text = self.text
        end = len(text)
        while end and (text[end - 1] == "\ufffd" or text[end - 1].isspace()):
            end -= 1
        held = 0  # the longest end of text[:end] that is a proper start of a stop string
        for s in self.stop:
            for k in range(min(len(s) - 1, end), held, -1):
                if text.startswith(s[:k], end - k):
                    held = k
                    break
        return max(end - held, self.sent)

    def _send(self, upto: int) -> None:
        if self.streamer is not None and upto > self.sent:
            self.streamer(self.text[self.sent:upto])
        self.sent = max(self.sent, upto)

    def finish(self) -> str:
        """Hand on the rest of the text (the end settles everything); returns the final text: the whole
        sequence decoded at once where it begins with what was handed on (else the windows' text)."""
        if not self.stopped and self._start:
            whole = self._decode(self.tokens)
            if whole != self.text and whole.startswith(self.text[:self.sent]):
                self.text = whole
        self._send(len(self.text))
        end = getattr(self.streamer, "end", None)
        if callable(end):
            end()
        return self.text


class TextStreamer:
    """A streamer that writes each piece of text to ``file`` (default ``sys.stdout``) and flushes;
    :meth:`end` writes ``end_text`` (default a newline)."""

    def __init__(self, file=None, end_text: str = "\n"):
        if file is not None and not callable(getattr(file, "write", None)):
            raise ParameterError(f"file must have write(str) (a text file), got {file!r:.80}")
        if not isinstance(end_text, str):
            raise ParameterError(f"end_text must be a str, got {end_text!r:.80}")
        self.file = file
        self.end_text = end_text

    def _out(self):
        return self.file if self.file is not None else sys.stdout

    def __call__(self, text: str) -> None:
        out = self._out()
        out.write(text)
        out.flush()

    def end(self) -> None:
        if self.end_text:
            self(self.end_text)
