"""Real models from the PyPI package silero-vad (voice activity detection): streaming 30 chunks with
the recurrent state fed back, against onnxruntime CPU, on every target, eager and with graphs."""
import numpy as np
import pytest

import mgx_graph
from mgx_graph.models.pypi import SILERO_MODELS, SILERO_STREAM_ATOL, silero_stream

CHUNKS = 30


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("name", sorted(SILERO_MODELS))
def test_silero_streaming_matches_onnxruntime(silero, name, target, hip_graph):
    n, has_sr = SILERO_MODELS[name]
    path = silero(name)
    dims = {"input": [1, n], "state": [2, 1, 128]} if has_sr else None
    prog = mgx_graph.compile(path, target=target, hip_graph=hip_graph, input_dims=dims)
    errs = silero_stream(path, prog.run, CHUNKS)
    # the fed-back state holds float32 LSTM cell values: 30 chunks of recurrence reach ~1e-4 (SILERO_STREAM_ATOL)
    assert len(errs) == CHUNKS and max(errs) < SILERO_STREAM_ATOL, errs
    st = prog.stats()
    assert st["fallbacks"] == 0
    if hip_graph:
        # every region warms up twice, captures once, then replays on every later chunk
        assert st["captures"] >= 1 and st["replays"] == st["captures"] * (CHUNKS - 3)
