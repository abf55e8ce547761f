"""The names a run can be given, one registry per kind (harnesses, sandbox providers,
CLI-agent recipes): built in, given by a pytest hook, or named by an installed package's
entry point.

Entry points are read only when a name has to be found or listed, never at import.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Generic, TypeVar, cast

__all__ = ["NameTaken", "Registry"]

T = TypeVar("T")


class NameTaken(ValueError):
    """A hook gave a name that is built in, installed or given twice."""


class Registry(Generic[T]):
    """The `what`s known by name. `built_in` is a mapping, or what makes it on first use."""

    def __init__(
        self, what: str, group: str, built_in: Mapping[str, T] | Callable[[], Mapping[str, T]]
    ) -> None:
        self.what = what
        self.group = group
        self._built_in = built_in

    @property
    def built_in(self) -> Mapping[str, T]:
        if callable(self._built_in):
            self._built_in = self._built_in()
        return self._built_in

    def installed(self) -> list[EntryPoint]:
        """The installed packages' entry points of this kind (read now: a package may be
        installed while the process lives)."""
        return list(entry_points(group=self.group))

    def names(self, registered: Mapping[str, T] | None = None) -> list[str]:
        found = set(self.built_in) | set(registered or {})
        return sorted(found | {ep.name for ep in self.installed()})

    def entry_point(self, name: str) -> EntryPoint | None:
        """The installed entry point of that name, if any."""
        for ep in self.installed():
            if ep.name == name:
                return ep
        return None

    def find(self, name: str, registered: Mapping[str, T] | None = None) -> T | None:
        """What `name` stands for (an entry point's object, loaded now), or None."""
        if name in self.built_in:
            return self.built_in[name]
        if registered and name in registered:
            return registered[name]
        ep = self.entry_point(name)
        return None if ep is None else cast(T, ep.load())

    def admit(self, given: Iterable[Mapping[str, T]], hook: str) -> dict[str, T]:
        """The names a hook's implementations gave, each once; a name also built in,
        installed, or given twice raises NameTaken."""
        found: dict[str, T] = {}
        for names in given:
            for name, value in dict(names).items():
                if name in found or name in self.built_in:
                    raise self._taken(name, hook)
                found[name] = value
        if found:
            installed = {ep.name for ep in self.installed()}
            for name in found:
                if name in installed:
                    raise self._taken(name, hook)
        return found

    def _taken(self, name: str, hook: str) -> NameTaken:
        return NameTaken(
            f"the {self.what} name {name!r} is registered twice ({hook}, or an installed "
            f"package's {self.group} entry point)"
        )
