"""Content hashes of build contexts (with the options they are built with), and a lock so
one process builds each hash."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from contextlib import AbstractContextManager
from pathlib import Path

from pytest_harbor.ignore import is_ignored
from pytest_harbor.locks import held
from pytest_harbor.sandboxes.base import BuildOptions

__all__ = ["build_hash", "build_lock", "context_hash", "image_tag_for"]


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


def build_hash(folder: Path, options: BuildOptions | None = None) -> str:
    """The content hash of `folder` built with `options`: the folder's own hash with the
    defaults (an image built before options existed keeps its name), else SHA-256 over it
    and every option that says what the image is. A Dockerfile named by the options
    counts by its path from the context and its content (it may lie outside the context).
    """
    digest = context_hash(folder)
    if options is None:
        return digest
    record: dict[str, object] = {
        "dockerfile": None,
        "dockerfile_inline": options.dockerfile_inline,
        "args": [list(pair) for pair in options.args],
        "target": options.target,
        "labels": [list(pair) for pair in options.labels],
        "extra_hosts": [list(pair) for pair in options.extra_hosts],
        "network": options.network,
        "platform": options.platform,
    }
    if options.dockerfile is not None:
        with options.dockerfile.open("rb") as handle:
            content = hashlib.file_digest(handle, "sha256").hexdigest()
        record["dockerfile"] = [os.path.relpath(options.dockerfile, folder), content]
    if not any(record.values()):
        return digest
    text = json.dumps(record, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{digest}\n{text}".encode()).hexdigest()


def image_tag_for(folder: Path, options: BuildOptions | None = None) -> str:
    """The tag an environment built from `folder` (with `options`) gets: Harbor's
    `hb__<hash>` naming, 32 hex digits."""
    return f"hb__{build_hash(folder, options)[:32]}"


def build_lock(key: str) -> AbstractContextManager[None]:
    """Serialise builds of one image across every process of this machine."""
    return held(Path(tempfile.gettempdir()) / f"pytest-harbor-build-{key}.lock")
