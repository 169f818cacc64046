"""``CallRecord.matches`` against the expression it replaced (one ``and`` of the four checks), over records of
host values only, device values only and both, with each kind of change the module docstring lists."""
import itertools
from operator import is_

import numpy as np
import pytest

from mgx_graph.graph.replay import _LAYOUT, _SHAPE, _WRITEABLE, CallRecord


class _Device:
    """A device array stand-in: any value that is not a numpy array is compared by its shape alone."""

    def __init__(self, shape):
        self.shape = shape


def _old_matches(rec, params, queue, copy):
    if queue != rec.queue or bool(copy) != rec.copy or type(params) is not dict or len(params) != rec.n:
        return False
    try:
        values = rec.getter(params)
    except KeyError:
        return False
    return (all(map(is_, values, rec.values)) and list(map(_SHAPE, rec.device)) == rec.shapes
            and list(map(_LAYOUT, rec.host)) == rec.layouts and all(map(_WRITEABLE, rec.writeable)))


def _values(kinds):
    return [np.zeros((2, 4), np.float32) if k == "host" else _Device((2, 4)) for k in kinds]


CHANGES = ["none", "other_object", "reshape_host", "strides_host", "dtype_host", "read_only", "reshape_device",
           "missing", "extra", "queue", "copy", "not_dict"]


@pytest.mark.filterwarnings("ignore:Setting the strides:DeprecationWarning")
@pytest.mark.parametrize("kinds", [("host",), ("device",), ("host", "host"), ("device", "device", "device"),
                                   ("host", "device"), ("device", "host", "device")])
@pytest.mark.parametrize("written", [False, True])
def test_matches_is_the_old_expression(kinds, written):
    names = [f"p{i}" for i in range(len(kinds))]
    for change, k in itertools.product(CHANGES, range(len(kinds))):
        values = _values(kinds)
        rec = CallRecord(names, values, 3, False, set(names) if written else set(), [], [])
        params, queue, copy = dict(zip(names, values)), 3, False
        v = values[k]
        host = isinstance(v, np.ndarray)
        if change == "other_object":
            params[names[k]] = _values(kinds[k:k + 1])[0]
        elif change == "reshape_host" and host:
            v.shape = (4, 2)
        elif change == "strides_host" and host:
            v.strides = (0, 4)
        elif change == "dtype_host" and host:
            v.dtype = np.int32
        elif change == "read_only" and host:
            v.flags.writeable = False
        elif change == "reshape_device" and not host:
            v.shape = (8,)
        elif change == "missing":
            del params[names[k]]
        elif change == "extra":
            params["other"] = v
        elif change == "queue":
            queue = 4
        elif change == "copy":
            copy = True
        elif change == "not_dict":
            params = list(params.items())
        got, want = rec.matches(params, queue, copy), _old_matches(rec, params, queue, copy)
        assert got is want, f"{kinds} written={written} change={change} at {k}: {got} vs {want}"
        if change == "none":
            assert got is True
