"""transformers' greedy tokens of a built model, computed once per test run and shared by the test files
(and the pytest-xdist workers) that compare with the same oracle: the real SmolLM2's chat prompt is checked
against transformers in tests/models/test_smollm2.py, tests/operators/test_gemv_decode.py and
tests/passes/test_merge_dots.py, and each load of the torch model from the GGUF takes about 20 s on a CPU.

The tokens are those of :func:`mgx_graph.models.oracle.hf_greedy_tokens`, kept in a JSON file of the run's
shared folder (the ``run_shared`` fixture of conftest.py) under a lock, so the first caller computes them and
the others read them."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def hf_greedy_tokens_once(info, prompt_ids, max_new_tokens: int, shared: str | os.PathLike) -> list[int]:
    """:func:`~mgx_graph.models.oracle.hf_greedy_tokens` of ``info`` (a built model), computed by the first
    caller of the run for these arguments and read back from ``shared`` by the later ones."""
    from mgx_graph.models.cache import cache_lock
    from mgx_graph.models.oracle import hf_greedy_tokens

    ids = [int(t) for t in prompt_ids]
    what = json.dumps([str(Path(info.directory).resolve()), ids, int(max_new_tokens)])
    key = "hf-greedy-" + hashlib.sha256(what.encode()).hexdigest()[:16]
    path = Path(shared) / f"{key}.json"
    with cache_lock(Path(shared), key):
        if path.is_file():
            saved = json.loads(path.read_text())
            assert saved["what"] == what, (saved["what"], what)
            return [int(t) for t in saved["tokens"]]
        tokens = hf_greedy_tokens(info, ids, max_new_tokens)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"what": what, "tokens": tokens}))
        tmp.replace(path)
        return list(tokens)
