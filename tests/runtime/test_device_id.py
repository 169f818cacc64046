"""``compile(..., device_id=N)``: the program's context, queue and memory on device N; typed errors for
an id the target does not have (ref: only 0; gpu: 0..count-1), before anything is parsed or allocated."""
import numpy as np
import pytest

import mgx_graph
from mgx_graph.runtime import host_runtime
from test_graph_launch import chain_model
from util import ort_run

X = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)


def test_ref_runs_on_device_0_only():
    model = chain_model(5)
    prog = mgx_graph.compile(model, target="ref", device_id=0)
    assert prog.device_id == 0 and prog.options["device_id"] == 0
    np.testing.assert_allclose(prog.run({"x": X})[0], ort_run(model, {"x": X})[0], rtol=1e-6, atol=1e-6)
    assert mgx_graph.compile(model, target="ref").device_id == 0


@pytest.mark.parametrize("bad, msg", [(1, r"device_id 1: the ref target runs on the host, its only device is 0"),
                                      (-1, r"device_id -1: the ref target runs on the host"),
                                      ("0", r"device_id must be an int, got str '0'"),
                                      (True, r"device_id must be an int, got bool True"),
                                      (0.0, r"device_id must be an int, got float 0\.0")])
def test_ref_refuses_other_device_ids_before_allocating(bad, msg):
    before = host_runtime().counters()
    for compile_it in (lambda: mgx_graph.compile(chain_model(5), target="ref", device_id=bad),
                       lambda: mgx_graph.parse_onnx(chain_model(5)).compile("ref", device_id=bad)):
        with pytest.raises(mgx_graph.CompileError, match=msg):
            compile_it()
    after = host_runtime().counters()
    assert (after["allocations"], after["live_queues"]) == (before["allocations"], before["live_queues"])


@pytest.mark.gpu
def test_gpu_device_0_explicitly(gpu_target, unfused):
    from mgx_graph.runtime import device_runtime

    rt = device_runtime()
    current = rt.hipGetDevice()
    model = chain_model(9)
    prog = mgx_graph.compile(model, target=gpu_target, hip_graph=True, device_id=0)
    assert prog.device_id == 0 and prog.context.device_id == 0
    x = prog.context.xp.asarray(X)  # one device array: the same pointer every call, so the graph replays
    for _ in range(4):
        outs = prog.run_async({"x": x})
    assert outs[0].device.id == 0 and prog.param_buffer("x").device.id == 0
    np.testing.assert_allclose(prog.context.to_host(outs[0], prog.queue), ort_run(model, {"x": X})[0], rtol=1e-5,
                               atol=1e-6)
    assert prog.stats()["replays"] >= 1
    assert rt.hipGetDevice() == current  # compile and runs leave the caller's device current
    prog.release()


@pytest.mark.gpu
def test_gpu_device_id_out_of_range_names_the_count(gpu_target):
    from mgx_graph.runtime import device_runtime

    n = device_runtime().hipGetDeviceCount()
    for bad in (n, n + 3, -1):
        with pytest.raises(mgx_graph.DeviceError, match=rf"device_id {bad} is out of range: the machine has {n} GPU "
                                                          rf"device\(s\), ids 0\.\.{n - 1}") as e:
            mgx_graph.compile(chain_model(5), target=gpu_target, device_id=bad)
        assert e.value.code == "hipErrorInvalidDevice"
