"""What every runtime backend shares: the :class:`Runtime` interface with HIP names, its constants, and
the helpers that turn a vendor error into a :class:`~mgx_graph.errors.DeviceError`.  The backends
(``_cuda``, ``_hip``, ``_host``) import this module; :mod:`mgx_graph.runtime` picks one."""
from __future__ import annotations

import threading
from collections import OrderedDict

from ..errors import DeviceError

# constants shared by all backends (same numeric values in CUDA and HIP)
hipStreamCaptureModeGlobal = 0
hipStreamCaptureModeThreadLocal = 1
hipStreamCaptureModeRelaxed = 2
hipStreamCaptureStatusNone = 0
hipStreamCaptureStatusActive = 1
hipStreamCaptureStatusInvalidated = 2
# hipStreamCreate's flags (cudaStreamDefault / hipStreamDefault): a blocking queue, ordered with the legacy
# default stream both ways, so that work a caller queued there (CuPy's and PyTorch's default stream: an
# input's fill or upload, a read of an output) is not raced by the program's queue
hipStreamDefault = 0
# a queue not ordered with the legacy default stream (cudaStreamNonBlocking / hipStreamNonBlocking): the
# private queue captures record on (see GraphLaunchState), so that another thread's use of the legacy
# stream during a capture neither fails nor spoils it
hipStreamNonBlocking = 1

CAPTURE_MODES = {"global": 0, "thread_local": 1, "relaxed": 2}
DEAD_KEPT = 4096  # destroyed queue handles remembered (see Runtime.queue_alive)


class Runtime:
    """Interface every backend implements (HIP names, results returned, errors raised).

    The base class also keeps the books every backend shares: bytes allocated through ``hipMalloc``,
    queues created through ``hipStreamCreate`` and not yet destroyed (:meth:`counters`), and releases
    held back while a capture is open on a queue they depend on (:meth:`release_after_capture`).
    """

    platform = "?"
    has_graph_node_count = True

    def __init__(self):
        self._books = threading.Lock()
        self._sizes: dict[int, int] = {}
        self._queues: set[int] = set()
        self._dead: OrderedDict = OrderedDict()  # queues destroyed through this runtime (the latest DEAD_KEPT)
        self._held: list = []
        self._capture_queues: set[int] = set()  # queues with a capture begun through this runtime, maybe open
        self._device_query = None  # what current_device() calls (chosen at its first call)
        self._cupy_module = None  # cupy_runtime(): None until looked up, then the module or False

    def __repr__(self):
        return f"<mgx_graph runtime '{self.platform}'>"

    # -- the current device ----------------------------------------------------------------------
    def current_device(self) -> int:
        """The calling thread's current device (what ``hipGetDevice`` returns), asked through the
        cheapest binding present: CuPy's runtime module when CuPy is built for this platform (one C
        call returning a plain int: no result tuple, no error enum), else :meth:`hipGetDevice`.  Both
        read the same driver state (the context current on the thread), so a device the caller made
        current in any way between two calls is seen.  Raises DeviceError (``hipGetDevice``) or
        CuPy's runtime error when the query fails."""
        return self.device_query()()

    def device_query(self):
        """The function :meth:`current_device` calls (chosen at the first call, then the same): what a
        per-call check holds to skip a layer of calls."""
        query = self._device_query
        if query is None:
            query = self._device_query = self._cheapest_device_query()
        return query

    def _cheapest_device_query(self):
        fast = self.cupy_runtime()
        return fast.getDevice if fast is not None else self.hipGetDevice

    def cupy_runtime(self):
        """CuPy's runtime module when CuPy is built for this platform, else None (looked up once).  Its
        functions are one C call each taking and returning plain ints (no result tuple, no error enum to
        build: a microsecond or more less per call than cuda-bindings / hip-python), so the calls every
        replay makes go through it: :meth:`current_device` on both platforms, ``hipGraphLaunch`` and
        ``hipStreamIsCapturing`` on CUDA (HIP keeps hip-python's, whose handles it passes as they are);
        :func:`cupy_call` turns its errors into DeviceError."""
        mod = self._cupy_module
        if mod is None:
            mod = False
            if self.platform in ("cuda", "hip"):
                try:
                    from cupy.cuda import runtime as cupy_runtime

                    if bool(cupy_runtime.is_hip) == (self.platform == "hip"):
                        mod = cupy_runtime
                except Exception:  # no CuPy, or one built for the other platform
                    pass
            self._cupy_module = mod
        return mod or None

    # -- the native replay (mgx_graph.graph.replay) ---------------------------------------------------------
    def native_replay_calls(self):
        """``(launch, capture_status, current_device)``: the C addresses of the three calls of a replay
        that the native replay makes itself (``int f(void *exec, void *stream)``, ``int f(void *stream,
        int *status)``, ``int f(int *device)``, 0 on success: the CUDA driver's ``cuGraphLaunch`` /
        ``cuStreamIsCapturing`` / ``cuCtxGetDevice``, HIP's ``hipGraphLaunch`` / ``hipStreamIsCapturing`` /
        ``hipGetDevice``), or None where the platform has none (the host queue)."""
        return None

    @staticmethod
    def native_handle(handle):
        """The address of graph exec ``handle`` as an int (what the native calls take), or None."""
        try:
            return int(handle)
        except (TypeError, ValueError):
            return None

    # -- books -----------------------------------------------------------------------------------
    def _note_malloc(self, ptr: int, nbytes: int) -> None:
        with self._books:
            self._sizes[int(ptr)] = int(nbytes)

    def _note_free(self, ptr: int) -> None:
        with self._books:
            self._sizes.pop(int(ptr), None)

    def _note_queue(self, s: int, live: bool) -> None:
        s = int(s)
        with self._books:
            if live:
                self._queues.add(s)
                self._dead.pop(s, None)  # a handle the driver hands out again
            else:
                self._queues.discard(s)
                self._capture_queues.discard(s)
                self._dead[s] = None
                if len(self._dead) > DEAD_KEPT:
                    self._dead.popitem(last=False)

    def queue_alive(self, s) -> bool:
        """False for a queue destroyed through this runtime: asking a destroyed CUDA/HIP stream anything
        is undefined, so held releases and teardown skip it.  Queues created elsewhere count as alive
        (their owner keeps them alive while a program that ran on them is not released)."""
        with self._books:
            return int(s) not in self._dead

    def counters(self) -> dict:
        """``allocated_bytes`` / ``allocations``: what ``hipMalloc`` handed out and ``hipFree`` has not
        taken back (bytes as requested, at least 1 per allocation); ``live_queues``: streams created and
        not destroyed; ``held_releases``: program releases waiting for a capture to end."""
        with self._books:
            return {"allocated_bytes": sum(self._sizes.values()), "allocations": len(self._sizes),
                    "live_queues": len(self._queues), "held_releases": len(self._held)}

    # -- programmatic dependent launch ----------------------------------------------------------
    def programmatic_launch_supported(self) -> bool:
        """Whether :meth:`launch_programmatic` can run on the current device (a backend overrides it)."""
        return False

    def capture_begun_on(self, s) -> bool:
        """Whether a capture was begun on queue ``s`` through this runtime and has not been seen to
        end (a set lookup: what a per-launch decision can afford)."""
        return int(s) in self._capture_queues

    def launch_programmatic(self, function: int, grid, block, shared: int, s, args, types) -> None:
        """Launch kernel ``function`` (a driver function handle, int) on queue ``s`` with programmatic
        stream serialization allowed: a dependent launch may begin before the kernel ahead of it in
        ``s`` completes, and the kernel's ``griddepcontrol.wait`` orders its reads after that kernel.
        ``grid`` / ``block``: 3-tuples; ``args`` / ``types``: the parameter values and their ctypes
        types (``ctypes.c_void_p`` for device pointers).  Raises DeviceError where unsupported."""
        raise DeviceError("launch_programmatic", f"{self.platform}: programmatic dependent launch is unsupported")

    def hipStreamIsCapturing(self, s) -> int:
        """The capture status of queue ``s`` (``hipStreamCaptureStatus*``); every backend has its own."""
        raise DeviceError("hipStreamIsCapturing", f"{self.platform}: no capture status")

    def hipHostMalloc(self, nbytes: int) -> int:
        """Page-locked host memory of ``nbytes`` (its address, int): the destination of
        :meth:`hipMemcpyDtoHAsync`.  Raises DeviceError where unsupported."""
        raise DeviceError("hipHostMalloc", f"{self.platform}: no page-locked host memory")

    def hipHostFree(self, ptr: int) -> None:
        raise DeviceError("hipHostFree", f"{self.platform}: no page-locked host memory")

    def hipHostGetDevicePointer(self, ptr: int) -> int:
        """The device address of page-locked host memory ``ptr`` from :meth:`hipHostMalloc` (int): a kernel
        writes the host memory through it (with unified addressing, the same address).  Raises DeviceError
        where unsupported."""
        raise DeviceError("hipHostGetDevicePointer", f"{self.platform}: no page-locked host memory")

    def hipMemcpyDtoHAsync(self, dst: int, src: int, nbytes: int, s) -> None:
        """Queue a copy of ``nbytes`` from device address ``src`` to page-locked host address ``dst``
        on ``s``: it runs after the work queued before it and the host does not wait for it (an event
        recorded after it says when it is done)."""
        raise DeviceError("hipMemcpyDtoHAsync", f"{self.platform}: no asynchronous device-to-host copy")

    # -- releases held back during a capture -----------------------------------------------------
    def _capture_begun(self, s) -> None:
        """Backends call this after a capture began on ``s``."""
        with self._books:
            self._capture_queues.add(int(s))

    def _capture_ended(self, s) -> None:
        """Backends call this after ``hipStreamEndCapture`` on ``s`` (whatever it returned): ``s`` is
        forgotten unless its capture is still open (an end from the wrong thread), then the held
        releases that may run now are made."""
        try:
            still = self.hipStreamIsCapturing(int(s)) != hipStreamCaptureStatusNone
        except DeviceError:
            still = False
        if not still:
            with self._books:
                self._capture_queues.discard(int(s))
        if self._held:
            self.run_held_releases()

    def _blocking(self, queues) -> list[int]:
        """The queues whose open capture a release made now could invalidate: those of ``queues`` and
        every queue with a capture begun through this runtime and not ended.  A release may run on a
        thread that captures a queue the program never used: the garbage collector runs a dropped
        program's release wherever it runs, the capturing thread included, and ``hipFree`` or a sync
        from a thread holding a thread-local or global capture invalidates that capture."""
        with self._books:
            begun = set(self._capture_queues)
        return self.capturing(set(int(q) for q in queues) | begun)

    def capturing(self, queues) -> list[int]:
        """The queues among ``queues`` with a capture open (active or invalidated, not yet ended);
        a queue that no longer exists captures nothing."""
        out = []
        for q in queues:
            if not self.queue_alive(q):
                continue
            try:
                if self.hipStreamIsCapturing(int(q)) != hipStreamCaptureStatusNone:
                    out.append(int(q))
            except DeviceError:
                continue
        return out

    def release_after_capture(self, queues, release) -> bool:
        """Call ``release()`` (frees, stream and handle destruction) now, unless one of ``queues``, or a
        queue with a capture begun through this runtime, has a capture open: ``hipFree`` or a sync then
        would invalidate that capture (CUDA/HIP capture rules), so the call is held and made once none
        of them captures any more (checked when a capture ends through this runtime, or by
        :meth:`run_held_releases`).  Returns True when it ran now."""
        queues = tuple(int(q) for q in queues)
        if not self._blocking(queues):
            release()
            return True
        with self._books:
            self._held.append((queues, release))
        return False

    def run_held_releases(self) -> int:
        """Make the held releases whose queues no longer capture; returns how many stay held."""
        with self._books:
            held, self._held = self._held, []
        keep = []
        for queues, release in held:
            if self._blocking(queues):
                keep.append((queues, release))
                continue
            try:
                release()
            except Exception:  # a release swallows its own failures; never lose the others
                pass
        with self._books:
            self._held = keep + self._held
            return len(self._held)


def cupy_call(call: str, fn, *args):
    """``fn(*args)`` (a function of CuPy's runtime module, :meth:`Runtime.cupy_runtime`) with its error raised
    as DeviceError(``call``) carrying the HIP name of the error (CuPy's message starts with the CUDA / HIP
    name: ``cudaErrorInvalidValue: invalid argument``)."""
    try:
        return fn(*args)
    except Exception as e:  # CuPy's CUDARuntimeError (HIP builds: the same class); anything else as it is
        name = str(e).split(":", 1)[0].strip()
        if not name.startswith(("cuda", "hip")):
            raise
        raise DeviceError(call, "hip" + name[4:] if name.startswith("cuda") else name) from e


def library_calls(libraries, names):
    """The C addresses of functions ``names`` (a tuple of ints) in the first of shared ``libraries`` that
    loads, or None when none loads or it lacks one of them (``ctypes``)."""
    import ctypes

    for lib in libraries:
        try:
            handle = ctypes.CDLL(lib)
        except OSError:
            continue
        try:
            return tuple(int(ctypes.cast(getattr(handle, n), ctypes.c_void_p).value) for n in names)
        except AttributeError:
            return None
    return None


def check(call: str, err, ok_names=("cudaSuccess", "hipSuccess")):
    """Raise DeviceError unless ``err`` (a CUDA/HIP error enum) is success."""
    if int(err) != 0:
        name = getattr(err, "name", str(err))
        if name.startswith("cuda"):
            name = "hip" + name[4:]
        raise DeviceError(call, name)
