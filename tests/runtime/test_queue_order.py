"""The program's queue against the caller's default stream (gpu).

A caller fills an input with CuPy (or PyTorch) on the legacy default stream and calls ``run_async``
without a queue, then reads an output there: the program's queue is created blocking
(``hipStreamDefault``), so both orders hold without a synchronization by the caller.  Each side is made
slow on purpose (a kernel that spins ~50 ms before it writes), so a queue that did not wait would read
the input before its fill, or the caller would read the output before the program wrote it; the values
are checked against numpy.  Source: CUDA runtime API, "Stream synchronization behavior" (the legacy
default stream waits for, and is waited for by, every blocking stream of its context).

Captures are not recorded on the blocking queue (which would tie every legacy-stream use in the process
to the capture) but on a private non-blocking one: ``tests/graph/test_capture_queues.py``."""
import numpy as np

from test_host_fast_path import ALIAS, R, _compile, _host, f, step_model

SPIN = r"""
extern "C" __global__ void spin_then_copy(const float* src, float* dst, int n, long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
    for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}
"""
CYCLES = 100_000_000  # ~50 ms at the H200's 1.98 GHz


def _spin_copy(cupy, src, dst, stream):
    """``dst[:] = src`` on ``stream``, after the kernel spun for :data:`CYCLES` clocks."""
    kernel = cupy.RawKernel(SPIN, "spin_then_copy")
    with stream:
        kernel((1,), (32,), (src, dst, np.int32(src.size), np.int64(CYCLES)))


def test_gpu_input_filled_on_the_default_stream_is_read_after_its_fill(gpu_target):
    import cupy

    prog = _compile(step_model(), gpu_target, alias=ALIAS)
    x, state = cupy.zeros((2, 3), np.float32), cupy.zeros((2, 3), np.float32)
    cupy.cuda.Stream.null.synchronize()
    want = np.zeros((2, 3), np.float32)
    for n in range(7):  # warmup, capture, replays (the replay plan, the native replay)
        xh = R.normal(size=(2, 3)).astype(np.float32)
        src = cupy.asarray(xh)
        cupy.cuda.Stream.null.synchronize()
        _spin_copy(cupy, src, x, cupy.cuda.Stream.null)  # the caller's late fill
        y, _ = prog.run_async({"x": x, "state_in": state})
        want = want + xh
        np.testing.assert_allclose(_host(prog, y), f(want), rtol=1e-5, atol=1e-6, err_msg=f"call {n}")
    assert prog.stats()["replays"] >= 3
    prog.release()


def test_gpu_output_read_on_the_default_stream_waits_for_the_run(gpu_target):
    import cupy

    prog = _compile(step_model(), gpu_target, alias=ALIAS)
    x, state = cupy.zeros((2, 3), np.float32), cupy.zeros((2, 3), np.float32)
    busy = cupy.zeros((2, 3), np.float32)
    queue = cupy.cuda.ExternalStream(prog.queue)
    want = np.zeros((2, 3), np.float32)
    for n in range(7):
        xh = R.normal(size=(2, 3)).astype(np.float32)
        prog.context.synchronize(prog.queue)
        x.set(xh, stream=queue)
        _spin_copy(cupy, busy, busy, queue)  # the program's queue is busy when run_async returns
        y, _ = prog.run_async({"x": x, "state_in": state})
        want = want + xh
        got = y.get(stream=cupy.cuda.Stream.null)  # the caller's read, on its default stream
        np.testing.assert_allclose(got, f(want), rtol=1e-5, atol=1e-6, err_msg=f"call {n}")
    assert prog.stats()["replays"] >= 3
    prog.release()
