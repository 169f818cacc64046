"""The prompt in one run for a decoder built by :mod:`mgx_graph.models`: its prefill step (``prefill.onnx``,
:mod:`mgx_graph.models.prefill_export`) compiled per length bucket over the decode step's KV cache.

:class:`Prefill` belongs to one :class:`~mgx_graph.llm.decoder.Decoder`:

* a run of n new tokens per row from slot ``start`` goes to the program of S tokens, S the smallest
  power of two >= n (at least 2, at most ``chunk``); the program of each bucket is compiled on its
  first use (``dim_params={"sequence": S}``, graphs as the decode step's, captured on the first run:
  ``warmup=0``) and kept;
* every bucket program reads the decode step's weights from its memory (``share_literals``: one copy
  on the device) and has the decoder's cache arrays bound as its state (``bind_state``), so it writes the
  new tokens' keys and values in place at their slots, where the decode step reads them;
* the S - n columns after a row's tokens hold the pad token; they are written to the cache slots after
  the tokens, which the next decode steps overwrite before any query reads them (a query sees only the
  slots up to its own), so S - n must fit before the cache end: :func:`plan_runs` takes a smaller bucket
  when it would not;
* a prompt longer than ``chunk`` runs as chunks of ``chunk`` tokens, each at the slot after the one
  before and attending to the cache written so far; only the last run's logits are read, those of the
  column of its last token (the graph's ``logits_index``), left in ``decoder.last_logits`` ([B, 1, vocab],
  as a decode step leaves them);
* a single token (a one-token prompt, or what a chunked prompt leaves) runs through the decode step.

Several rows run left-padded, as the decode step of several rows: ``tokens`` [B, n] (the same slots in
every row), ``positions`` [B, n] and ``mask`` [B, max_len] (1 on each row's real slots).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import MgxError, ParameterError

#: The largest bucket by default: prompts longer than this run in chunks.
DEFAULT_CHUNK = 1024
SEQUENCE = "sequence"
STEP_INPUTS = ("input_ids", "cache_position", "logits_index", "attention_mask", "position_ids")


def check_chunk(chunk) -> int:
    """``chunk`` as an int; ParameterError unless it is a power of two >= 2."""
    if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 2 or chunk & (chunk - 1):
        raise ParameterError(f"prefill_chunk must be a power of two >= 2, got {chunk!r}")
    return int(chunk)


def plan_runs(n: int, start: int, max_len: int, chunk: int) -> list[tuple[int, int, int]]:
    """The runs that write ``n`` tokens from slot ``start`` of a cache of ``max_len`` slots:
    ``[(first token, tokens, S), ...]``, S the bucket (a power of two in 2..``chunk``) or 0 for a last
    single token, which the decode step runs.  Each run's S slots fit in the cache.
    Raises ParameterError when the tokens do not fit."""
    if n < 0 or start < 0 or start + n > max_len:
        raise ParameterError(f"{n} tokens from slot {start} do not fit the KV cache of {max_len} slots")
    runs, done = [], 0
    while done < n:
        left, room = n - done, max_len - (start + done)
        if left == 1:  # one token: the decode step (captured already) runs it
            runs.append((done, 1, 0))
            break
        S = 2
        while S < min(left, chunk):
            S *= 2
        while S > room:  # room >= left >= 2
            S //= 2
        runs.append((done, min(left, S), S))
        done += min(left, S)
    return runs


class Prefill:
    """The prefill programs of ``decoder`` (see the module docstring).

    Args:
        decoder: the :class:`~mgx_graph.llm.decoder.Decoder` whose cache the runs write; its program
            must be static (its cache bound as state).
        path: the prefill step ONNX file (``ModelInfo.prefill_onnx_path``).
        chunk: the largest bucket (a power of two >= 2); longer prompts run in chunks of it.

    Attributes: ``programs`` (``{S: CompiledProgram}``, those compiled so far), ``runs`` (program runs
    made).  Raises ParameterError for a bad ``chunk``, a missing file or a dynamic decode step.
    """

    def __init__(self, decoder, path, chunk: int = DEFAULT_CHUNK):
        self.chunk = check_chunk(chunk)
        self.path = Path(path)
        if not self.path.is_file():
            raise ParameterError(f"prefill step {self.path}: no such file")
        if getattr(decoder, "_serial", None) is None or getattr(decoder.program, "dispatcher", None) is not None:
            raise ParameterError("a prefill step needs a static decode step with its cache bound as state")
        self.decoder = decoder
        self.programs: dict[int, Any] = {}
        self.runs = 0
        self._inputs: dict[int, dict] = {}
        self._serials: dict[int, int] = {}
        self._logits: dict[int, int] = {}

    def program(self, S: int):
        """The program of bucket ``S`` (compiled on its first use)."""
        if S not in self.programs:
            self.programs[S] = self._compile(S)
        return self.programs[S]

    def _compile(self, S: int):
        from ..compiler import compile as compile_model

        dec = self.decoder
        opts = dec.program.options
        prog = compile_model(str(self.path), target=dec.program.target, hip_graph=opts.get("hip_graph"),
                             fp16=bool(opts.get("fp16")), device_id=opts.get("device_id"),
                             dim_params={SEQUENCE: S}, warmup=0, share_literals=dec.program)
        shapes = prog.get_parameter_shapes()
        state = set(dec._state)
        missing = sorted(state - set(prog.alias.values()))
        extra = sorted(set(shapes) - state - set(STEP_INPUTS))
        if missing or extra:
            prog.release()
            raise MgxError(f"prefill step {self.path}: cache inputs {missing} not bound in place, or inputs {extra} "
                           f"this runner does not feed")
        self._logits[S] = prog.get_output_names().index("logits")
        with dec.ctx.on_queue(dec.queue):
            own = {n: dec.xp.zeros(shapes[n].lens, dtype=shapes[n].np_dtype) for n in shapes
                   if n in STEP_INPUTS and n != "attention_mask"}
        if "attention_mask" in shapes:
            own["attention_mask"] = dec.params["attention_mask"]  # the decode step's: the same [B, max_len]
        self._inputs[S] = own
        return prog

    def run(self, tokens: np.ndarray, start: int, positions: np.ndarray | None = None,
            mask: np.ndarray | None = None) -> None:
        """Write ``tokens`` (int [B, n]) into the cache from slot ``start``; the logits of the last column
        are left in ``decoder.last_logits`` and ``decoder.position`` becomes ``start + n`` (see the module
        docstring for ``positions`` and ``mask``, which a decoder of several rows needs).  Queued on the
        decoder's queue; nothing is read back."""
        dec = self.decoder
        tokens = np.asarray(tokens, np.int64).reshape(dec.batch, -1)
        n = tokens.shape[1]
        if dec.rows_interface and (positions is None or mask is None):
            raise ParameterError("a decode step of several rows needs positions and mask for a prefill")
        dec._end_chain()
        dec._slot_written = None
        for first, count, S in plan_runs(n, start, dec.max_len, self.chunk):
            cols = slice(first, first + count)
            if S == 0:
                dec.position = start + first
                row_mask = None if mask is None else np.array(mask, np.int64, copy=True)
                if row_mask is not None:
                    row_mask[:, start + first] = 1
                dec.feed(tokens[:, first], None if positions is None else positions[:, first], row_mask)
                continue
            self._run(S, start + first, tokens[:, cols], None if positions is None else positions[:, cols], mask)
        dec.position = start + n

    def _run(self, S: int, slot: int, tokens: np.ndarray, positions, mask) -> None:
        dec, q = self.decoder, self.decoder.queue
        prog, n = self.program(S), tokens.shape[1]
        ins = self._inputs[S]
        ids = np.empty((dec.batch, S), np.int64)
        ids[:, :n], ids[:, n:] = tokens, tokens[:, -1:]  # the pad columns repeat each row's last token
        with dec.ctx.on_queue(q):
            dec.ctx.copy_from_host(ins["input_ids"], ids, q)
            ins["cache_position"].fill(slot)
            ins["logits_index"].fill(n - 1)
            if "position_ids" in ins:
                pos = np.empty((dec.batch, S), np.int64)
                pos[:, :n] = positions
                pos[:, n:] = positions[:, -1:] + np.arange(1, S - n + 1)  # the pad columns' own slots
                dec.ctx.copy_from_host(ins["position_ids"], pos, q)
                dec.ctx.copy_from_host(ins["attention_mask"], np.ascontiguousarray(mask, np.int64), q)
            with prog.executor.lock:
                if self._serials.get(S) != prog.state_serial:  # bound here first, or another binding since
                    self._serials[S] = prog.bind_state(dec._state)
                h0 = time.perf_counter()
                outs = prog.run_async(ins, q)
                dec.last_host_s = time.perf_counter() - h0
        dec.last_logits = outs[self._logits[S]]
        self.runs += 1

    def stats(self) -> dict:
        """``{S: program stats}`` of the buckets compiled so far."""
        return {S: p.stats() for S, p in sorted(self.programs.items())}

    def release(self) -> None:
        """Release the bucket programs (their memory and graphs)."""
        for p in self.programs.values():
            p.release()
        self.programs.clear()
