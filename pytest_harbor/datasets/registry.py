"""A registry in Harbor's JSON format: which datasets exist, and where each task lives."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from pytest_harbor.atomic import write_atomically
from pytest_harbor.datasets.references import DEFAULT_REGISTRY, RegistryReference
from pytest_harbor.untrusted import load_json

__all__ = [
    "DEFAULT_REGISTRY",
    "RegistryDataset",
    "RegistryError",
    "RegistryTask",
    "find_dataset",
    "read_registry",
]

_FETCH_TIMEOUT_S = 30.0


class RegistryError(Exception):
    """A registry that cannot be read, or that lacks what was asked of it."""


class RegistryTask(BaseModel):
    """One task of a dataset: a folder of a git repository at a commit."""

    # Harbor may add fields; what this release does not use is ignored (docs say which).
    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    git_url: str | None = None
    #: A commit id, or a branch or tag (resolved once per run); None is HEAD.
    git_commit_id: str | None = None
    path: str


class RegistryDataset(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    version: str
    description: str = ""
    tasks: list[RegistryTask] = Field(default_factory=list)


_DATASETS = TypeAdapter(list[RegistryDataset])


def read_registry(
    source: str, cache_dir: Path, warn: Callable[[str], None]
) -> list[RegistryDataset]:
    """The datasets of the registry at `source` (a URL or a file). A URL's text is kept
    under `cache_dir`, and used, with a warning, when the URL cannot be reached."""
    if not source.startswith(("http://", "https://", "file://")):
        path = Path(source).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise RegistryError(f"cannot read the registry {path}: {error}") from None
        return _parse(text, str(path))
    import urllib.error  # only when a registry is read from a URL
    import urllib.request

    kept = cache_dir / "registries" / (hashlib.sha256(source.encode()).hexdigest()[:24] + ".json")
    try:
        with urllib.request.urlopen(source, timeout=_FETCH_TIMEOUT_S) as response:
            text = response.read().decode("utf-8")
    except (OSError, urllib.error.URLError, UnicodeDecodeError, ValueError) as error:
        if not kept.is_file():
            raise RegistryError(f"cannot reach the registry {source}: {error}") from None
        warn(
            f"cannot reach the registry {source} ({error}); using the copy read before, "
            f"kept at {kept}"
        )
        return _parse(kept.read_text(encoding="utf-8"), f"{source} (kept at {kept})")
    datasets = _parse(text, source)
    write_atomically(kept, text)
    return datasets


def _parse(text: str, where: str) -> list[RegistryDataset]:
    parsed = load_json(text)  # depth bounded before json reads it
    if parsed.error is not None:
        raise RegistryError(f"the registry {where} {parsed.error}")
    data = parsed.value
    try:
        return _DATASETS.validate_python(data)
    except ValidationError as error:
        first = error.errors()[0]
        location = "".join(
            f"[{part}]" if isinstance(part, int) else f".{part}" for part in first["loc"]
        )
        raise RegistryError(
            f"the registry {where}: {location or '(top)'}: {first['msg']} "
            "(Harbor's registry format: a list of {name, version, tasks: [{name, git_url, "
            "git_commit_id, path}]})"
        ) from None


def find_dataset(
    datasets: list[RegistryDataset], reference: RegistryReference, source: str
) -> RegistryDataset:
    """The dataset a reference names; without a version, `head` if there is one, else the
    highest version (numbers compared as numbers)."""
    versions = {dataset.version: dataset for dataset in datasets if dataset.name == reference.name}
    if not versions:
        names = sorted({dataset.name for dataset in datasets})
        close = [name for name in names if reference.name.lower() in name.lower()]
        hint = f"; similar names: {', '.join(close[:10])}" if close else ""
        raise RegistryError(
            f"{reference.given}: the registry {source} has no dataset {reference.name!r} "
            f"({len(names)} datasets{hint})"
        )
    if reference.version is None:
        return versions["head"] if "head" in versions else versions[newest(list(versions))]
    if reference.version not in versions:
        raise RegistryError(
            f"{reference.given}: the registry {source} has no version {reference.version!r} "
            f"of {reference.name}; it has {', '.join(sorted(versions, key=_version_key))}"
        )
    return versions[reference.version]


def newest(versions: list[str]) -> str:
    return max(versions, key=_version_key)


def _version_key(version: str) -> tuple[int, list[tuple[int, str]]]:
    """Versions made of numbers rank above the others; numbers compare as numbers."""
    parts = re.split(r"[.\-+]", version)
    numeric = all(part.isdigit() for part in parts)
    return (1 if numeric else 0), [
        (int(part), "") if part.isdigit() else (-1, part) for part in parts
    ]
