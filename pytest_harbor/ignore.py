"""Names that content hashes and digests skip at any depth: editor and interpreter litter."""

from __future__ import annotations

__all__ = ["IGNORED_PATTERNS", "is_ignored"]

_IGNORED_NAMES = ("__pycache__", ".DS_Store")
_IGNORED_SUFFIXES = (".pyc", ".swp", ".swo", "~")

#: As documented: `__pycache__`, `*.pyc`, `.DS_Store`, `*.swp`, `*.swo`, `*~`.
IGNORED_PATTERNS = ("__pycache__", "*.pyc", ".DS_Store", "*.swp", "*.swo", "*~")


def is_ignored(name: str) -> bool:
    return name in _IGNORED_NAMES or name.endswith(_IGNORED_SUFFIXES)
