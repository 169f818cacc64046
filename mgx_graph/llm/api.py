"""Text in, text out: :class:`LLM` over every decoder layout :func:`~mgx_graph.llm.open_decoder.open_decoder` opens.

::

    from mgx_graph.llm import LLM

    llm = LLM("smollm2-genai", target="ref", max_length=128)
    out = llm.generate([{"role": "user", "content": "What is 2 + 2?"}], max_new_tokens=16)
    print(out.text, out.finish_reason, out.token_ids)
    for piece in llm.stream("The capital of France is", max_new_tokens=8):
        print(piece, end="")

A prompt is plain text (tokenized as it is, as a completion prompt), a list of token ids, or chat
messages (a list of ``{"role", "content"}`` dicts: system / user / assistant, any number of turns),
which go through the tokenizer's own chat template with ``add_generation_prompt=True``. Options keep
transformers' names (``max_new_tokens``, ``do_sample``, ``temperature``, ``top_p``, ``top_k``,
``min_p``, ``repetition_penalty``, ``seed``) plus ``stop`` strings (cut off, as the OpenAI API).
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ParameterError

ROLES = ("system", "user", "assistant")
#: generate()'s finish reasons as the OpenAI API names them
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cache_full": "length"}


@dataclass
class LLMResult:
    """One generated sequence.

    Attributes: ``text`` (cut before a stop string), ``token_ids`` (generated; an end-of-sequence id that
    ended it included), ``prompt_token_ids``, ``finish_reason`` ("stop": an end-of-sequence token or a
    stop string; "length": ``max_new_tokens`` or the cache is full), ``stop_reason`` (the detail: "eos",
    "stop", "length" or "cache_full"), ``timings`` (``prefill_s``, ``decode_s``, ``ms_per_token``,
    ``tokens_per_s``; a batch's rows share them).
    """

    text: str
    token_ids: list
    prompt_token_ids: list
    finish_reason: str
    stop_reason: str
    timings: dict = field(default_factory=dict)


class _Cancelled(Exception):
    """Raised inside a streamed generation whose consumer stopped reading."""


class TextStream:
    """The iterator :meth:`LLM.stream` returns: text pieces as they settle; :attr:`result` (an
    :class:`LLMResult`) once it is exhausted. Closing it early (``close()``, ``break`` out of a for loop
    and dropping it) stops the generation at its next token."""

    def __init__(self, llm: "LLM", ids: list, options: dict):
        self.result: LLMResult | None = None
        self._q: queue.Queue = queue.Queue()
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._work, args=(llm, ids, options), daemon=True,
                                        name="mgx-llm-stream")
        self._gen = self._pieces()
        self._thread.start()

    def _work(self, llm, ids, options) -> None:
        def piece(text: str) -> None:
            if self._cancel.is_set():
                raise _Cancelled()
            self._q.put(("text", text))

        try:
            with llm._lock:
                res = llm._generate_ids([ids], options, streamer=piece)[0]
            self._q.put(("done", res))
        except _Cancelled:
            self._q.put(("done", None))
        except BaseException as e:  # handed to the consumer's thread
            self._q.put(("error", e))

    def _pieces(self):
        try:
            while True:
                kind, value = self._q.get()
                if kind == "text":
                    yield value
                elif kind == "error":
                    raise value
                else:
                    self.result = value
                    return
        finally:
            self._cancel.set()
            self._thread.join()

    def __iter__(self) -> "TextStream":
        return self

    def __next__(self) -> str:
        return next(self._gen)

    def close(self) -> None:
        self._gen.close()

    def __del__(self):
        self._cancel.set()  # dropped unread: the generation stops at its next piece


class LLM:
    """A decoder with its tokenizer: text (or chat messages) in, text out.

    Args:
        model: an onnxruntime-genai folder, an optimum-style folder or a registry name
            (:func:`mgx_graph.llm.open_decoder.open_decoder`).
        target: "auto", "gpu" or "ref".
        max_length: KV cache rows per sequence, prompt included (folders; default 256 for an
            onnxruntime-genai folder, 64 for an optimum-style one).
        batch: rows decoded together; a longer list of prompts runs ``batch`` at a time.
        compile_options: ``hip_graph``, ``fp16`` (as :func:`mgx_graph.compile`).

    Attributes: ``runner``, ``tokenizer`` (a transformers tokenizer, or None for a model without one:
    prompts are then token ids), ``eos_token_ids``, ``name``. Raises ParameterError for a bad model or
    option, CompileError from the compiler.
    """

    def __init__(self, model, target: str = "auto", max_length: int | None = None, batch: int = 1,
                 **compile_options):
        from .folder_config import load_tokenizer
        from .open_decoder import open_decoder

        unknown = sorted(set(compile_options) - {"hip_graph", "fp16"})
        if unknown:
            raise ParameterError(f"unknown option(s) {unknown}; LLM takes target, max_length, batch, hip_graph, fp16")
        self.runner, tok_dir, eos, info = open_decoder(model, batch=batch, max_length=max_length, target=target,
                                                       **compile_options)
        self.eos_token_ids = [int(e) for e in eos]
        self.tokenizer: Any = load_tokenizer(tok_dir) if tok_dir else None
        self.name = info.name if info is not None and getattr(info, "name", None) else Path(str(model)).name
        self._lock = threading.Lock()

    # -- prompts ------------------------------------------------------------------------------------
    def encode(self, prompt) -> list[int]:
        """Token ids of one prompt: text, token ids, or chat messages (through the chat template)."""
        if isinstance(prompt, str):
            self._need_tokenizer("a text prompt")
            return [int(t) for t in self.tokenizer(prompt)["input_ids"]]
        if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) for m in prompt):
            return self.chat_ids(prompt)
        if isinstance(prompt, (list, tuple)) and prompt and all(
                isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return [int(t) for t in prompt]
        raise ParameterError(f"a prompt must be a str, a list of token ids or a list of chat messages "
                             f"({{'role', 'content'}} dicts), got {prompt!r:.80}")

    def chat_ids(self, messages) -> list[int]:
        """Token ids of chat ``messages`` through the tokenizer's chat template, with the assistant's turn
        opened (``add_generation_prompt=True``). ParameterError for a bad message or no template."""
        self._need_tokenizer("chat messages")
        for k, m in enumerate(messages):
            if not isinstance(m, dict) or set(m) - {"role", "content", "name"} or m.get("role") not in ROLES \
                    or not isinstance(m.get("content"), str):
                raise ParameterError(f"message {k} must be {{'role': one of {list(ROLES)}, 'content': str}}, "
                                     f"got {m!r:.120}")
        if not getattr(self.tokenizer, "chat_template", None):
            raise ParameterError(f"the tokenizer of {self.name} has no chat template; give a text prompt")
        out = self.tokenizer.apply_chat_template([{"role": m["role"], "content": m["content"]} for m in messages],
                                                 add_generation_prompt=True, tokenize=True)
        if hasattr(out, "keys") and "input_ids" in out:
            out = out["input_ids"]
        return [int(t) for t in out]

    def _need_tokenizer(self, what: str) -> None:
        if self.tokenizer is None:
            raise ParameterError(f"{self.name} has no tokenizer: {what} cannot be encoded; give token ids")

    def _prompts(self, prompts) -> tuple[list[list[int]], bool]:
        """``(token ids per prompt, single)`` of one prompt or a list of them."""
        one = isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and prompts and (
            all(isinstance(m, dict) for m in prompts) or all(isinstance(t, int) for t in prompts)))
        if one:
            return [self.encode(prompts)], True
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise ParameterError(f"prompts must be a prompt or a non-empty list of prompts, got {prompts!r:.80}")
        return [self.encode(p) for p in prompts], False

    # -- generation ---------------------------------------------------------------------------------
    def generate(self, prompts, max_new_tokens: int = 32, **options):
        """Generate from one prompt or a list of them (see the module for prompts and options).

        Returns an :class:`LLMResult` for one prompt, a list of them (in order) for a list.
        Raises ParameterError for a bad prompt or option."""
        ids, single = self._prompts(prompts)
        options = dict(options, max_new_tokens=max_new_tokens)
        out = []
        with self._lock:
            for k in range(0, len(ids), self.runner.batch):
                out += self._generate_ids(ids[k:k + self.runner.batch], options)
        return out[0] if single else out

    def stream(self, prompt, max_new_tokens: int = 32, **options) -> TextStream:
        """The text of one prompt's generation as an iterator of pieces (they join to the result's
        text; :attr:`TextStream.result` holds the :class:`LLMResult` once it is exhausted)."""
        ids, single = self._prompts(prompt)
        if not single:
            raise ParameterError("stream takes one prompt; call it once per prompt")
        self._need_tokenizer("a stream of text")
        options = dict(options, max_new_tokens=max_new_tokens)
        self._check_options(options)
        return TextStream(self, ids[0], options)

    @staticmethod
    def _check_options(options: dict) -> None:
        allowed = {"max_new_tokens", "do_sample", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                   "seed", "stop", "eos_token_id", "pad_token_id", "prefill"}
        unknown = sorted(set(options) - allowed)
        if unknown:
            raise ParameterError(f"unknown generation option(s) {unknown}; known: {sorted(allowed)}")

    def _generate_ids(self, ids: list, options: dict, streamer=None) -> list[LLMResult]:
        from .generation import generate

        self._check_options(options)
        opts = dict(options)
        opts.setdefault("eos_token_id", self.eos_token_ids)
        if streamer is not None:  # one prompt (stream)
            opts["streamer"] = streamer
        res = generate(self.runner, ids if len(ids) > 1 else ids[0], tokenizer=self.tokenizer, **opts)
        res = res if isinstance(res, list) else [res]
        return [LLMResult(text=r.text, token_ids=list(r.tokens), prompt_token_ids=list(p),
                          finish_reason=FINISH.get(r.finish_reason, r.finish_reason), stop_reason=r.finish_reason,
                          timings={"prefill_s": r.prefill_s, "decode_s": r.decode_s, "ms_per_token": r.ms_per_token,
                                   "tokens_per_s": r.tokens_per_s})
                for r, p in zip(res, ids)]

    def close(self) -> None:
        """Release the runner's programs."""
        (self.runner.release if hasattr(self.runner, "release") else self.runner.program.release)()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
