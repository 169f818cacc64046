"""``mgx-graph export CHECKPOINT OUT``: a transformers checkpoint folder to an onnxruntime-genai folder that
``mgx-graph generate``, ``mgx-graph serve`` and :class:`mgx_graph.llm.LLM` run.

A thin wrapper over onnxruntime-genai's model builder, run as its command line
(``python -m onnxruntime_genai.models.builder -i CHECKPOINT -o OUT -p PRECISION -e EP``, offline), that checks
first what the builder would only find out late or not at all:

* CHECKPOINT is a folder with a ``config.json`` naming an architecture of :data:`ARCHITECTURES` (the decoders
  whose builder graph mgx_graph's onnxruntime-genai runner runs: GroupQueryAttention with the rotary
  embedding inside it, past and present in one buffer);
* the precision and the execution provider give such a graph (:data:`FLAVORS`): the builder makes fp16 graphs
  for the CPU, and fp32 graphs for CUDA, with MultiHeadAttention / Attention and ``position_ids`` instead;
* the builder and the modules it imports (torch, transformers, onnx_ir) are installed: the ``genai-export``
  extra;
* OUT does not exist yet or is an empty folder.

The builder writes into a temporary folder beside OUT, which becomes OUT once its ``genai_config.json`` reads
as a folder mgx_graph runs. The execution provider only picks the graph's flavor: mgx_graph runs the folder
on the ``gpu`` or the ``ref`` target either way.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ..errors import ParameterError

#: transformers architectures (``config.json``'s ``architectures[0]``) whose builder graph mgx_graph runs,
#: each checked token for token against onnxruntime-genai (tests/cli/test_cli_export*.py).
ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "PhiForCausalLM",
                 "Phi3ForCausalLM", "GemmaForCausalLM", "Gemma2ForCausalLM", "GraniteForCausalLM", "OlmoForCausalLM",
                 "SmolLM3ForCausalLM", "Ernie4_5ForCausalLM", "HunYuanDenseV1ForCausalLM", "NemotronForCausalLM",
                 "GptOssForCausalLM", "Lfm2ForCausalLM")
PRECISIONS = ("fp32", "fp16", "int4")
#: (precision, execution provider) pairs whose builder graph mgx_graph runs; the default provider of each precision.
FLAVORS = {("fp32", "cpu"), ("int4", "cpu"), ("fp16", "cuda"), ("int4", "cuda")}
DEFAULT_PROVIDER = {"fp32": "cpu", "fp16": "cuda", "int4": "cpu"}
#: modules the builder imports (the ``genai-export`` extra)
BUILDER_MODULES = ("onnxruntime_genai", "torch", "transformers", "onnx_ir")
BUILDER = "onnxruntime_genai.models.builder"
#: the builder's extra options: sliding-window layers keep a cache of the full length (their attention still
#: sees only the window, GroupQueryAttention's ``local_window_size``) instead of a window-sized ring buffer
#: (``sliding_window_cache``), which the runner's one shared cache of ``max_length`` rows does not model
BUILDER_OPTIONS = ("windowed_kv_cache=false",)
EXTRA = "genai-export"

DESCRIPTION = ("Makes an onnxruntime-genai folder (model.onnx, genai_config.json, the tokenizer) from a transformers\n"
               "checkpoint folder with onnxruntime-genai's model builder, for generate, serve and mgx_graph.llm.LLM.\n"
               "Architectures: " + ",\n".join(", ".join(ARCHITECTURES[i:i + 5])
                                               for i in range(0, len(ARCHITECTURES), 5)) + ".\n"
               "Precision and execution provider: fp32 (cpu), fp16 (cuda), int4 (cpu or cuda). The provider picks\n"
               "the graph's flavor only: mgx_graph runs the folder on the gpu or the ref target either way.\n"
               f"Needs the {EXTRA} extra: pip install 'mgx_graph[{EXTRA}]'.")


def add_parser(sub, parser_kw: dict, cmd) -> None:
    """Add the ``export`` command to the subparsers ``sub``; ``cmd`` is its function."""
    e = sub.add_parser("export", help="a transformers checkpoint to an onnxruntime-genai folder (their builder)",
                       description=DESCRIPTION, **parser_kw)
    e.add_argument("checkpoint", metavar="CHECKPOINT_FOLDER",
                   help="a transformers checkpoint folder: config.json, the weights (safetensors), the tokenizer")
    e.add_argument("out", metavar="OUT", help="the folder to make; it must not exist or be empty")
    e.add_argument("--precision", required=True, choices=PRECISIONS,
                   help="weights and activations: fp32, fp16, or int4 weights (MatMulNBits)")
    e.add_argument("--execution-provider", choices=("cpu", "cuda"),
                   help="the graph's flavor (default: cuda for fp16, cpu for fp32 and int4)")
    e.set_defaults(fn=cmd)


def check_checkpoint(folder) -> str:
    """The architecture of the checkpoint ``folder`` (``config.json``'s ``architectures[0]``); ParameterError
    naming the folder or file when the folder is missing, has no config.json, or names another architecture."""
    from ..llm.folder_config import read_json

    folder = Path(folder)
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise ParameterError(f"CHECKPOINT_FOLDER {folder}: {what}; expected a transformers checkpoint folder")
    config = folder / "config.json"
    if not config.is_file():
        raise ParameterError(f"CHECKPOINT_FOLDER {folder}: no config.json in it; expected a transformers checkpoint "
                             f"folder (config.json, the weights, the tokenizer)")
    cfg = read_json(config, "the checkpoint's config", folder)
    archs = cfg.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    expected = f"one of {', '.join(ARCHITECTURES)}"
    if arch is None and "architectures" not in cfg:
        raise ParameterError(f"{config}: no 'architectures' field; mgx-graph export takes a checkpoint whose "
                             f"config names {expected}")
    if arch is None:
        raise ParameterError(f"{config}: field 'architectures' is {archs!r}; expected a list whose first entry is "
                             f"{expected}")
    if arch not in ARCHITECTURES:
        raise ParameterError(f"{config}: architecture {arch} is not supported by mgx-graph export; expected "
                             f"{expected}")
    return arch


def check_flavor(precision: str, provider: str | None) -> str:
    """The execution provider for ``precision`` (its default when ``provider`` is None); ParameterError when
    the builder's graph for the pair is not one mgx_graph runs."""
    if precision not in PRECISIONS:
        raise ParameterError(f"--precision: expected one of {', '.join(PRECISIONS)}, got {precision!r}")
    provider = provider or DEFAULT_PROVIDER[precision]
    if (precision, provider) not in FLAVORS:
        pairs = ", ".join(f"{p} ({e})" for p, e in sorted(FLAVORS))
        raise ParameterError(f"--precision {precision} --execution-provider {provider}: onnxruntime-genai's builder "
                             f"makes this graph with MultiHeadAttention and position_ids, which mgx_graph does not "
                             f"run; expected one of {pairs}")
    return provider


def check_builder() -> None:
    """MissingExtraError naming the module and the ``genai-export`` extra when the builder or a module it
    imports is not installed (found without importing torch)."""
    from ..models.errors import MissingExtraError

    for module in BUILDER_MODULES + (BUILDER,):
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError) as e:
            raise MissingExtraError("export", module, "onnxruntime-genai's model builder", cause=str(e),
                                    extra=EXTRA) from None
        if not found:
            raise MissingExtraError("export", module, "onnxruntime-genai's model builder", extra=EXTRA)


def check_out(out) -> Path:
    """``out`` as a Path; ParameterError when it is a file, a folder with something in it, or its parent is
    not a folder."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        what = "is a file" if not out.is_dir() else "is a folder with files in it"
        raise ParameterError(f"OUT {out}: {what}; give a new folder (or an empty one)")
    parent = out.absolute().parent
    if not parent.is_dir():
        raise ParameterError(f"OUT {out}: {parent} is not a folder")
    return out


def run_builder(checkpoint: Path, work: Path, precision: str, provider: str) -> None:
    """The builder's command line into ``work`` (offline: no download); on failure its output goes to stderr
    and a ParameterError names its exit status and last line."""
    cmd = [sys.executable, "-m", BUILDER, "-i", str(checkpoint), "-o", str(work / "out"), "-p", precision,
           "-e", provider, "-c", str(work / "cache"), "--extra_options", *BUILDER_OPTIONS]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0 or not (work / "out" / "genai_config.json").is_file():
        sys.stderr.write(r.stdout + r.stderr)
        lines = [ln.strip() for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
        last = lines[-1][:300] if lines else "no output"
        raise ParameterError(f"CHECKPOINT_FOLDER {checkpoint}: onnxruntime-genai's model builder failed "
                             f"(exit {r.returncode}): {last}")


def export(checkpoint, out, precision: str, execution_provider: str | None = None) -> Path:
    """Make the onnxruntime-genai folder ``out`` from the checkpoint folder ``checkpoint`` (see the module's
    doc); returns ``out``. Raises ParameterError, or MissingExtraError when the builder is not installed."""
    from ..llm.runner import GenaiLayout

    checkpoint = Path(checkpoint)
    check_checkpoint(checkpoint)
    provider = check_flavor(precision, execution_provider)
    out = check_out(out)
    check_builder()
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.absolute().parent))
    try:
        run_builder(checkpoint, work, precision, provider)
        GenaiLayout.read(work / "out")  # the folder reads as one generate and serve run
        if out.is_dir():
            out.rmdir()  # empty (check_out)
        os.replace(work / "out", out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def cmd_export(args) -> int:
    provider = check_flavor(args.precision, args.execution_provider)
    out = export(args.checkpoint, args.out, args.precision, provider)
    files = sorted(p.name for p in out.iterdir())
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    print(f"exported {args.checkpoint} ({args.precision}, {provider} graph) -> {out}: {', '.join(files)} "
          f"({size / 1e6:.1f} MB)")
    print(f"run it: mgx-graph generate {out} --prompt \"...\"   or   mgx-graph serve {out}")
    return 0
