"""Content hashes of build contexts (with the options they are built with), and a lock so
one process builds each hash."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from contextlib import AbstractContextManager
from pathlib import Path

from pytest_harbor.ignore import is_ignored
from pytest_harbor.locks import held
from pytest_harbor.sandboxes.base import BuildOptions

__all__ = ["build_hash", "build_lock", "context_hash", "image_tag_for"]


def context_hash(folder: Path) -> str:
    """SHA-256 over one record per entry the builder is sent, sorted by path: a file's
    `path NUL f MODE NUL sha256(content)`, a folder's `path NUL d MODE` (an empty one
    too), a symlink's `path NUL l NUL target`, anything else's `path NUL ? MODE`.

    The permission bits are in the record because `COPY` keeps them, and the kind
    because a link is copied as a link: two contexts a build would tell apart never share
    a name (and an image built from one is never used for the other). Nothing but
    regular files is opened (a FIFO would never end).
    """
    records: list[bytes] = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(name for name in dirs if not is_ignored(name))
        for name in [*dirs, *files]:
            if is_ignored(name):
                continue
            path = Path(root) / name
            relative = path.relative_to(folder).as_posix()
            info = path.lstat()
            mode = f"{stat.S_IMODE(info.st_mode):o}"
            if stat.S_ISLNK(info.st_mode):
                record = f"{relative}\0l\0{os.readlink(path)}"
            elif stat.S_ISDIR(info.st_mode):
                record = f"{relative}\0d{mode}"
            elif stat.S_ISREG(info.st_mode):
                with path.open("rb") as handle:
                    content = hashlib.file_digest(handle, "sha256").hexdigest()
                record = f"{relative}\0f{mode}\0{content}"
            else:
                record = f"{relative}\0?{mode}"
            records.append(f"{record}\n".encode(errors="surrogateescape"))
    digest = hashlib.sha256()
    for line in sorted(records):
        digest.update(line)
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
