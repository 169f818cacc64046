"""Types of the native replay (cpp/replay.c); the replay path in C, armed by mgx_graph/graph/replay.py."""
from typing import Any

class Replay:
    """One armed replay, built from positional arguments only: ``Replay(launch, capturing, current_device,
    exec, stream, device, queue_owner, locks, names, values, layouts, writeable, attrs, items, counts,
    sets, returns, env)``.  Called with a run's parameters, it replays the graph in one C call and returns
    the outputs, or None when a check fails (the Python path then runs)."""

    @property
    def hits(self) -> int: ...
    def __new__(cls, *args: Any) -> Replay: ...
    def __call__(self, params: Any, queue: Any = ..., copy: Any = ...) -> list | None: ...
