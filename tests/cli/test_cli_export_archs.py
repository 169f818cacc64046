"""`mgx-graph export` of tiny random checkpoints of more architectures (bench/tiny_checkpoint.py), each run
by mgx_graph.llm.LLM on ref to onnxruntime-genai's greedy tokens on the same folder: Mistral, Qwen2 / 3, Phi,
Phi-3, Gemma, Gemma 2. The export tests are split over files so that pytest-xdist's workers share them."""
from __future__ import annotations

import pytest

from test_cli_export import export_matches_genai, needs_builder


@needs_builder
@pytest.mark.slow
@pytest.mark.parametrize("arch", ["mistral", "qwen2", "qwen3", "phi", "phi3", "gemma", "gemma2"])
def test_architecture_runs_to_onnxruntime_genai_greedy_tokens(tmp_path, capsys, arch):
    export_matches_genai(tmp_path, capsys, arch)
