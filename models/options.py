"""Option helpers shared by the model builders: defaults, unknown names, integer checks."""

from __future__ import annotations

from typing import Any, Sequence


def fill_options(model: str, options: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``{**defaults, **options}``; raises ``ValueError`` naming any option not in ``defaults``."""
    unknown = set(options) - set(defaults)
    if unknown:
        raise ValueError(f"{model}: unknown option(s) {sorted(unknown)}; known: {sorted(defaults)}")
    return {**defaults, **options}


def require_ints(model: str, opts: dict[str, Any], keys: Sequence[str], minimum: int | None = None) -> None:
    """Check that ``opts[k]`` is an int (bools refused) for each of ``keys``, and ``>= minimum``
    when given; raises ``ValueError``. Normalizes the values to plain ``int`` in place."""
    for key in keys:
        value = opts[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{model}: {key} must be an int, got {value!r}")
        opts[key] = int(value)
        if minimum is not None and opts[key] < minimum:
            raise ValueError(f"{model}: {key} must be >= {minimum}, got {opts[key]}")


#: Options added after the first builds, with the value that means "as before". At that value
#: they are left out of the normalized options (so out of the cache hash and ``model.json``):
#: the builds made before they existed keep their cache folder and read back unchanged.
LATER_OPTIONS: dict[str, Any] = {"batch": 1, "rope_theta": 10000.0}


def omit_later_defaults(opts: dict[str, Any]) -> dict[str, Any]:
    """Drop the :data:`LATER_OPTIONS` entries of ``opts`` that hold their "as before" value (in place);
    returns ``opts``. Readers take such an option as ``opts.get(name, LATER_OPTIONS[name])``."""
    for key, value in LATER_OPTIONS.items():
        if key in opts and opts[key] == value and type(opts[key]) is type(value):
            del opts[key]
    return opts


def require_batch(model: str, opts: dict[str, Any]) -> int:
    """Check the ``batch`` option (rows of the decode step: an int >= 1, bools refused); raises
    ``ValueError``. Returns it and leaves it in ``opts`` only when it is not 1."""
    require_ints(model, opts, ("batch",), minimum=1)
    batch = opts["batch"]
    omit_later_defaults(opts)
    return batch
