"""The task-folder digest: a fixed vector, what it covers and what it ignores."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from pytest_harbor.tasks import task_digest
from pytest_harbor.tasks.digest import TaskFolderError

FILES = {
    "task.toml": b"[agent]\ntimeout_sec = 60\n",
    "instruction.md": b"Say hello.\n",
    "README.md": b"# hello\n",
    "tests/test.sh": b"echo 1 > /logs/verifier/reward.txt\n",
    "tests/.fixture": b"hidden but covered\n",
    "solution/solve.sh": b"echo hello\n",
    "environment/Dockerfile": b"FROM debian:bookworm-slim\n",
    "steps/one/instruction.md": b"Step one.\n",
}
#: The digest of FILES on any machine; it changes only if the algorithm does.
KNOWN_DIGEST = "sha256:a542cc15af480b84de11afd5548a4922c009b5cb5910930e856fa60587fd3f46"


def write(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def by_hand(files: dict[str, bytes]) -> str:
    records = sorted(
        f"{name}\0{hashlib.sha256(data).hexdigest()}\n".encode() for name, data in files.items()
    )
    return "sha256:" + hashlib.sha256(b"".join(records)).hexdigest()


def test_known_vector(tmp_path: Path) -> None:
    folder = write(tmp_path, FILES)
    assert task_digest(folder) == by_hand(FILES) == KNOWN_DIGEST


def test_ignored_and_uncovered_files_do_not_count(tmp_path: Path) -> None:
    folder = write(tmp_path, FILES)
    write(
        folder,
        {
            "tests/__pycache__/helper.cpython-311.pyc": b"\0",
            "tests/helper.pyc": b"\0",
            "solution/.DS_Store": b"\0",
            "solution/solve.sh.swp": b"\0",
            "environment/notes.swo": b"\0",
            "instruction.md~": b"old",
            "notes.txt": b"not covered: not a digest file or folder",
            "results/rollouts.jsonl": b"{}",
        },
    )
    assert task_digest(folder) == KNOWN_DIGEST


@pytest.mark.parametrize("name", sorted(FILES))
def test_editing_any_covered_file_changes_the_digest(tmp_path: Path, name: str) -> None:
    folder = write(tmp_path, FILES)
    (folder / name).write_bytes(FILES[name] + b"edited\n")
    assert task_digest(folder) != KNOWN_DIGEST


def test_renaming_a_file_changes_the_digest(tmp_path: Path) -> None:
    folder = write(tmp_path, FILES)
    (folder / "solution" / "solve.sh").rename(folder / "solution" / "run.sh")
    assert task_digest(folder) != KNOWN_DIGEST


def test_a_folder_symlink_cannot_be_digested(tmp_path: Path) -> None:
    folder = write(tmp_path / "task", FILES)
    (tmp_path / "elsewhere").mkdir()
    (folder / "tests" / "data").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(TaskFolderError):
        task_digest(folder)
