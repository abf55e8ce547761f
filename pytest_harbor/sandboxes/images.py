"""Content hashes of build contexts, and a lock so one process builds each hash."""

from __future__ import annotations

import hashlib
import os
import tempfile
from contextlib import AbstractContextManager
from pathlib import Path

from pytest_harbor.ignore import is_ignored
from pytest_harbor.locks import held

__all__ = ["build_lock", "context_hash", "image_tag_for"]


def context_hash(folder: Path) -> str:
    """SHA-256 over `path NUL mode NUL sha256(content) LF` of every file, sorted by path.

    The executable bit is part of the record because `COPY` keeps it.
    """
    records: list[bytes] = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(name for name in dirs if not is_ignored(name))
        for name in files:
            if is_ignored(name):
                continue
            path = Path(root) / name
            relative = path.relative_to(folder).as_posix()
            mode = "x" if os.access(path, os.X_OK) else "-"
            with path.open("rb") as handle:
                content = hashlib.file_digest(handle, "sha256").hexdigest()
            records.append(f"{relative}\0{mode}\0{content}\n".encode())
    digest = hashlib.sha256()
    for record in sorted(records):
        digest.update(record)
    return digest.hexdigest()


def image_tag_for(folder: Path) -> str:
    """The tag a built environment gets: Harbor's `hb__<hash>` naming, 32 hex digits."""
    return f"hb__{context_hash(folder)[:32]}"


def build_lock(key: str) -> AbstractContextManager[None]:
    """Serialise builds of one image across every process of this machine."""
    return held(Path(tempfile.gettempdir()) / f"pytest-harbor-build-{key}.lock")
