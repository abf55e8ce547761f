"""`${NAME}` templates, the one grammar every table of a task is filled by."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "SecretReference",
    "Template",
    "TemplateSources",
    "fill",
    "fill_inside",
    "lookup",
    "names_inside",
    "whole_template",
]

#: A variable's name, as a shell spells one.
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
#: A value that is a template whole: `${NAME}` or `${NAME:-default}` (env tables).
_WHOLE = re.compile(rf"^\$\{{({_NAME})(?::-(.*))?\}}$", re.DOTALL)
#: `${NAME}` anywhere in a text, without a default (MCP headers: `Bearer ${TOKEN}`).
_INSIDE = re.compile(rf"\$\{{({_NAME})\}}")


@dataclass(frozen=True)
class Template:
    """A whole value `${NAME}`, or `${NAME:-default}`."""

    name: str
    default: str | None = None


def whole_template(value: str) -> Template | None:
    """The template `value` is, whole; None for any other text (kept as written)."""
    match = _WHOLE.match(value)
    if match is None:
        return None
    return Template(match.group(1), match.group(2))


def lookup(name: str, *sources: Mapping[str, str]) -> str | None:
    """The value of `name` in the first of `sources` that has it (None: none has)."""
    for source in sources:
        if name in source:
            return source[name]
    return None


def fill(value: str, *sources: Mapping[str, str]) -> str | None:
    """`value` filled when it is a template whole, else as written; None when its
    variable is in none of `sources` and it has no default."""
    template = whole_template(value)
    if template is None:
        return value
    found = lookup(template.name, *sources)
    return template.default if found is None else found


def names_inside(text: str) -> list[str]:
    """The names of every `${NAME}` in `text`, in order."""
    return _INSIDE.findall(text)


def fill_inside(text: str, *sources: Mapping[str, str]) -> str:
    """`text` with every `${NAME}` in it filled (empty when no source has the name)."""
    return _INSIDE.sub(lambda match: lookup(match.group(1), *sources) or "", text)


@dataclass(frozen=True)
class SecretReference:
    """A verifier variable that gives a secret, held by name until the verifier's
    environment is made: its value is never in a loaded task."""

    #: The `${NAME}` it reads: a secret of the run, or a host variable holding one.
    name: str
    #: The secrets its value gives.
    secrets: tuple[str, ...]

    def fill(self, secrets: Mapping[str, str], host: Mapping[str, str]) -> str:
        """Its value: the run's secret of its name, else the host variable's. KeyError
        when neither has it (a task loaded with the sources of other settings)."""
        value = lookup(self.name, secrets, host)
        if value is None:
            raise KeyError(f"${{{self.name}}} is neither a secret nor a host variable here")
        return value


@dataclass(frozen=True)
class TemplateSources:
    """What a task's `${NAME}`s may read, with no secret's value among it."""

    #: The host variables a task may read (the `host_env` setting), with their values:
    #: none of them holds a secret's text.
    host: Mapping[str, str] = field(default_factory=dict)
    #: The run's secrets, by name (verifier env tables read them).
    secrets: frozenset[str] = frozenset()
    #: The host variables a task may read that hold a secret's text, by name, each with
    #: the secrets it holds.
    carriers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def reference(self, name: str, *, verifier: bool) -> SecretReference | None:
        """The secret `${name}` gives, in a verifier env table or (`verifier` False) a
        table the agent's sandbox gets; None when it gives none."""
        if verifier and name in self.secrets:
            return SecretReference(name, (name,))
        if name in self.carriers:
            return SecretReference(name, self.carriers[name])
        return None
