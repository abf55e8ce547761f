"""The task-folder digest rows carry: what the folder was when the row was written."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from pytest_harbor.ignore import is_ignored

__all__ = ["DIGEST_FILES", "DIGEST_FOLDERS", "TaskFolderError", "task_digest"]

#: Files at the top of a task folder that the digest covers.
DIGEST_FILES = ("task.toml", "instruction.md", "README.md", "trajectory.json", "task_data.json")
#: Folders whose whole content (hidden files too) the digest covers.
DIGEST_FOLDERS = ("environment", "tests", "solution", "steps")


class TaskFolderError(ValueError):
    """The folder holds something the digest cannot represent (a directory symlink)."""

    def __init__(self, path: Path, message: str) -> None:
        self.path = path
        super().__init__(message)


def task_digest(task_dir: Path) -> str:
    """`sha256:` + SHA-256 over the sorted records `relative-path NUL sha256(file) LF`.

    Paths are POSIX, relative to the task folder. A symlinked file counts as its target's
    content; a directory symlink is refused, since a record cannot say where it points.
    """
    records = [_record(task_dir, task_dir / name) for name in DIGEST_FILES]
    for folder in DIGEST_FOLDERS:
        records.extend(_records_below(task_dir, task_dir / folder))
    digest = hashlib.sha256()
    for record in sorted(record for record in records if record is not None):
        digest.update(record)
    return f"sha256:{digest.hexdigest()}"


def _records_below(task_dir: Path, folder: Path) -> list[bytes | None]:
    if folder.is_symlink():
        raise TaskFolderError(folder, "is a symlink to a folder, which a task folder may not hold")
    if not folder.is_dir():
        return []
    records: list[bytes | None] = []
    for root, dirs, files in os.walk(folder):
        for name in list(dirs):
            if (Path(root) / name).is_symlink():
                raise TaskFolderError(
                    Path(root) / name, "is a symlink to a folder, which a task folder may not hold"
                )
        dirs[:] = sorted(name for name in dirs if not is_ignored(name))
        records.extend(
            _record(task_dir, Path(root) / name) for name in files if not is_ignored(name)
        )
    return records


def _record(task_dir: Path, path: Path) -> bytes | None:
    if not path.is_file():
        return None
    with path.open("rb") as handle:
        content = hashlib.file_digest(handle, "sha256").hexdigest()
    return f"{path.relative_to(task_dir).as_posix()}\0{content}\n".encode()
