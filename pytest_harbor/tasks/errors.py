"""The error a task or dataset folder that cannot be loaded raises."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

__all__ = ["TaskLoadError", "describe_validation_error", "error_key", "key_path"]


class TaskLoadError(Exception):
    """A folder that cannot be loaded: which file, which key, what was expected."""

    __module__ = "pytest_harbor"

    def __init__(self, path: Path, message: str, key: str | None = None) -> None:
        self.path = path
        self.key = key
        self.message = message
        where = f"{path}: {key}" if key else str(path)
        super().__init__(f"{where}: {message}")


def describe_validation_error(error: ValidationError, from_dataset: bool = False) -> str:
    """The first problem in words: pydantic's expectation, and what was given."""
    errors = error.errors()
    first = errors[0]
    branches = _union_branches(errors)
    if branches:
        expected = dict.fromkeys(_expectation(e["msg"]) for e in branches)
        message = "Input should be " + " or ".join(expected) + f", got {first.get('input')!r}"
        more = len(errors) - len(branches)
    else:
        message = first["msg"].removeprefix("Value error, ")
        if first["type"] == "missing":
            message = "required, but missing"
        elif first["type"] != "value_error" and not isinstance(first.get("input"), dict):
            # Our own checks name the value already; pydantic's built-in ones do not.
            message = f"{message.split(', got ')[0]}, got {first.get('input')!r}"
        more = len(errors) - 1
    if more:
        message += f" (and {more} more problem{'s' if more > 1 else ''})"
    if from_dataset:
        message += " (with the dataset.toml override for this task applied)"
    return message


def _expectation(message: str) -> str:
    """`Input should be a valid integer, got ...` -> `a valid integer`."""
    return message.removeprefix("Input should be ").split(", got ")[0]


def error_key(error: ValidationError) -> str:
    """Where the first problem is, without the branch names of a union type."""
    errors = error.errors()
    branches = _union_branches(errors)
    loc = errors[0]["loc"][:-1] if branches else errors[0]["loc"]
    return key_path(loc)


def _union_branches(errors: list[Any]) -> list[Any]:
    """The errors that are one value failing each branch of a union (`str | int`): the
    same place, with a last part that names a type."""
    first = errors[0]["loc"]
    if not first or not _is_type_tag(first[-1]):
        return []
    same = [
        e
        for e in errors
        if len(e["loc"]) == len(first)
        and e["loc"][:-1] == first[:-1]
        and _is_type_tag(e["loc"][-1])
    ]
    return same if len(same) > 1 else []


def _is_type_tag(part: object) -> bool:
    # pydantic tags union branches with type names: `int`, `str`, `list[str]`, ...
    return isinstance(part, str) and (part in _TYPE_TAGS or not part.isidentifier())


_TYPE_TAGS = {"int", "float", "str", "bool", "bytes", "dict", "list", "none"}


def key_path(loc: tuple[int | str, ...]) -> str:
    """`("steps", 0, "agent", "user")` -> `steps[0].agent.user`."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path
