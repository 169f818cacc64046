"""The graph counters: the one definition of every event count a program reports in ``stats()``.

A ``graph_launch`` region counts its events in a :class:`GraphCounters`; an executor sums those of
its regions, a dynamic-shape program those of its specializations (plus the ones it released), and
both build the counter part of ``stats()`` from the sum, so static and dynamic programs report the
same keys from the same type.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields


def _region_only():
    """A counter reported per region only (``stats()["regions"][i]``), not in the program totals."""
    return field(default=0, metadata={"region_only": True})


@dataclass
class GraphCounters:
    """Event counts of graph regions (non-negative ints; calls, not milliseconds).

    warmups: eager calls before a key's capture (per queue).
    captures: graph execs instantiated.
    replays: calls served by one graph launch.
    fallbacks: captures that failed (the call ran eagerly).
    eager_runs: calls that ran the region's body eagerly, for any reason (warmups included).
    updates: execs updated in place with a new key's graph (``hipGraphExecUpdate``).
    evictions: execs dropped (LRU, a refused update, the byte cap).
    refreshes: execs replaced because they were updated too often (per region only).
    validations: replays compared with an eager run (validation mode).
    validation_mismatches: comparisons that differed (the key is then disabled).
    disabled: keys switched off because their replay was slower than eager (per region only).
    """

    warmups: int = 0
    captures: int = 0
    replays: int = 0
    fallbacks: int = 0
    eager_runs: int = 0
    updates: int = 0
    evictions: int = 0
    refreshes: int = _region_only()
    validations: int = 0
    validation_mismatches: int = 0
    disabled: int = _region_only()

    @classmethod
    def program_keys(cls) -> tuple[str, ...]:
        """Names of the counters a program's ``stats()`` reports (summed over its regions)."""
        return tuple(f.name for f in fields(cls) if not f.metadata.get("region_only"))

    @classmethod
    def total(cls, parts) -> "GraphCounters":
        """The sum of an iterable of counters."""
        out = cls()
        for p in parts:
            out.add(p)
        return out

    def add(self, other: "GraphCounters") -> None:
        """Add ``other``'s counts to these, in place."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def copy(self) -> "GraphCounters":
        return GraphCounters(**self.region_dict())

    def region_dict(self) -> dict[str, int]:
        """Every counter, as ``{name: count}`` (a region's ``stats()``)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def program_dict(self) -> dict[str, int]:
        """The program-level counters (:meth:`program_keys`), as ``{name: count}``."""
        return {k: getattr(self, k) for k in self.program_keys()}
