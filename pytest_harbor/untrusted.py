"""JSON from a sandbox (or from a file a sandbox wrote into): read whatever it holds, a
value or the reason there is none, never an exception."""

from __future__ import annotations

import json
import math
import re
from typing import Any, Literal, NamedTuple

__all__ = ["MAX_DEPTH", "Parsed", "load_json"]

#: The deepest nesting of arrays and objects read. json.loads recurses once per level, and
#: so does every walk over what it returns (strict_json.finite, the redactor, pydantic):
#: 3,000 levels (6 KB of text) exhaust Python's stack. No reward, trajectory or results
#: row nests anywhere near 100.
MAX_DEPTH = 100

#: A JSON string (whole, with its escapes) or a bracket outside strings. Possessive, so a
#: long string is one step of the regular-expression engine, not a backtracking search.
_TOKENS = re.compile(r'"(?:[^"\\]++|\\.)*+"|[\[\]{}]', re.DOTALL)
_SURROGATES = re.compile("[\ud800-\udfff]")


class Parsed(NamedTuple):
    """What `load_json` read: the value (None on failure), or why there is none."""

    value: Any
    error: str | None = None


def load_json(
    data: bytes | str,
    *,
    limit_bytes: int | None = None,
    max_depth: int = MAX_DEPTH,
    constants: Literal["float", "null"] = "float",
) -> Parsed:
    """The JSON value of `data`, or a short reason it has none. Never raises.

    - Bytes are decoded as JSON's own encoding detection says (a UTF-8 BOM is skipped),
      bytes that do not decode become U+FFFD; a BOM at the start of text is skipped too.
    - Text longer than `limit_bytes` (in bytes when given bytes) is refused unread.
    - Nesting deeper than `max_depth` is refused before json parses anything.
    - `NaN`, `Infinity` and `-Infinity`, which are not JSON, read as Python reads them
      (floats the caller judges as any number that is not finite), or as None
      (`constants="null"`).
    - An integer longer than Python's digit limit (4,300) reads as an infinite float, as
      `1e400` does, where int() would raise.
    - Lone surrogates (`"\\ud800"`, which no file can be written with) become U+FFFD.
    """
    try:
        if limit_bytes is not None and len(data) > limit_bytes:
            return Parsed(None, f"is larger than {limit_bytes} bytes ({len(data)})")
        text = _decoded(data)
        depth = _depth(text)
        if depth > max_depth:
            return Parsed(None, f"nests arrays or objects deeper than {max_depth} levels")
        if constants == "null":
            value = json.loads(text, parse_int=_integer, parse_constant=_null)
        else:
            value = json.loads(text, parse_int=_integer)
    except (ValueError, RecursionError, MemoryError) as error:
        return Parsed(None, f"is not valid JSON: {_short(error)}")
    return Parsed(_without_surrogates(value))


def _decoded(data: bytes | str) -> str:
    if isinstance(data, str):
        return data.removeprefix("\ufeff")
    return data.decode(json.detect_encoding(data), errors="replace").removeprefix("\ufeff")


def _depth(text: str) -> int:
    """The deepest nesting of brackets outside strings: as deep as json can go in `text`
    (for text json accepts, exactly that; json stops at the first error otherwise)."""
    depth = deepest = 0
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif token in "]}":
            depth -= 1
    return deepest


def _integer(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:  # more digits than int() reads (sys.get_int_max_str_digits)
        return -math.inf if text.startswith("-") else math.inf


def _null(_: str) -> None:
    return None


def _without_surrogates(value: Any) -> Any:
    """`value` with lone surrogates in strings and keys replaced (the depth is bounded)."""
    if isinstance(value, str):
        return _SURROGATES.sub("\ufffd", value) if not value.isascii() else value
    if isinstance(value, dict):
        return {_without_surrogates(key): _without_surrogates(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_without_surrogates(item) for item in value]
    return value


def _short(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return text if len(text) <= 200 else text[:200] + "..."
