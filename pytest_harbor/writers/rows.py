"""The files RolloutsWriter appends to (rollouts.jsonl, rollouts_failures.jsonl), read
back: one JSON object a line. Each reader decides what a line that holds none costs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pytest_harbor.untrusted import load_json

__all__ = ["RowLine", "read_rows"]


@dataclass(frozen=True)
class RowLine:
    """A line of a rows file that is not blank: the JSON object it holds (`row`), or why
    it holds none (`error`)."""

    #: Its number in the file, from 1.
    number: int
    row: dict[str, Any] | None
    error: str | None = None
    #: The last line, with no line break after it and no row in it: a write cut short
    #: (the run was killed while it wrote the line).
    torn: bool = False


def read_rows(path: Path, *, constants: Literal["float", "null"] = "float") -> list[RowLine]:
    """Every line of `path` that is not blank, in order. The text is UTF-8 (a byte that
    is not reads as U+FFFD), split where str.splitlines splits; each line is parsed by
    load_json (which never raises; `constants` says how NaN and Infinity read). The last
    line is read like any other: a whole row even without its line break, else `torn`.

    Raises OSError when the file cannot be read (FileNotFoundError when there is none)."""
    lines = path.read_bytes().decode("utf-8", errors="replace").splitlines(keepends=True)
    found = []
    for number, line in enumerate(lines, start=1):
        text = line.splitlines()[0]
        if not text.strip():
            continue
        value, error = load_json(text, constants=constants)
        if error is None and not isinstance(value, dict):
            error = "not a JSON object"
        if error is not None:
            unended = number == len(lines) and text == line
            found.append(RowLine(number, None, error, torn=unended))
        else:
            found.append(RowLine(number, value))
    return found
