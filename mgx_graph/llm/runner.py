"""Decoders in onnxruntime-genai's layout: one captured decode step and one prefill run per length bucket.

An onnxruntime-genai folder (``genai_config.json``, ``model.onnx``, tokenizer files; what its model
builder writes) has a graph with symbolic shapes: ``input_ids`` int64 [B, S], ``attention_mask`` int64
[B, T], ``past_key_values.{i}.key|value`` [B, kv, P, hd] -> ``logits`` [B, S, vocab],
``present.{i}.key|value`` [B, kv, max(T, P), hd], every layer a com.microsoft::GroupQueryAttention
whose ``seqlens_k`` is ``sum(attention_mask) - 1`` per row and whose ``total_sequence_length`` is the
mask's width. :class:`GenaiRunner` compiles it with fixed shapes:

* the KV cache is one set of device buffers of ``max_length`` (M) rows, [B, kv, M, hd], allocated
  once; past and present share them (the program's alias binds each present output onto its past
  input, written in place), so every program sees the same pointers;
* the attention mask is one int64 [B, M] buffer: row b holds ones on its first ``n_b`` slots (its
  tokens so far) and zeros after, so ``total_sequence_length`` is the constant M and the GQA of row b
  attends to its first ``n_b`` cache rows;
* the decode step (``input_ids`` [B, 1]) is one specialization: with graphs on it is captured once and
  replayed for the whole generation;
* the prompts run as one prefill with ``input_ids`` [B, S], S the smallest power of two holding the
  longest prompt (capped at M): each bucket its own specialization and graph (captured on its first
  run: ``warmup=0``). Shorter rows are right-padded; their padding rows are written to the cache past
  the row's length, where the row's next decode steps overwrite them, and are never attended to.

Rows finish independently: a finished row keeps stepping with the pad token at a fixed slot (its mask
does not grow), which rewrites that unused cache row only.

Per decode step the host copies B token ids and the [B, M] mask to the device, runs the step on the
queue and reads back B argmax ids (greedy) or the B logits rows (sampling).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import MgxError, ParameterError, ParseError
from .folder_config import Choices, Fields, Ids, Int, NameTemplate, Str
from .generation import describe_host_ops

GENAI_CONFIG = "genai_config.json"
#: ``model.decoder.layer_types`` entries: attention layers hold a KV cache, ``conv`` layers (LFM2's short
#: convolutions) a convolution state of fixed size
LAYER_TYPES = ("full_attention", "sliding_attention", "attention", "conv")
#: Registry names whose build is a runner folder (onnxruntime-genai or optimum-style), not a decode step.
FOLDER_MODELS = ("smollm2-genai", "llama-optimum", "smollm2-optimum")


@dataclass
class GenaiLayout:
    """What ``genai_config.json`` says about a folder's decoder.

    Attributes: ``onnx_path``, ``folder``, ``num_layers``, ``num_kv_heads``, ``head_size``,
    ``vocab_size``, ``context_length`` (tokens), ``eos_token_ids``, ``pad_token_id``, the input names
    (``input_ids``, ``attention_mask``, ``past_key`` / ``past_value`` patterns with ``%d``, and
    ``position_ids`` where the graph takes them: None otherwise) and output names (``logits``,
    ``present_key`` / ``present_value`` patterns).
    """

    folder: Path
    onnx_path: Path
    num_layers: int
    num_kv_heads: int
    head_size: int
    vocab_size: int
    context_length: int
    eos_token_ids: list
    pad_token_id: int
    input_ids: str
    attention_mask: str
    past_key: str
    past_value: str
    logits: str
    present_key: str
    present_value: str
    position_ids: str | None = None
    past_conv: str = ""  # "": no convolution layers
    present_conv: str = ""
    layer_types: tuple = ()  # per layer "conv" or an attention kind; () : every layer attention
    conv_lens: tuple = ()  # a conv state's fixed dims after the batch (channels, kernel taps - 1)

    @classmethod
    def read(cls, folder) -> "GenaiLayout":
        """Read ``folder/genai_config.json``, every field checked (:mod:`mgx_graph.llm.folder_config`).
        Raises ParameterError naming the file and the field when it is missing, not a JSON object, or a
        field is missing or of the wrong type or range, or when the decoder has inputs this runner does
        not feed; ParseError when ``decoder.filename`` leaves the folder."""
        folder = Path(folder)
        path = folder / GENAI_CONFIG
        if not path.is_file():
            raise ParameterError(f"{folder} is not an onnxruntime-genai folder: no {GENAI_CONFIG}")
        cfg = Fields.read(path, "an onnxruntime-genai config").section("model")
        dec = cfg.section("decoder")
        ins, outs = dec.section("inputs"), dec.section("outputs")
        extra = sorted(set(ins.data) - {"input_ids", "attention_mask", "position_ids", "past_key_names",
                                        "past_value_names", "past_conv_names"})
        if extra:
            raise ParameterError(f"{path}: decoder inputs {extra} are not supported (this runner feeds "
                                 f"input_ids, attention_mask, position_ids and the past key / value and convolution "
                                 f"state buffers)")
        vocab = cfg.get("vocab_size", Int(1))
        kv = dec.get("num_key_value_heads", Int(1))
        heads = dec.get("num_attention_heads", Int(1), kv)
        if heads % kv:
            raise dec.fail("num_attention_heads", f"expected a multiple of num_key_value_heads ({kv}), got {heads}")
        dec.get("hidden_size", Int(1), None)
        cfg.get("bos_token_id", Int(0, vocab - 1), None)
        eos = cfg.get("eos_token_id", Ids(vocab))
        names = {k: ins.get(k, Str()) for k in ("input_ids", "attention_mask")}
        names.update(logits=outs.get("logits", Str()), position_ids=ins.get("position_ids", Str(), None),
                     past_conv=ins.get("past_conv_names", NameTemplate(), ""),
                     present_conv=outs.get("present_conv_names", NameTemplate(), ""))
        layers = dec.get("num_hidden_layers", Int(1))
        kinds = tuple(dec.get("layer_types", Choices(LAYER_TYPES, layers), ()))
        if "conv" in kinds and not (names["past_conv"] and names["present_conv"]):
            raise dec.fail("layer_types", "conv layers need inputs.past_conv_names and outputs.present_conv_names")
        names.update({f: sec.get(k, NameTemplate()) for f, sec, k in (
            ("past_key", ins, "past_key_names"), ("past_value", ins, "past_value_names"),
            ("present_key", outs, "present_key_names"), ("present_value", outs, "present_value_names"))})
        return cls(folder=folder, onnx_path=dec.path_in("filename", folder),
                   num_layers=layers, layer_types=kinds, num_kv_heads=kv,
                   head_size=dec.get("head_size", Int(1)), vocab_size=vocab,
                   context_length=cfg.get("context_length", Int(1)), eos_token_ids=eos,
                   pad_token_id=_pad_id(cfg.get("pad_token_id", Int(-1, vocab - 1), -1), eos[0]), **names)

    def check_graph(self) -> None:
        """ParameterError when a name of ``genai_config.json`` is not an input / output of the ONNX graph
        (naming the field), or a past input's fixed dims disagree with the head counts; ParseError when
        the graph cannot be read."""
        import onnx

        try:
            graph = onnx.load(str(self.onnx_path), load_external_data=False).graph
        except Exception as e:  # protobuf DecodeError, OSError
            raise ParseError(f"{self.onnx_path}: not a valid ONNX protobuf ({type(e).__name__}: {e})") from None
        have = {"inputs": {i.name: i for i in graph.input}, "outputs": {o.name: o for o in graph.output}}
        path = self.folder / GENAI_CONFIG
        if self.num_layers > len(have["inputs"]):
            raise ParameterError(f"{path}: field 'model.decoder.num_hidden_layers': {self.num_layers}, but "
                                 f"{self.onnx_path.name} has {len(have['inputs'])} inputs (a layer needs a past key "
                                 f"and a past value input, or a past convolution state)")
        A = [i for i in range(self.num_layers) if not self.is_conv(i)]
        C = [i for i in range(self.num_layers) if self.is_conv(i)]
        wanted: list[tuple[str, str, list[str]]] = [
                  ("inputs", "input_ids", [self.input_ids]), ("inputs", "attention_mask", [self.attention_mask]),
                  *([("inputs", "position_ids", [self.position_ids])] if self.position_ids else []),
                  ("inputs", "past_key_names", [self.past_key % i for i in A]),
                  ("inputs", "past_value_names", [self.past_value % i for i in A]),
                  ("inputs", "past_conv_names", [self.past_conv % i for i in C]),
                  ("outputs", "logits", [self.logits]),
                  ("outputs", "present_key_names", [self.present_key % i for i in A]),
                  ("outputs", "present_value_names", [self.present_value % i for i in A]),
                  ("outputs", "present_conv_names", [self.present_conv % i for i in C])]
        for side, key, names in wanted:
            missing = [n for n in names if n not in have[side]]
            if missing:
                raise ParameterError(f"{path}: field 'model.decoder.{side}.{key}': {missing[0]!r} is not one of the "
                                     f"{side} of {self.onnx_path.name} ({sorted(have[side])[:8]}; "
                                     f"num_hidden_layers {self.num_layers})")
        def dims(name):
            shape = have["inputs"][name].type.tensor_type.shape
            return [d.dim_value if d.HasField("dim_value") else None for d in shape.dim]
        first = self.past_key % A[0] if A else None
        for axis, key, want in ((1, "num_key_value_heads", self.num_kv_heads), (3, "head_size", self.head_size)):
            got = dims(first) if first else []
            if len(got) == 4 and got[axis] is not None and got[axis] != want:
                raise ParameterError(f"{path}: field 'model.decoder.{key}': {want}, but {first} of "
                                     f"{self.onnx_path.name} has {got[axis]} on axis {axis}")
        if C:
            conv = dims(self.past_conv % C[0])
            if len(conv) != 3 or None in conv[1:] or min(conv[1:]) < 1:
                raise ParameterError(f"{path}: {self.past_conv % C[0]} of {self.onnx_path.name} has dims {conv}; "
                                     f"expected [batch, channels, taps] with fixed channels and taps")
            self.conv_lens = tuple(conv[1:])

    def is_conv(self, layer: int) -> bool:
        """Whether ``layer`` holds a convolution state instead of a KV cache."""
        return bool(self.layer_types) and self.layer_types[layer] == "conv"

    def cache_names(self) -> list[str]:
        """The past state input names, layer by layer: key and value, or the convolution state."""
        return [pat % i for i in range(self.num_layers)
                for pat in ((self.past_conv,) if self.is_conv(i) else (self.past_key, self.past_value))]

    def conv_names(self) -> list[str]:
        """The past convolution state input names (none without conv layers)."""
        return [self.past_conv % i for i in range(self.num_layers) if self.is_conv(i)]

    def present_to_past(self) -> dict:
        """Each present output's name -> the past input it is written over in place."""
        pairs = {}
        for i in range(self.num_layers):
            kinds = (("present_conv", "past_conv"),) if self.is_conv(i) else \
                (("present_key", "past_key"), ("present_value", "past_value"))
            pairs.update({getattr(self, o) % i: getattr(self, q) % i for o, q in kinds})
        return pairs


def positive_int(name: str, value, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1 or \
            (high is not None and value > high):
        span = f"an int in 1..{high}" + (" (the context length)" if name == "max_length" else "") \
            if high is not None else "a positive int"
        raise ParameterError(f"{name} must be {span}, got {value!r}")


def _pad_id(pad: int, eos: int) -> int:
    """The pad token id of a config whose ``pad_token_id`` may be -1 (no pad token, as some configs write it):
    the first end-of-sequence id then."""
    return eos if pad < 0 else pad


def check_runner_options(batch, max_length, context_length: int, target, hip_graph, fp16) -> None:
    """ParameterError naming the first keyword argument of a runner that is out of range: ``batch`` a
    positive int, ``max_length`` an int in 1..``context_length``, ``target`` "auto", "gpu", "ref" or
    "cpu", ``hip_graph`` a bool or None, ``fp16`` a bool."""
    positive_int("batch", batch)
    positive_int("max_length", max_length, context_length)
    if not isinstance(target, str) or target.lower() not in ("auto", "gpu", "ref", "cpu"):
        raise ParameterError(f"target must be one of 'auto', 'gpu', 'ref', got {target!r}")
    if hip_graph is not None and not isinstance(hip_graph, (bool, np.bool_)):
        raise ParameterError(f"hip_graph must be True, False or None, got {hip_graph!r}")
    if not isinstance(fp16, (bool, np.bool_)):
        raise ParameterError(f"fp16 must be True or False, got {fp16!r}")


def is_genai_folder(path) -> bool:
    """True when ``path`` is a folder with a ``genai_config.json``."""
    return Path(path).is_dir() and (Path(path) / GENAI_CONFIG).is_file()


def length_bucket(n: int, cap: int) -> int:
    """The smallest power of two >= ``n``, at most ``cap`` (prefill lengths; ``n`` <= ``cap``)."""
    b = 1
    while b < n:
        b *= 2
    return min(b, cap)


class GenaiRunner:
    """Runs an onnxruntime-genai folder with fixed-shape programs over one in-place KV cache.

    Args:
        folder: the onnxruntime-genai folder (see :class:`GenaiLayout`).
        batch: rows B of every program (at most B prompts per generation).
        max_length: cache rows M (prompt plus generated tokens, per row); at most the context length.
        target, hip_graph, fp16: as :func:`mgx_graph.compile`.

    Attributes (as :class:`~mgx_graph.llm.generation.Decoder`): ``batch``, ``vocab_size``, ``max_len`` (M),
    ``program`` (the decode step), ``programs`` (``{S: program}``, 1 = the decode step), ``ctx``,
    ``queue``, ``xp``, ``last_host_s``. Raises ParameterError for a bad folder or size, CompileError
    from the compiler.
    """

    rows_interface = True
    conv_states: tuple[str, ...] = ()  # the past convolution state inputs (LFM2); none for other layouts
    host_op_parts: tuple[tuple[int, str], ...] = ((2, "copies"),)  # per run outside the program: the ids and the mask, host to device

    @property
    def host_ops(self) -> str:
        """:attr:`host_op_parts` as text (as :attr:`mgx_graph.llm.generation.Decoder.host_ops`)."""
        return describe_host_ops(self.host_op_parts)

    def __init__(self, folder, *, batch: int = 1, max_length: int = 256, target: str = "auto",
                 hip_graph: bool | None = None, fp16: bool = False):
        self.layout = lay = GenaiLayout.read(folder)
        if lay.position_ids:  # the ids, the mask and the positions
            self.host_op_parts = ((3, "copies"),)
        check_runner_options(batch, max_length, lay.context_length, target, hip_graph, fp16)
        lay.check_graph()
        self.conv_states = tuple(lay.conv_names())
        if self.conv_states and batch != 1:
            raise ParameterError(f"batch must be 1 for {folder}: its convolution layers keep a state of the last "
                                 f"tokens, which a padded row of a batch would fill with padding; got {batch} "
                                 f"(mgx-graph serve: --max-rows 1; mgx-graph generate: one --prompt at a time)")
        self.batch, self.max_len, self.vocab_size = batch, max_length, lay.vocab_size
        self.compile_kw: dict[str, Any] = dict(target=target, hip_graph=hip_graph, fp16=fp16)
        self.programs: dict = {}
        self.program = self._program(1)
        ctx = self.program.context
        self.ctx, self.xp, self.queue = ctx, ctx.xp, self.program.queue
        shapes = self.program.get_parameter_shapes()
        with ctx.on_queue(self.queue):
            self.state = {n: ctx.xp.zeros(shapes[n].lens, dtype=shapes[n].np_dtype)
                          for n in [lay.attention_mask] + lay.cache_names()}
            self.ids = {1: ctx.xp.zeros((batch, 1), dtype=np.int64)}
            self.positions = {1: ctx.xp.zeros((batch, 1), dtype=np.int64)}
        ctx.synchronize(self.queue)
        self.last_logits, self.last_host_s = None, 0.0

    def _dims(self, S: int) -> dict:
        lay, B, M = self.layout, self.batch, self.max_len
        dims = {lay.input_ids: [B, S], lay.attention_mask: [B, M]}
        if lay.position_ids:
            dims[lay.position_ids] = [B, S]
        conv = set(lay.conv_names())
        for n in lay.cache_names():
            dims[n] = [B, *lay.conv_lens] if n in conv else [B, lay.num_kv_heads, M, lay.head_size]
        return dims

    def _program(self, S: int):
        """The program for ``S`` new tokens per row (compiled on first use; the cache bound in place)."""
        if S not in self.programs:
            from ..compiler import compile as compile_model

            want = self.layout.present_to_past()
            prog = compile_model(str(self.layout.onnx_path), input_dims=self._dims(S), alias=want,
                                 warmup=2 if S == 1 else 0, **self.compile_kw)
            if dict(prog.alias) != want:
                raise MgxError(f"{self.layout.onnx_path}: the present outputs are not bound in place onto the past "
                               f"inputs (alias {dict(prog.alias)}); the cache cannot be shared")
            self.logits_index = prog.get_output_names().index(self.layout.logits)
            self._check_logits(prog.get_output_shapes()[self.logits_index])
            self.programs[S] = prog
        return self.programs[S]

    def _check_logits(self, shape) -> None:
        """ParameterError naming ``model.vocab_size`` when the compiled logits [B, S, vocab] are not that wide
        (ids are read, sampled and decoded over ``vocab_size`` columns)."""
        lens = list(getattr(shape, "lens", []))
        if not lens or lens[-1] != self.vocab_size:
            raise ParameterError(f"{self.layout.folder / GENAI_CONFIG}: field 'model.vocab_size': {self.vocab_size}, "
                                 f"but the logits output {self.layout.logits!r} of {self.layout.onnx_path.name} is "
                                 f"{lens} (its last dim is the vocabulary)")

    def run(self, S: int, tokens: np.ndarray, lengths: np.ndarray):
        """Run ``S`` tokens per row (``tokens`` int [B, S]); ``lengths`` int [B]: each row's tokens in the
        cache after this run (its mask). A prefill (``S`` > 1) writes each row from slot 0, a decode step
        (``S`` = 1) at slot ``lengths - 1``; where the graph takes ``position_ids`` they are those slots.
        Returns the logits device array [B, S, vocab]."""
        prog = self._program(S)
        if S not in self.ids:
            with self.ctx.on_queue(self.queue):
                self.ids[S] = self.xp.zeros((self.batch, S), dtype=np.int64)
                self.positions[S] = self.xp.zeros((self.batch, S), dtype=np.int64)
        mask = (np.arange(self.max_len)[None, :] < np.asarray(lengths)[:, None]).astype(np.int64)
        params = dict(self.state)
        params[self.layout.input_ids] = self.ids[S]
        with self.ctx.on_queue(self.queue):
            self.ctx.copy_from_host(self.ids[S], np.ascontiguousarray(tokens, np.int64).reshape(self.batch, S),
                                    self.queue)
            if self.layout.position_ids:
                first = np.asarray(lengths, np.int64) - 1 if S == 1 else np.zeros(self.batch, np.int64)
                self.ctx.copy_from_host(self.positions[S], first[:, None] + np.arange(S, dtype=np.int64)[None, :],
                                        self.queue)
                params[self.layout.position_ids] = self.positions[S]
            self.ctx.copy_from_host(self.state[self.layout.attention_mask], mask, self.queue)
            h0 = time.perf_counter()
            outs = prog.run_async(params, self.queue)
            self.last_host_s = time.perf_counter() - h0
        self.last_logits = outs[self.logits_index]
        return self.last_logits

    def pick(self, logits, rows_at: np.ndarray, want_logits: bool):
        """``(argmax ids int64 [B], logits float32 [B, vocab] or None)`` of row ``b`` at ``rows_at[b]``."""
        with self.ctx.on_queue(self.queue):
            sel = logits[self.xp.arange(self.batch), self.xp.asarray(np.asarray(rows_at, np.int64))]
            if want_logits:
                rows = np.asarray(self.ctx.to_host(sel, self.queue), np.float32).reshape(self.batch, -1)
                return rows.argmax(axis=1).astype(np.int64), rows
            ids = self.xp.argmax(sel, axis=1)
            return np.asarray(self.ctx.to_host(ids, self.queue), np.int64).reshape(-1), None

    def stats(self) -> dict:
        """Graph counters summed over the programs (``captures``, ``replays``, ...) plus the decode step's
        own stats under ``"decode"`` and each prefill bucket's under ``"prefill"``."""
        st = dict(self.program.stats())
        st["decode"] = self.program.stats()
        st["prefill"] = {S: p.stats() for S, p in self.programs.items() if S != 1}
        for k in ("captures", "replays", "fallbacks", "warmups", "eager_runs"):
            st[k] = sum(p.stats().get(k, 0) for p in self.programs.values())
        return st

    def release(self) -> None:
        for p in self.programs.values():
            p.release()

    # -- generation (called by mgx_graph.llm.generation.generate) ---------------------------------------
    @staticmethod
    def prefill_rows(prompts, S: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens int64 [B, S], column of each row's last prompt token int64 [B])``: the prompts
        right-padded with ``pad`` (each row's cache rows start at slot 0)."""
        tokens = np.full((len(prompts), S), pad, np.int64)
        for r, p in enumerate(prompts):
            tokens[r, :len(p)] = p
        return tokens, np.array([len(p) - 1 for p in prompts], np.int64)

    def decode_loop(self, rows, sampler) -> tuple[float, float, list]:
        """Prefill every prompt in one bucketed run, then one decode step per token until every row is
        done; ``rows`` is the generation's row state (:class:`mgx_graph.llm.generation._Rows`). Returns
        ``(prefill_s, decode_s, host seconds per decode run)``."""
        B, M = self.batch, self.max_len
        prompts = list(rows.prompts) + [[rows.pad]] * (B - len(rows.prompts))
        lens = np.array([len(p) for p in prompts], np.int64)
        conv = self.conv_states
        S = int(lens.max()) if conv else length_bucket(int(lens.max()), M)  # a padded prompt would reach the state
        with self.ctx.on_queue(self.queue):
            for n in conv:  # a new sequence: no tokens before it in the convolution state
                self.ctx.fill(self.queue, self.state[n], 0)
        tokens, rows_at = self.prefill_rows(prompts, S, rows.pad)
        want = sampler.needs_logits or rows.keep_logits
        t0 = time.perf_counter()
        if rows.max_new == 0:
            for res in rows.results:
                res.finish_reason = "length"
            return 0.0, 0.0, []
        logits = self.run(S, tokens, lens)
        chosen, lg = self.pick(logits, rows_at, want)
        prefill_s = time.perf_counter() - t0
        t1, host = time.perf_counter(), [self.last_host_s]
        while True:
            rows.accept(sampler.choose(lg) if lg is not None else chosen, lg)
            for r in range(len(rows.prompts)):
                if not rows.done[r] and lens[r] >= M:
                    rows.done[r], rows.results[r].finish_reason = True, "cache_full"
            if rows.all_done():
                break
            live = np.array([not d for d in rows.done])
            step = np.where(live, rows.last, rows.pad).astype(np.int64).reshape(B, 1)
            lens = np.where(live, lens + 1, lens)
            logits = self.run(1, step, lens)
            host.append(self.last_host_s)
            chosen, lg = self.pick(logits, np.zeros(B, np.int64), want)
        return prefill_s, time.perf_counter() - t1, host
