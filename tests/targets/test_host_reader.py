"""``HostReader`` (mgx_graph/targets/host_reader.py) over a stand-in runtime on the host: page-locked
buffers are ctypes buffers whose "device address" is their host address, events are no-ops, and the
context records which queue is current.  Checks the bookkeeping the gpu target relies on: at most
``depth`` read-backs pending, a writer that raises leaves nothing pending, ``start_written`` runs its
writer with the read-back's queue current, and ``wait`` returns the buffers in start order."""
import contextlib
import ctypes

import numpy as np
import pytest

from mgx_graph.errors import ParameterError
from mgx_graph.targets.host_reader import HostReader


class _Runtime:
    def __init__(self):
        self.bufs, self.calls, self.waits = {}, [], []

    def hipHostMalloc(self, nbytes):
        buf = (ctypes.c_byte * nbytes)()
        self.bufs[ctypes.addressof(buf)] = buf
        return ctypes.addressof(buf)

    def hipHostGetDevicePointer(self, ptr):
        return ptr

    def hipHostFree(self, ptr):
        del self.bufs[ptr]

    def hipEventCreate(self):
        return object()

    def hipEventRecord(self, ev, queue):
        self.calls.append(("record", queue))

    def hipEventSynchronize(self, ev):
        self.waits.append("synchronize")

    def hipEventQuery(self, ev):
        self.waits.append("query")
        return self.waits.count("query") % 3 == 0  # done at every third query

    def hipEventDestroy(self, ev):
        pass

    def hipMemcpyDtoHAsync(self, dst, src, nbytes, queue):
        ctypes.memmove(dst, src, nbytes)
        self.calls.append(("copy", queue))


class _Context:
    def __init__(self):
        self.runtime, self.current = _Runtime(), None

    def on_device(self):
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def on_queue(self, queue):
        outer, self.current = self.current, queue
        try:
            yield
        finally:
            self.current = outer

    @staticmethod
    def data_ptr(arr):
        return arr.__array_interface__["data"][0]


def _writer(ctx, value, seen):
    def write(address):
        seen.append(ctx.current)
        np.frombuffer((ctypes.c_byte * 8).from_address(address), np.int64)[0] = value
    return write


def test_written_read_backs_come_back_in_order_and_the_writer_runs_on_the_queue():
    ctx, seen = _Context(), []
    r = HostReader(ctx, (1, 1), np.int64)
    r.start_written(_writer(ctx, 11, seen), 7)
    r.start(np.full((1, 1), 12, np.int64), 7)
    assert seen == [7] and ctx.current is None  # the writer saw queue 7 current, restored after
    assert [int(r.wait()[0, 0]), int(r.wait()[0, 0])] == [11, 12]
    assert ctx.runtime.calls == [("record", 7), ("copy", 7), ("record", 7)]
    r.close()
    assert not ctx.runtime.bufs


def test_more_starts_than_depth_and_a_wait_with_none_pending_are_typed_errors():
    ctx = _Context()
    r = HostReader(ctx, (1, 1), np.int64, depth=2)
    with pytest.raises(ParameterError, match="no read-back pending"):
        r.wait()
    r.start_written(_writer(ctx, 1, []), 0)
    r.start(np.zeros((1, 1), np.int64), 0)
    for start in (lambda: r.start_written(_writer(ctx, 3, []), 0), lambda: r.start(np.zeros((1, 1), np.int64), 0)):
        with pytest.raises(ParameterError, match="2 read-backs pending"):
            start()
    assert len(r.pending) == 2
    assert int(r.wait()[0, 0]) == 1
    r.start_written(_writer(ctx, 4, []), 0)  # a buffer is free again
    assert [int(r.wait()[0, 0]), int(r.wait()[0, 0])] == [0, 4]


def test_a_writer_that_raises_leaves_nothing_pending_and_the_same_buffer_next():
    ctx = _Context()
    r = HostReader(ctx, (1, 1), np.int64)

    def bad(address):
        raise ValueError("no kernel")

    with pytest.raises(ValueError, match="no kernel"):
        r.start_written(bad, 0)
    assert not r.pending and r.next == 0 and ctx.current is None and not ctx.runtime.calls
    with pytest.raises(ParameterError, match="C-contiguous"):
        r.start(np.zeros((1, 2), np.int64), 0)
    assert not r.pending and r.next == 0
    r.start_written(_writer(ctx, 9, []), 0)
    assert r.pending[0] == 0 and int(r.wait()[0, 0]) == 9


def test_a_platform_without_mapped_page_locked_memory_keeps_the_copy_read_back():
    """``hipHostGetDevicePointer`` failing (no mapped page-locked memory): the reader is made, copies still
    read back, ``kernel_writable`` is False and ``start_written`` is a ParameterError with nothing pending."""
    from mgx_graph.errors import DeviceError

    ctx = _Context()

    def unmapped(ptr):
        raise DeviceError("hipHostGetDevicePointer", "hipErrorNotSupported")

    ctx.runtime.hipHostGetDevicePointer = unmapped
    r = HostReader(ctx, (1, 1), np.int64)
    assert not r.kernel_writable
    with pytest.raises(ParameterError, match="no device address"):
        r.start_written(_writer(ctx, 5, []), 0)
    assert not r.pending
    r.start(np.full((1, 1), 6, np.int64), 0)
    assert int(r.wait()[0, 0]) == 6


@pytest.mark.parametrize("poll", [False, True])
def test_wait_polls_the_event_until_it_completes_or_synchronizes_on_it(poll):
    """``poll=True`` (``MIGRAPHX_HOST_READER_POLL``): ``wait`` queries the event until it reports done and
    never blocks in ``hipEventSynchronize``; ``poll=False``: one ``hipEventSynchronize``, no query.  The
    values come back either way."""
    ctx = _Context()
    r = HostReader(ctx, (1, 1), np.int64, poll=poll)
    r.start(np.full((1, 1), 21, np.int64), 3)
    assert int(r.wait()[0, 0]) == 21
    assert ctx.runtime.waits == (["query"] * 3 if poll else ["synchronize"])


def test_poll_setting_reads_the_environment(monkeypatch):
    from mgx_graph import env
    from mgx_graph.targets.host_reader import poll_setting

    for value, want in (("1", True), ("0", False), (None, False)):
        env._reset_for_tests()
        if value is None:
            monkeypatch.delenv("MIGRAPHX_HOST_READER_POLL", raising=False)
        else:
            monkeypatch.setenv("MIGRAPHX_HOST_READER_POLL", value)
        assert poll_setting() is want
        assert HostReader(_Context(), (1,), np.int64).poll is want
    env._reset_for_tests()


@pytest.mark.parametrize("poll", [False, True])
@pytest.mark.gpu
def test_gpu_read_backs_wait_for_their_event_polled_or_blocking(gpu_target, poll):
    """On the gpu: read-backs queued behind a long matmul come back with the values numpy computes,
    polled (``hipEventQuery``) or blocking; the event reports done afterwards."""
    from mgx_graph.targets import make_context

    ctx = make_context("gpu")
    xp = ctx.xp
    r = HostReader(ctx, (4,), np.float32, poll=poll)
    a = np.random.default_rng(3).standard_normal((512, 512)).astype(np.float32)
    with ctx.on_queue(ctx.queue):
        d = xp.asarray(a)
        for k in range(3):
            d = d @ d / 512.0  # device work the copy queues behind
            want = d[0, :4]
            r.start(xp.ascontiguousarray(want), ctx.queue)
            got = r.wait()
            np.testing.assert_allclose(got, want.get(), rtol=1e-6)
            assert ctx.runtime.hipEventQuery(r.events[(r.next - 1) % r.depth])
    r.close()


@pytest.mark.parametrize("poll", [False, True])
def test_close_with_a_read_back_pending_waits_for_it_and_a_later_start_is_a_parameter_error(poll):
    """``close()`` while a start is pending synchronizes on its event before freeing; afterwards
    ``start`` / ``start_written`` / ``wait`` are ParameterErrors (not an IndexError), and ``close`` again
    does nothing."""
    ctx = _Context()
    r = HostReader(ctx, (1, 1), np.int64, poll=poll)
    r.start(np.full((1, 1), 4, np.int64), 0)
    r.close()
    assert ctx.runtime.waits == ["synchronize"] * r.depth and not r.pending and not ctx.runtime.bufs
    with pytest.raises(ParameterError, match="closed"):
        r.start(np.full((1, 1), 5, np.int64), 0)
    with pytest.raises(ParameterError, match="closed"):
        r.start_written(lambda address: None, 0)
    with pytest.raises(ParameterError, match="no read-back pending"):
        r.wait()
    r.close()
