"""Datasets by reference: `harbor:NAME@VERSION` through a registry in Harbor's format, and
`git+URL@REF#path=FOLDER`, fetched with git into a cache checked by content digest.

The fetching modules (`resolve`, `git`, `registry`) load only when a run has a reference.
"""

import os
from pathlib import Path

from pytest_harbor.datasets.models import PinnedTask, ResolvedDataset
from pytest_harbor.datasets.references import DEFAULT_REGISTRY, ReferenceError, is_reference

__all__ = [
    "DEFAULT_REGISTRY",
    "PinnedTask",
    "ReferenceError",
    "ResolvedDataset",
    "default_cache_dir",
    "is_reference",
]


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/pytest-harbor/datasets`, else `~/.cache/pytest-harbor/datasets`."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pytest-harbor" / "datasets"
