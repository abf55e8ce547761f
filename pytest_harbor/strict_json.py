"""JSON as every results file is written: strict (no NaN or Infinity, which most readers
refuse), whatever odd number a verifier, an agent or a model endpoint handed over."""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["as_float", "dumps", "finite"]


def finite(value: Any) -> Any:
    """`value` with every float that is not finite (NaN, infinities) replaced by None, in
    dicts, lists and tuples at any depth."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


def as_float(value: object) -> float | None:
    """A number as a finite float; None for anything else: not a number (booleans are
    not), not finite, or an integer too large for a float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def dumps(value: Any, **options: Any) -> str:
    """json.dumps() of `value` with non-finite floats written as null."""
    return json.dumps(finite(value), allow_nan=False, **options)
