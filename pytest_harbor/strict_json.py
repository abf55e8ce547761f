"""JSON as every results file is written: strict (no NaN or Infinity, which most readers
refuse), whatever odd number a verifier, an agent or a model endpoint handed over."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable
from typing import Any

__all__ = ["as_float", "dumps", "finite", "mean"]

#: An integer of more bits than this is beyond the largest float (about 1.8e308).
_FLOAT_BITS = sys.float_info.max_exp


def finite(value: Any) -> Any:
    """`value` with every float that is not finite (NaN, infinities) and every integer
    too large for a float replaced by None, in dicts, lists and tuples at any depth. Two
    token counts of 4,300 digits an agent wrote add up to one that json.dumps refuses to
    write (Python's integer-string limit)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, int) and value.bit_length() > _FLOAT_BITS:
        return None
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


def mean(values: Iterable[float]) -> float:
    """The mean of `values` (at least one), finite whenever they all are: two rewards of
    1e308 average 1e308, where their sum overflows. Exact (math.fsum) when the sum is
    finite; otherwise each value is divided first."""
    numbers = list(values)
    if not numbers:
        raise ValueError("the mean of no values")
    count = len(numbers)
    if not all(math.isfinite(number) for number in numbers):
        return sum(numbers) / count
    total = _fsum(numbers)
    if math.isfinite(total):
        return total / count
    # Each share is at most the largest value, and so is their sum, but for rounding
    # (plain addition: the exact sum of rounded shares may lie past the largest float,
    # where math.fsum raises, and the rounding is what the clamp below is for).
    average = sum(number / count for number in numbers)
    return max(-sys.float_info.max, min(sys.float_info.max, average))


def _fsum(numbers: Iterable[float]) -> float:
    """math.fsum(), infinite where it raises on an intermediate overflow."""
    try:
        return math.fsum(numbers)
    except OverflowError:
        return math.inf


def dumps(value: Any, **options: Any) -> str:
    """json.dumps() of `value` with non-finite floats written as null."""
    return json.dumps(finite(value), allow_nan=False, **options)
