"""JSON from a sandbox (or from a file a sandbox wrote into), and TOML from a task or a
dataset (a stranger's files): read whatever they hold, a value or the reason there is
none, never an exception."""

from __future__ import annotations

import json
import math
import re
import tomllib
from typing import Any, Literal, NamedTuple

__all__ = ["MAX_DEPTH", "MOST_TOML_BYTES", "Parsed", "load_json", "load_toml"]

#: The deepest nesting of arrays and objects read. json.loads recurses once per level, and
#: so does every walk over what it returns (strict_json.finite, the redactor, pydantic):
#: 3,000 levels (6 KB of text) exhaust Python's stack. No reward, trajectory or results
#: row nests anywhere near 100.
MAX_DEPTH = 100

#: A JSON string, whole with its escapes. Possessive, so a long string is one step of the
#: regular-expression engine, not a backtracking search.
_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_NOT_BRACKETS = re.compile(r"[^\[\]{}]++")
_SURROGATES = re.compile("[\ud800-\udfff]")
#: What TOML holds that is not structure: its four kinds of string and its comments.
_TOML_TEXT = re.compile(
    r'"""(?:[^"\\]++|\\.|"(?!""))*+"""'
    r"|'''.*?'''"
    r'|"(?:[^"\\\n]++|\\.)*+"'
    r"|'[^'\n]*+'"
    r"|#[^\n]*+",
    re.DOTALL,
)
#: The largest TOML file read (a task.toml, a dataset.toml): none comes near it.
MOST_TOML_BYTES = 1024 * 1024
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


class Parsed(NamedTuple):
    """What `load_json` read: the value (None on failure), or why there is none."""

    value: Any
    error: str | None = None


def load_json(
    data: bytes | str,
    *,
    max_depth: int = MAX_DEPTH,
    constants: Literal["float", "null"] = "float",
) -> Parsed:
    """The JSON value of `data`, or a short reason it has none. Never raises.

    - Bytes are decoded as JSON's own encoding detection says (a UTF-8 BOM is skipped),
      bytes that do not decode become U+FFFD; a BOM at the start of text is skipped too.
    - Nesting deeper than `max_depth` is refused before json parses anything.
    - `NaN`, `Infinity` and `-Infinity`, which are not JSON, read as Python reads them
      (floats the caller judges as any number that is not finite), or as None
      (`constants="null"`).
    - An integer longer than Python's digit limit (4,300) reads as an infinite float, as
      `1e400` does, where int() would raise.
    - Lone surrogates (`"\\ud800"`, which no file can be written with) become U+FFFD.
    """
    try:
        text = _decoded(data)
        if _depth(text, max_depth) > max_depth:
            return Parsed(None, f"nests arrays or objects deeper than {max_depth} levels")
        if constants == "null":
            value = json.loads(text, parse_int=_integer, parse_constant=_null)
        else:
            value = json.loads(text, parse_int=_integer)
    except (ValueError, RecursionError, MemoryError) as error:
        return Parsed(None, f"is not valid JSON: {_short(error)}")
    if _SURROGATES.search(text) or _ESCAPED_SURROGATE.search(text):
        value = _without_surrogates(value)
    return Parsed(value)


def load_toml(data: bytes, *, max_depth: int = MAX_DEPTH) -> Parsed:
    """The TOML document `data` holds (a dict), or a short reason it has none. Never
    raises: a file over MOST_TOML_BYTES, text that is not UTF-8, arrays and inline tables
    nested deeper than `max_depth` (tomllib recurses once per level) are refused before
    tomllib reads anything."""
    if len(data) > MOST_TOML_BYTES:
        return Parsed(None, f"is larger than {MOST_TOML_BYTES} bytes")
    try:
        text = data.decode("utf-8")
        if _depth(_TOML_TEXT.sub("", text), max_depth) > max_depth:
            return Parsed(None, f"nests arrays or tables deeper than {max_depth} levels")
        return Parsed(tomllib.loads(text))
    except UnicodeDecodeError as error:
        return Parsed(None, f"is not UTF-8: {_short(error)}")
    except (tomllib.TOMLDecodeError, ValueError, RecursionError, MemoryError) as error:
        return Parsed(None, f"is not valid TOML: {_short(error)}")


def _decoded(data: bytes | str) -> str:
    if isinstance(data, str):
        return data.removeprefix("\ufeff")
    return data.decode(json.detect_encoding(data), errors="replace").removeprefix("\ufeff")


def _depth(text: str, max_depth: int) -> int:
    """How deep json can nest in `text`, or a number past `max_depth` once it is past it.

    The brackets outside strings are kept; each pass removes the innermost pairs (`[]`),
    so a balanced text empties in as many passes as it is deep. What no pass removes are
    brackets never matched, and json goes one level deeper into each that opens before it
    fails: the passes plus those are at least as deep as json goes (for text json accepts,
    exactly that). Every step is a scan in C, whatever the size of the text.
    """
    skeleton = _NOT_BRACKETS.sub("", _STRING.sub("", text)).replace("{", "[").replace("}", "]")
    passes = 0
    while "[]" in skeleton:
        passes += 1
        if passes > max_depth:
            break
        skeleton = skeleton.replace("[]", "")
    return passes + skeleton.count("[")


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
