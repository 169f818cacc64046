"""Decoders exported with a dynamic past length (optimum's layout), run as a fixed sliding window.

An optimum-style folder (``model.onnx`` + ``config.json``, tokenizer files optional; what
:mod:`mgx_graph.models.optimum` builds) has ``input_ids`` [B, S], ``attention_mask`` [B, P + S],
``position_ids`` [B, S], ``past_key_values.{i}.key|value`` [B, kv, P, hd] -> ``logits`` [B, S, vocab],
``present.{i}.key|value`` [B, kv, P + S, hd], P symbolic. :class:`OptimumRunner` fixes P at the
window length M (``max_length``), so every run has the same shapes and one decode program is
captured once and replayed:

* the past buffers [B, kv, M, hd] hold each row's tokens right-aligned: a row with n tokens in the
  cache has them in the last n slots; the attention mask [B, M + S] is 1 on a row's last n + S
  columns (its cached tokens and the new ones) and 0 on the slots before, which the model's masked
  softmax gives weight exactly 0;
* ``position_ids`` are each token's index in its row (0 for the first prompt token), so the rotary
  embeddings do not depend on where the row sits in the window;
* after each run the last M rows of every present output, ``present[:, :, S:]``, are copied back
  into the past buffers (one device copy per cache tensor on the queue): the window slides by S;
* the prompts run as one prefill of S = the smallest power of two holding the longest (capped at M),
  left-padded (pad columns masked), one program per bucket.

This gives transformers' greedy tokens (a masked slot adds nothing to a softmax row) with fixed
shapes; the cost is the window copy per step. The alternative, one specialization per past length,
would compile a program per generated token and capture none. A row stops with "cache_full" at M
tokens, as :class:`mgx_graph.llm.runner.GenaiRunner`.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ParameterError, ParseError
from .folder_config import Fields, Ids, Int, resolve_in
from .runner import GenaiRunner, check_runner_options

CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
ONNX = "model.onnx"
INPUTS = ("input_ids", "attention_mask", "position_ids")


def is_optimum_folder(path) -> bool:
    """True when ``path`` is a folder with ``config.json`` and ``model.onnx``."""
    p = Path(path)
    return p.is_dir() and (p / CONFIG).is_file() and (p / ONNX).is_file()


def read_folder(folder) -> dict:
    """The decoder's sizes: ``num_layers``, ``num_kv_heads``, ``head_size`` (from the graph's past
    inputs, checked against config.json's head counts when it has them), ``vocab_size``,
    ``context_length`` (max_position_embeddings), ``eos_token_ids``, ``pad_token_id`` (from config.json;
    eos and pad from generation_config.json when it names them, as transformers' ``generate``).
    Every field is checked (:mod:`mgx_graph.llm.folder_config`): ParameterError naming the file and the field."""
    folder = Path(folder)
    if not is_optimum_folder(folder):
        raise ParameterError(f"{folder} is not an optimum-style folder: needs {CONFIG} and {ONNX}")
    cfg = Fields.read(folder / CONFIG, "an optimum-style model config")
    vocab = cfg.get("vocab_size", Int(1))
    eos = cfg.get("eos_token_id", Ids(vocab), [])
    pad = cfg.get("pad_token_id", Int(-1, vocab - 1), None)
    cfg.get("bos_token_id", Int(0, vocab - 1), None)
    context = cfg.get("max_position_embeddings", Int(1), 1 << 30)
    resolve_in(folder / ONNX, folder)
    dims = _past_dims(folder / ONNX)
    L = sum(1 for n in dims if n.startswith("past_key_values.") and n.endswith(".key"))
    want = set(INPUTS) | {f"past_key_values.{i}.{t}" for i in range(L) for t in ("key", "value")}
    if L == 0 or set(dims) != want:
        raise ParameterError(f"{folder / ONNX}: inputs {sorted(dims)} are not the dynamic-past decoder's "
                             f"(input_ids, attention_mask, position_ids, past_key_values.N.key / value)")
    past = dims["past_key_values.0.key"]
    if len(past) != 4 or not all(isinstance(d, int) and d > 0 for d in (past[1], past[3])):
        raise ParameterError(f"{folder / ONNX}: input past_key_values.0.key has dims {past}; expected [batch, "
                             f"kv heads, past length, head size] with fixed head counts and sizes")
    kv, hd = past[1], past[3]
    for key, have in (("num_hidden_layers", L), ("num_key_value_heads", kv), ("head_dim", hd)):
        got = cfg.get(key, Int(1), None)
        if got is not None and got != have:
            raise cfg.fail(key, f"expected {have} (as {ONNX} has), got {got}")
    heads = cfg.get("num_attention_heads", Int(1), None)
    if heads is not None and heads % kv:
        raise cfg.fail("num_attention_heads", f"expected a multiple of the {kv} key / value heads, got {heads}")
    if (folder / GENERATION_CONFIG).exists():
        gen = Fields.read(folder / GENERATION_CONFIG, "generation defaults")
        eos = gen.get("eos_token_id", Ids(vocab), eos)
        pad = gen.get("pad_token_id", Int(-1, vocab - 1), pad)
        gen.get("bos_token_id", Int(0, vocab - 1), None)
    return {"num_layers": L, "num_kv_heads": kv, "head_size": hd, "vocab_size": vocab,
            "context_length": context, "eos_token_ids": eos,
            "pad_token_id": pad if pad is not None and pad >= 0 else (eos[0] if eos else 0)}


def _past_dims(path: Path) -> dict:
    """``{input name: dims}`` of the ONNX graph in ``path`` (an int per fixed dim, else its name)."""
    import onnx

    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception as e:  # protobuf DecodeError, OSError
        raise ParseError(f"{path}: not a valid ONNX protobuf ({type(e).__name__}: {e})") from None
    return {i.name: [d.dim_value if d.HasField("dim_value") else d.dim_param for d in i.type.tensor_type.shape.dim]
            for i in graph.input}


class OptimumRunner(GenaiRunner):
    """Runs an optimum-style folder over a fixed window of ``max_length`` cache slots (see the module).

    Args: ``folder``, ``batch`` (rows B), ``max_length`` (window M: tokens per row, at most the
    context length), ``target``, ``hip_graph``, ``fp16`` (as :func:`mgx_graph.compile`).
    Attributes and generation as :class:`~mgx_graph.llm.runner.GenaiRunner`; ``info`` holds the
    sizes of :func:`read_folder`. Raises ParameterError, CompileError.
    """


    def __init__(self, folder, *, batch: int = 1, max_length: int = 64, target: str = "auto",
                 hip_graph: bool | None = None, fp16: bool = False):
        self.folder = Path(folder)
        self.info = info = read_folder(folder)
        check_runner_options(batch, max_length, info["context_length"], target, hip_graph, fp16)
        self.batch, self.max_len, self.vocab_size = batch, max_length, info["vocab_size"]
        self.cache = [f"past_key_values.{i}.{t}" for i in range(info["num_layers"]) for t in ("key", "value")]
        self.compile_kw: dict[str, Any] = dict(target=target, hip_graph=hip_graph, fp16=fp16)
        self.host_op_parts = ((3, "copies"), (len(self.cache), "window copies"))
        self.programs: dict = {}
        self.program = self._program(1)
        ctx = self.program.context
        self.ctx, self.xp, self.queue = ctx, ctx.xp, self.program.queue
        shapes = self.program.get_parameter_shapes()  # float16 cache buffers under fp16
        with ctx.on_queue(self.queue):
            self.state = {n: ctx.xp.zeros(shapes[n].lens, dtype=shapes[n].np_dtype) for n in self.cache}
            self.feeds: dict = {}
        ctx.synchronize(self.queue)
        self.last_logits, self.last_host_s = None, 0.0

    def _program(self, S: int):
        """The program for ``S`` new tokens per row over the M-slot window (compiled on first use)."""
        if S not in self.programs:
            from ..compiler import compile as compile_model

            B, M, i = self.batch, self.max_len, self.info
            dims = {"input_ids": [B, S], "attention_mask": [B, M + S], "position_ids": [B, S]}
            dims.update({n: [B, i["num_kv_heads"], M, i["head_size"]] for n in self.cache})
            prog = compile_model(str(self.folder / ONNX), input_dims=dims, alias=None,
                                 warmup=2 if S == 1 else 0, **self.compile_kw)
            names = prog.get_output_names()
            want = ["logits", *[n.replace("past_key_values.", "present.") for n in self.cache]]
            missing = [n for n in want if n not in names]
            if missing:
                prog.release()
                raise ParameterError(f"{self.folder / ONNX}: an optimum decoder must output {missing[0]!r} "
                                     f"(logits and a present key / value per past input); its outputs are "
                                     f"{names[:8]}{' ...' if len(names) > 8 else ''}")
            self.logits_index = names.index("logits")
            self.present_index = [names.index(n) for n in want[1:]]
            shapes, grown = prog.get_output_shapes(), [B, i["num_kv_heads"], M + S, i["head_size"]]
            for n, k in zip(want[1:], self.present_index):
                if list(shapes[k].lens) != grown:  # the window slides by dropping the first S slots of each
                    prog.release()
                    raise ParameterError(f"{self.folder / ONNX}: output {n!r} is {list(shapes[k].lens)} for {S} new "
                                         f"token(s) over a past of {M}; an optimum decoder's present is its past "
                                         f"with the new tokens appended: {grown}")
            self.programs[S] = prog
        return self.programs[S]

    @staticmethod
    def prefill_rows(prompts, S: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens int64 [B, S], column of each row's last prompt token [B])``: left-padded with ``pad``."""
        tokens = np.full((len(prompts), S), pad, np.int64)
        for r, p in enumerate(prompts):
            tokens[r, S - len(p):] = p
        return tokens, np.full(len(prompts), S - 1, np.int64)

    def run(self, S: int, tokens: np.ndarray, lengths: np.ndarray):
        """Run ``S`` tokens per row (``tokens`` int [B, S], right-aligned); ``lengths`` int [B]: each
        row's tokens after this run. Slides the window by S. Returns the logits device array [B, S, vocab]."""
        prog, B, M = self._program(S), self.batch, self.max_len
        lengths = np.asarray(lengths, np.int64)
        width = M + S
        mask = (np.arange(width)[None, :] >= width - lengths[:, None]).astype(np.int64)
        pos = np.maximum(lengths[:, None] - S + np.arange(S)[None, :], 0).astype(np.int64)
        host = {"input_ids": np.ascontiguousarray(tokens, np.int64).reshape(B, S), "attention_mask": mask,
                "position_ids": pos}
        with self.ctx.on_queue(self.queue):
            for n, a in host.items():
                if (S, n) not in self.feeds:
                    self.feeds[S, n] = self.xp.zeros(a.shape, dtype=np.int64)
                self.ctx.copy_from_host(self.feeds[S, n], a, self.queue)
            params = dict(self.state)
            params.update({n: self.feeds[S, n] for n in INPUTS})
            h0 = time.perf_counter()
            outs = prog.run_async(params, self.queue)
            self.last_host_s = time.perf_counter() - h0
            for n, k in zip(self.cache, self.present_index):
                self.ctx.copy(self.queue, self.state[n], outs[k][:, :, S:])
        self.last_logits = outs[self.logits_index]
        return self.last_logits
