"""Misspelt keys of a TOML file: the line a key is on, and the key that was meant."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["closest", "key_line", "near_miss"]

_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(
    r"""^\s*((?:"[^"]*"|'[^']*'|[A-Za-z0-9_-]+)(?:\s*\.\s*(?:"[^"]*"|'[^']*'|[A-Za-z0-9_-]+))*)\s*="""
)
_INDEX = re.compile(r"^(.*)\[(\d+)\]$")


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name `name` most likely misspells, if one is close enough."""
    found = difflib.get_close_matches(name, list(known), n=1, cutoff=0.75)
    return found[0] if found else None


def _parts(dotted: str) -> list[str]:
    return [part.strip().strip("\"'") for part in dotted.split(".")]


def key_line(text: str, dotted: str) -> int | None:
    """The line (1-based) of the key `dotted` (`environment.cpu`, `steps[1].agent.user`) in
    the TOML `text`, from its tables, dotted keys and arrays of tables; None when it is not
    written on a line of its own (an inline table, say)."""
    wanted: list[tuple[str, int | None]] = []
    for part in dotted.split("."):
        match = _INDEX.match(part)
        wanted.append((match.group(1), int(match.group(2))) if match else (part, None))
    table: list[tuple[str, int | None]] = []
    counts: dict[tuple[str, ...], int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        header = _HEADER.match(line)
        if header is not None:
            names = _parts(header.group(2))
            if header.group(1) == "[[":
                array = tuple(names)
                counts[array] = counts.get(array, -1) + 1
            table = []
            for depth, name in enumerate(names):
                index = counts.get(tuple(names[: depth + 1]))
                table.append((name, index))
            if _same(table, wanted):
                return number  # the key is a table of its own
            continue
        assignment = _KEY.match(line)
        if assignment is not None:
            path = table + [(name, None) for name in _parts(assignment.group(1))]
            if _same(path, wanted):
                return number
    return None


def _same(path: list[tuple[str, int | None]], wanted: list[tuple[str, int | None]]) -> bool:
    if len(path) != len(wanted):
        return False
    return all(
        name == want and (want_index is None or index == want_index)
        for (name, index), (want, want_index) in zip(path, wanted, strict=True)
    )


def near_miss(raw: Mapping[str, Any], text: str, key: str) -> str | None:
    """For a key reported missing (or wrong): a key beside it in the file that looks like
    a misspelling of it, with its line, as a phrase to add to the message."""
    *parents, name = key.split(".")
    indexed = _INDEX.match(name)
    if indexed is not None:
        return None  # an entry of a list the file has: nothing misspelt
    table: Any = raw
    for part in parents:
        match = _INDEX.match(part)
        table = table.get(match.group(1) if match else part) if isinstance(table, Mapping) else None
        if match and isinstance(table, list):
            index = int(match.group(2))
            table = table[index] if index < len(table) else None
    if not isinstance(table, Mapping) or name in table:
        return None
    candidates = [other for other in table if isinstance(other, str)]
    found = difflib.get_close_matches(name, candidates, n=1, cutoff=0.75)
    if not found:
        return None
    where = ".".join([*parents, found[0]])
    line = key_line(text, where)
    at = f" (line {line})" if line is not None else ""
    return f"the file has `{found[0]}`{at}: did you mean `{name}`?"
