"""Fuzz: mutated ONNX models (protobuf bytes, and structure: attributes, shapes, dtypes, op types, names,
initializers, opsets) compiled for ``ref`` and run on random inputs.  mgx_graph must raise an MgxError
or give onnxruntime CPU's outputs; where onnxruntime refuses the model, mgx_graph refuses it too; each case
runs under a memory cap (fuzz_oracle.py).  Derandomized: the same cases every run."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fuzz_mutate import STRUCTURE, mutate_bytes
from fuzz_oracle import check_model, describe, run_mgx, run_ort, differ
from fuzz_seeds import SEEDS, make_feeds, seed

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::RuntimeWarning")
FUZZ = settings(derandomize=True, deadline=None, database=None, print_blob=False,
                suppress_health_check=list(HealthCheck))
SEED_BYTES = {k: seed(k).SerializeToString() for k in SEEDS}


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_seed_matches_onnxruntime(name):
    """The unmutated seeds compile, run and equal onnxruntime (else every mutation below tests nothing)."""
    feeds = make_feeds(seed(name), np.random.default_rng(0))
    state, theirs = run_ort(SEED_BYTES[name], feeds)
    assert state == "ok", theirs
    state, ours = run_mgx(SEED_BYTES[name], feeds)
    assert state == "ok", ours
    assert differ(ours, theirs) is None


def _feeds(data: bytes, rng_seed: int):
    try:
        m = onnx.load_from_string(data)
    except Exception:  # noqa: BLE001  (not a protobuf any more: compile only)
        return None
    return make_feeds(m, np.random.default_rng(rng_seed))


@settings(FUZZ, max_examples=700)
@given(data=st.data(), name=st.sampled_from(sorted(SEEDS)), rng_seed=st.integers(0, 2 ** 16))
def test_fuzz_onnx_bytes(data, name, rng_seed):
    mutated, steps = mutate_bytes(data.draw, SEED_BYTES[name])
    check_model(mutated, _feeds(mutated, rng_seed), "onnx-bytes", f"seed {name}: {steps}")


@settings(FUZZ, max_examples=1000)
@given(data=st.data(), name=st.sampled_from(sorted(SEEDS)), rng_seed=st.integers(0, 2 ** 16),
       kinds=st.lists(st.sampled_from(sorted(STRUCTURE)), min_size=1, max_size=3))
def test_fuzz_onnx_structure(data, name, rng_seed, kinds):
    m = seed(name)
    steps = [STRUCTURE[k](data.draw, m) for k in kinds]
    try:
        mutated = m.SerializeToString()
    except Exception:  # noqa: BLE001  (protobuf refuses to write it: nothing to load)
        return
    case = f"seed {name}: {'; '.join(steps)}\n{describe(mutated)}"
    check_model(mutated, make_feeds(m, np.random.default_rng(rng_seed)), "onnx-structure", case)
