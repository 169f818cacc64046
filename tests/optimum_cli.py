"""SmolLM2-135M-Instruct in the optimum layout (models/smollm2_optimum.py) for its tests: the build, the
GGUF's own tokenizer, the chat prompt's ids, transformers' greedy tokens (computed once per model, prompt,
length and eos ids in a process) and the answer ``mgx-graph generate FOLDER --target ref`` prints."""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

PROMPT = "What is the capital of France?"
END_OF_TEXT = "<|endoftext|>"  # a special token the model does not emit here: decoding runs past <|im_end|>


def build(model_cache, **options):
    from mgx_graph.models import build

    try:
        return build("smollm2-optimum", cache_dir=model_cache, progress=False, **options)
    except ImportError as e:
        pytest.skip(f"model export needs the [export] extra: {e}")


@functools.lru_cache(maxsize=2)
def _gguf_tokenizer(gguf: str):
    from mgx_graph.models.smollm2 import load_tokenizer

    return load_tokenizer(Path(gguf))


def gguf_tokenizer(info):
    """The tokenizer read from the GGUF itself (not the copy saved in the folder)."""
    return _gguf_tokenizer(str(info.hf_dir_or_gguf))


def chat_ids(tok) -> list[int]:
    out = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                  tokenize=True)
    return [int(t) for t in (out["input_ids"] if hasattr(out, "keys") else out)]


_ORACLE: dict = {}


def hf_greedy(info, ids, n: int, eos: list[int]) -> list[int]:
    """transformers' greedy ``generate`` on the GGUF's torch model (same layer cut, loaded by the
    builder's ``load_torch_model`` and kept by the oracle module), stopping after an id of ``eos``
    (kept), as mgx_graph's generate does; computed once per arguments (several tests and
    parametrizations compare with the same oracle)."""
    from mgx_graph.models.oracle import load_torch_model

    key = (str(info.directory), tuple(ids), n, tuple(eos))
    if key not in _ORACLE:
        import torch

        model = load_torch_model(info)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=eos[0])
        _ORACLE[key] = out[0, len(ids):].tolist()
    return list(_ORACLE[key])


def cli_text(folder, n: int, graphs: bool, capsys, eos_ids=(), fp16: bool = False) -> tuple[str, str]:
    """``(answer text, report)`` that ``mgx-graph generate FOLDER --target ref [--fp16]`` prints."""
    from mgx_graph.cli.main import main

    argv = ["generate", str(folder), "--target", "ref", "--no-stream", "--max-new-tokens", str(n),
            "--prompt", PROMPT, *(["--hip-graph"] if graphs else []), *(["--fp16"] if fp16 else [])]
    for e in eos_ids:
        argv += ["--eos-id", str(e)]
    capsys.readouterr()
    assert main(argv) == 0
    out = capsys.readouterr().out
    text, sep, report = out.partition("\n--- ")
    assert sep, out
    return text, report
