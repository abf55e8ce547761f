"""The content digest of a cached folder."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = ["tree_digest"]


def tree_digest(folder: Path) -> str:
    """`sha256:` over every entry below `folder`, sorted: `path NUL kind NUL content-hash`,
    where a file's kind says whether it is executable and a symlink's content is its
    target. Any change to a file, a mode bit that git keeps, or a link shows."""
    records = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        base = Path(root)
        for name in [*files, *(d for d in dirs if (base / d).is_symlink())]:
            path = base / name
            relative = path.relative_to(folder).as_posix()
            if path.is_symlink():
                kind, content = "link", os.readlink(path).encode()
            else:
                kind = "exec" if os.access(path, os.X_OK) else "file"
                content = path.read_bytes()
            records.append(f"{relative}\0{kind}\0{hashlib.sha256(content).hexdigest()}\n")
    digest = hashlib.sha256()
    for record in sorted(records):
        digest.update(record.encode())
    return f"sha256:{digest.hexdigest()}"
