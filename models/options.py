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
