"""The decode runners of ``bench/w1_peers.py``, one per system, and the one timing loop they share.

A runner has ``reset()`` (start a new sequence at slot 0), ``prefill(prompt) -> first generated id``,
``step(token) -> next id`` (feed ``token``, read the greedy next id back to the host), ``last_host_s``
(host seconds of the last enqueue call, None where the system does not separate it from the device
work), ``prefill_mode``, ``details() -> dict`` (kernels per step and counters) and ``close()``.

:func:`measure` runs every system the same way: a warm pass (the prompt, then ``warm_steps`` decode
steps: mgx_graph's warmups and capture, onnxruntime's pre-capture runs, the torch capture all happen
there), then a timed pass from slot 0: ``prefill_ms`` is the wall time from the start of the prompt to
the first generated id on the host; each of the ``tokens`` decode steps is timed from feeding the
previous id to having the next one on the host (``ms_per_token``: their median).

Systems:

* :class:`MgxStep` -- mgx_graph's own fixed-shape export through :class:`mgx_graph.llm.generation.Decoder`
  (graphs on: ``mgx_graph``, off: ``mgx_eager``); the step takes one token, so the prompt goes token by
  token. Kernels per step: the captured graph's nodes (``stats()["regions"][*]["graph_nodes"]`` plus
  launches outside the graphs), else the eager launches.
* :class:`MgxGenaiFolder` -- mgx_graph on an onnxruntime-genai folder through
  :class:`mgx_graph.llm.runner.GenaiRunner` (graphs on); the prompt is one prefill run.
* :class:`OnnxruntimeGenai` -- onnxruntime-genai's own generator (``append_tokens`` is the prefill; each
  ``generate_next_token`` runs the model on the previous id and picks the next, so the first one after the
  prompt only picks and belongs to the prefill).
* :class:`OrtStep` -- onnxruntime on mgx_graph's export: every input and output bound once through
  ``io_binding()`` to an ``OrtValue`` on the device, each present output bound onto its past input, the
  ids / slot written with ``update_inplace``; CUDA EP with ``enable_cuda_graph`` on ``gpu``, the CPU EP
  on ``ref``. ``run_with_iobinding`` waits for the device, so ``last_host_s`` is None.
* :class:`TorchStatic` -- transformers with a ``StaticCache``: the prompt as one eager forward, then the
  one-token step captured in a ``torch.cuda.CUDAGraph`` (``gpu``) or run eagerly (``ref``, CPU).
"""
from __future__ import annotations

import copy
import inspect
import statistics
import time

import numpy as np


def measure(runner, prompt: list, tokens: int, warm_steps: int = 4) -> dict:
    """Warm pass, then the timed pass (see the module docstring). Returns the row's measured fields."""
    runner.reset()
    tok = runner.prefill(prompt)
    for _ in range(warm_steps):
        tok = runner.step(tok)
    runner.reset()
    t0 = time.perf_counter()
    tok = runner.prefill(prompt)
    prefill_ms = (time.perf_counter() - t0) * 1e3
    seq, walls, hosts = [tok], [], []
    for _ in range(tokens):
        w0 = time.perf_counter()
        tok = runner.step(tok)
        walls.append(time.perf_counter() - w0)
        if runner.last_host_s is not None:
            hosts.append(runner.last_host_s)
        seq.append(tok)
    return {"ms_per_token": round(statistics.median(walls) * 1e3, 4),
            "ms_per_token_mean": round(statistics.fmean(walls) * 1e3, 4), "timed_steps": len(walls),
            "prefill_ms": round(prefill_ms, 3),
            "host_us_per_token": round(statistics.median(hosts) * 1e6, 1) if hosts else None,
            "first_tokens": seq[:16], "generated": len(seq), "prefill_mode": runner.prefill_mode}


def mgx_details(stats: dict, hip_graph: bool) -> dict:
    """Kernels per step of an mgx_graph program from ``stats()``: the graph nodes of its captured regions
    plus the launches outside them (``launches_per_run`` counts a replay as one), else its eager launches."""
    nodes = [r["graph_nodes"][-1] for r in stats.get("regions", []) if r.get("graph_nodes")]
    if hip_graph and nodes and not stats.get("fallbacks"):
        kernels = sum(nodes) + max(0, stats["launches_per_run"] - len(nodes))
    else:
        kernels = stats["launches_per_run_eager"]
    return {"kernels_per_token": kernels, "launches_per_token": stats["launches_per_run"],
            "launches_per_token_eager": stats["launches_per_run_eager"], "graph_nodes": nodes,
            "captures": stats.get("captures", 0), "replays": stats.get("replays", 0),
            "fallbacks": stats.get("fallbacks", 0),
            "host_fallback_instructions": stats.get("host_fallback_instructions")}


class MgxStep:
    """mgx_graph's fixed-shape decode step (``onnx_path``) compiled for ``target``; the decode runs as
    :meth:`mgx_graph.llm.generation.Decoder.greedy_tokens` (each id fed back on the device, the next step
    queued before the id is read back), as ``mgx_graph.llm.generation`` runs one greedy row."""

    prefill_mode = "token by token (the export is a one-token decode step)"

    def __init__(self, onnx_path, target: str, hip_graph: bool, fp16: bool):
        import mgx_graph
        from mgx_graph.llm.generation import Decoder

        self.hip_graph = hip_graph
        self.prog = mgx_graph.compile(str(onnx_path), target=target, hip_graph=hip_graph, fp16=fp16)
        self.dec = Decoder(self.prog)
        self.last_host_s = None
        self.ids, self.expect = None, None

    def _close(self) -> None:
        if self.ids is not None:
            self.ids.close()
        self.ids = self.expect = None

    def reset(self) -> None:
        self._close()
        self.dec.position = 0  # slots after the ones written are masked: no clearing needed

    def prefill(self, prompt) -> int:
        self._close()
        for t in prompt[:-1]:
            self.dec.step(int(t), want_next=False)
        return self.step(prompt[-1])

    def step(self, token) -> int:
        """The next greedy id after ``token``: the chain's next id when ``token`` is the id it gave
        last (already fed on the device), else a new chain from ``token``.  Raises MgxError when the
        cache is full."""
        from mgx_graph.errors import MgxError

        if self.ids is None or int(token) != self.expect:
            self._close()
            self.ids = self.dec.greedy_tokens(int(token), self.dec.max_len - self.dec.position)
        try:
            self.expect = next(self.ids)
        except StopIteration:  # the chain reached the last slot: as Decoder.feed says
            self._close()
            raise MgxError(f"the KV cache is full ({self.dec.max_len} positions)") from None
        self.last_host_s = self.dec.last_host_s
        return self.expect

    def details(self) -> dict:
        return mgx_details(self.prog.stats(), self.hip_graph)

    def close(self) -> None:
        self._close()
        self.prog.release()


class MgxGenaiFolder:
    """An onnxruntime-genai folder run by mgx_graph's :class:`~mgx_graph.llm.runner.GenaiRunner`."""

    def __init__(self, folder, target: str, max_length: int):
        from mgx_graph.llm.runner import GenaiRunner

        self.runner = GenaiRunner(folder, max_length=max_length, target=target, hip_graph=True)
        self.n = 0
        self.last_host_s = None
        self.prefill_mode = "one run"

    def reset(self) -> None:
        self.n = 0

    def prefill(self, prompt) -> int:
        from mgx_graph.llm.runner import GenaiRunner, length_bucket

        S = length_bucket(len(prompt), self.runner.max_len)
        self.prefill_mode = f"one run (the prompt right-padded to {S} tokens)"
        tokens, rows_at = GenaiRunner.prefill_rows([list(prompt)], S, self.runner.layout.pad_token_id)
        self.n = len(prompt)
        return self._pick(self.runner.run(S, tokens, np.array([self.n])), rows_at)

    def step(self, token) -> int:
        self.n += 1
        return self._pick(self.runner.run(1, np.array([[int(token)]]), np.array([self.n])), np.zeros(1, np.int64))

    def _pick(self, logits, rows_at) -> int:
        self.last_host_s = self.runner.last_host_s
        return int(self.runner.pick(logits, rows_at, False)[0][0])

    def details(self) -> dict:
        st = self.runner.stats()
        d = mgx_details(st["decode"], True)
        d["prefill_graph_nodes"] = {int(S): mgx_details(s, True)["graph_nodes"] for S, s in st["prefill"].items()}
        return d

    def close(self) -> None:
        self.runner.release()


class OnnxruntimeGenai:
    """onnxruntime-genai's generator on ``folder`` (greedy, ``max_length`` = the KV cache slots)."""

    prefill_mode = "one run (append_tokens)"

    def __init__(self, folder, max_length: int):
        import onnxruntime_genai as og

        self.og = og
        self.model = og.Model(str(folder))
        self.max_length = max_length
        self.gen = None
        self.last_host_s = None

    def reset(self) -> None:
        self.gen = None
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(max_length=self.max_length, do_sample=False)
        self.gen = self.og.Generator(self.model, params)

    def prefill(self, prompt) -> int:
        self.gen.append_tokens([[int(t) for t in prompt]])
        return self.step(None)

    def step(self, token) -> int:
        """``token`` is the generator's own last id (it feeds it itself)."""
        if self.gen.is_done():
            raise RuntimeError("onnxruntime-genai ended the sequence early (its eos id or max_length reached)")
        self.gen.generate_next_token()
        return int(self.gen.get_next_tokens()[0])

    def details(self) -> dict:
        return {"kernels_per_token": None, "kernels_note": "not measured (onnxruntime-genai exposes no count)",
                "host_note": "generate_next_token runs the step and picks the next id in one call: no separate "
                             "enqueue time"}

    def close(self) -> None:
        self.gen = None
        self.model = None


class OrtStep:
    """onnxruntime on mgx_graph's export with every input and output bound on the device."""

    prefill_mode = "token by token (the export is a one-token decode step)"

    def __init__(self, onnx_path, cuda: bool):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.log_severity_level = 3
        providers = [("CUDAExecutionProvider", {"enable_cuda_graph": "1"}), "CPUExecutionProvider"] if cuda \
            else ["CPUExecutionProvider"]
        self.sess = ort.InferenceSession(str(onnx_path), so, providers=providers)
        if cuda and "CUDAExecutionProvider" not in self.sess.get_providers():
            raise RuntimeError(f"the CUDA EP did not load (session providers: {self.sess.get_providers()})")
        dev = "cuda" if cuda else "cpu"
        val = ort.OrtValue.ortvalue_from_numpy
        self.io = self.sess.io_binding()
        self.ids = val(np.zeros((1, 1), np.int64), dev, 0)
        self.pos = val(np.zeros(1, np.int64), dev, 0)
        self.io.bind_ortvalue_input("input_ids", self.ids)
        self.io.bind_ortvalue_input("cache_position", self.pos)
        self.cache = []
        for i in self.sess.get_inputs():
            if i.name.startswith("past_key_values."):
                ov = val(np.zeros(i.shape, np.float32), dev, 0)  # zeros: masked slots must not hold NaN
                self.io.bind_ortvalue_input(i.name, ov)
                self.io.bind_ortvalue_output("present." + i.name[len("past_key_values."):], ov)
                self.cache.append(ov)
        out = next(o for o in self.sess.get_outputs() if o.name == "logits")
        self.logits = ort.OrtValue.ortvalue_from_shape_and_type(out.shape, np.float32, dev, 0)
        self.io.bind_ortvalue_output("logits", self.logits)
        self.position = 0
        self.last_host_s = None
        self.cuda = cuda

    def reset(self) -> None:
        self.position = 0

    def prefill(self, prompt) -> int:
        for t in prompt[:-1]:
            self._run(t)
        return self.step(prompt[-1])

    def _run(self, token) -> None:
        self.ids.update_inplace(np.array([[int(token)]], np.int64))
        self.pos.update_inplace(np.array([self.position], np.int64))
        self.sess.run_with_iobinding(self.io)  # returns after the device finished
        self.position += 1

    def step(self, token) -> int:
        self._run(token)
        return int(np.argmax(self.logits.numpy().reshape(-1)))

    def details(self) -> dict:
        return {"kernels_per_token": None, "kernels_note": "not measured", "provider": self.sess.get_providers()[0],
                "cuda_graph": self.cuda, "precision_note": "mgx_graph's export is float32; onnxruntime runs it as is",
                "host_note": "run_with_iobinding returns after the device finished: no separate enqueue time"}

    def close(self) -> None:
        self.io = self.sess = self.logits = None
        self.cache = []


class TorchStatic:
    """transformers' causal LM (a copy of ``model`` in ``dtype`` on ``device``) with a ``StaticCache`` of
    ``max_cache_len`` slots; on CUDA the one-token step is captured once in a ``torch.cuda.CUDAGraph`` and
    replayed (the ids tensor is written in place; the cache's write slot, ``cumulative_length``, is a device
    tensor the replay advances)."""

    prefill_mode = "one run"

    def __init__(self, model, device: str, dtype: str, max_cache_len: int):
        import torch
        from transformers import StaticCache

        self.torch = torch
        self.device = device
        self.model = copy.deepcopy(model).to(device=device, dtype=getattr(torch, dtype)).eval()
        self.cache = StaticCache(config=self.model.config, max_cache_len=max_cache_len)
        params = inspect.signature(self.model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        self.ids = torch.zeros((1, 1), dtype=torch.long, device=device)
        self.use_graph = device.startswith("cuda")
        self.graph = self.out = None
        self.graph_nodes, self.kernels_source = None, None
        self.last_host_s = None

    def _forward(self, ids):
        return self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **{self.cache_kw: self.cache}).logits

    def reset(self) -> None:
        with self.torch.no_grad():
            self.cache.reset()

    def prefill(self, prompt) -> int:
        with self.torch.no_grad():
            logits = self._forward(self.torch.tensor([[int(t) for t in prompt]], device=self.device))
            return int(logits[0, -1].argmax())

    def step(self, token) -> int:
        with self.torch.no_grad():
            self.ids.fill_(int(token))
            if not self.use_graph:
                h0 = time.perf_counter()
                logits = self._forward(self.ids)
                self.last_host_s = time.perf_counter() - h0
                return int(logits[0, -1].argmax())
            if self.graph is None:
                self._capture()
            h0 = time.perf_counter()
            self.graph.replay()
            self.last_host_s = time.perf_counter() - h0
            return int(self.out[0, -1].argmax())

    def _capture(self) -> None:
        """Two warmup steps on a side stream, then the capture; the cache's write slots are put back to
        where they were (the warmups wrote slots that the real steps overwrite before attending to them)."""
        torch = self.torch
        layers = self.cache.layers
        if not all(isinstance(getattr(layer, "cumulative_length", None), torch.Tensor) for layer in layers):
            raise RuntimeError("this transformers' StaticCache keeps no device-side write slot "
                               "(cumulative_length); the hand-captured step needs transformers >= 5.24")
        saved = [layer.cumulative_length.clone() for layer in layers]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._forward(self.ids)
        torch.cuda.current_stream().wait_stream(side)
        try:
            graph = torch.cuda.CUDAGraph(keep_graph=True)
        except TypeError:  # a torch without keep_graph: no node count from the graph
            graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.out = self._forward(self.ids)
        for layer, s in zip(layers, saved):
            layer.cumulative_length.copy_(s)
        self.graph = graph
        self.graph_nodes = cuda_graph_nodes(graph)
        self.kernels_source = "cudaGraphGetNodes of the captured step" if self.graph_nodes else None
        if self.graph_nodes is None:
            self.graph_nodes = self._profiled_kernels(saved)

    def _profiled_kernels(self, saved) -> int | None:
        """Kernels of one eager step under torch.profiler (CUDA activity), cache slots restored after."""
        torch = self.torch
        try:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                self._forward(self.ids)
                torch.cuda.synchronize()
            for layer, s in zip(self.cache.layers, saved):
                layer.cumulative_length.copy_(s)
            n = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                    and not e.name.startswith(("Memcpy", "Memset")))
            self.kernels_source = "torch.profiler, one eager step"
            return n or None
        except Exception:  # noqa: BLE001 - the count is optional
            return None

    def details(self) -> dict:
        import transformers

        return {"kernels_per_token": self.graph_nodes, "kernels_source": self.kernels_source,
                "cuda_graph": self.use_graph, "torch_version": self.torch.__version__,
                "transformers_version": transformers.__version__}

    def close(self) -> None:
        self.graph = self.out = self.model = self.cache = None
        if self.use_graph:
            self.torch.cuda.empty_cache()


def cuda_graph_nodes(graph) -> int | None:
    """Nodes of a ``torch.cuda.CUDAGraph`` captured with ``keep_graph=True`` (cuda-python's
    ``cudaGraphGetNodes``), or None when that is not available."""
    try:
        from cuda.bindings import runtime as cudart

        err, _, count = cudart.cudaGraphGetNodes(cudart.cudaGraph_t(init_value=graph.raw_cuda_graph()), 0)
        return int(count) if err == cudart.cudaError_t.cudaSuccess else None
    except Exception:  # noqa: BLE001 - no cuda-python, no keep_graph: the caller counts another way
        return None
