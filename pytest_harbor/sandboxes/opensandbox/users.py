"""Who a command runs as on OpenSandbox: execd takes numbers only, so a user as a task or
the engine names it (`name`, `uid`, either with `:group` or `:gid`) is read from the
sandbox's /etc/passwd and /etc/group by the rule the engine's survey reads them by
(engine/scripts.py RESOLVE_USERS): a name is the first line with that name, a number is
itself."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["UserSpec", "Users", "Who", "parse_user"]


@dataclass(frozen=True)
class UserSpec:
    name: str
    group: str = ""


def parse_user(spec: str) -> UserSpec:
    name, _, group = spec.partition(":")
    return UserSpec(name or "0", group)


@dataclass(frozen=True)
class Who:
    """A command's uid, its gid when the user named a group (else execd takes the user's
    own and its supplementary groups), and HOME as the user's passwd entry gives it."""

    uid: int
    gid: int | None
    home: str


def _lines(data: bytes | None) -> list[list[str]]:
    if not data:
        return []
    return [line.split(":") for line in data.decode("utf-8", "replace").splitlines()]


def _number(text: str) -> int | None:
    return int(text) if text.isdigit() and len(text) < 11 else None


class Users:
    """The users of one sandbox, read through `read_file` (a path's bytes, or None) when a
    name is first asked for, and again when a name is not found."""

    def __init__(self, read_file: Callable[[str], bytes | None]) -> None:
        self._read_file = read_file
        self._passwd: list[list[str]] | None = None
        self._group: list[list[str]] | None = None
        self._lock = threading.Lock()

    def _files(self, fresh: bool) -> tuple[list[list[str]], list[list[str]]]:
        with self._lock:
            if fresh or self._passwd is None or self._group is None:
                self._passwd = _lines(self._read_file("/etc/passwd"))
                self._group = _lines(self._read_file("/etc/group"))
            return self._passwd, self._group

    def resolve(self, spec: UserSpec) -> Who | None:
        """The numbers of `spec`; None when a name in it is not in the files."""
        found = self._resolve(spec, fresh=False)
        return found if found is not None else self._resolve(spec, fresh=True)

    def _resolve(self, spec: UserSpec, fresh: bool) -> Who | None:
        if _number(spec.name) == 0 and not fresh and self._passwd is None and spec.group.isdigit():
            # Root by numbers, as the engine's own commands run: no file to read.
            return Who(0, int(spec.group), "/root")
        passwd, group = self._files(fresh)
        entry = _user_entry(passwd, spec.name)
        if entry is None:
            return None
        uid, line = entry
        home = line[5] if line is not None and len(line) > 5 and line[5] else "/"
        if not spec.group:
            # A uid with no entry runs with group 0, as the engine's exec gives it; a user
            # with one gets its own group and supplementary groups from execd.
            return Who(uid, 0 if line is None else None, home)
        gid = _group_id(group, spec.group)
        return None if gid is None else Who(uid, gid, home)


def _user_entry(passwd: list[list[str]], name: str) -> tuple[int, list[str] | None] | None:
    """The uid `name` stands for and its passwd line: a number is itself (its line, the
    first with that uid, may be missing); a name is the first line with that name. None
    when a name is not there."""
    numeric = _number(name)
    if numeric is not None:
        return numeric, next((fields for fields in passwd if fields[2:3] == [name]), None)
    line = next((fields for fields in passwd if fields[0] == name), None)
    found = _number(line[2]) if line is not None and len(line) > 2 else None
    return None if found is None else (found, line)


def _group_id(group: list[list[str]], name: str) -> int | None:
    """The gid `name` stands for: a number is itself, a name the first group line with
    that name; None when a name is not there."""
    numeric = _number(name)
    if numeric is not None:
        return numeric
    entry = next((fields for fields in group if fields[0] == name), None)
    return _number(entry[2]) if entry is not None and len(entry) > 2 else None
