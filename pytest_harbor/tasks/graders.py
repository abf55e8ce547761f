"""What grades a turn: `test.sh` first, then a `verifier.py` in its tests, then the
dataset's root `verifier.py` for a task without `tests/` (the reference documents' order);
and the task's own fields (`task_data.json`) a Python verifier is given."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_harbor.tasks.dataset import DatasetFiles
from pytest_harbor.tasks.errors import TaskLoadError
from pytest_harbor.tasks.task import PythonVerifier
from pytest_harbor.untrusted import load_json

__all__ = ["SHARED_MODULE", "TASK_DATA", "graded", "python_verifier", "read_task_data"]

#: A task's own fields, beside task.toml.
TASK_DATA = "task_data.json"
_TASK_DATA_CAP = 1024 * 1024
#: Where a dataset's shared verifier lands in the sandbox (beside the engine's runner).
SHARED_MODULE = "/tests/.harbor/verifier.py"


def graded(tests_dirs: Sequence[Path], shared: DatasetFiles) -> bool:
    """Whether something grades a turn whose tests are `tests_dirs` (those that exist)."""
    scripts = ("test.sh", "verifier.py")
    if any((folder / name).is_file() for folder in tests_dirs for name in scripts):
        return True
    return not tests_dirs and shared.verifier is not None


def python_verifier(
    tests_dirs: Sequence[Path], shared: DatasetFiles, task_data: dict[str, Any] | None
) -> PythonVerifier | None:
    """The turn's Python verifier, or None when a `test.sh` grades it (or nothing does)."""
    if any((folder / "test.sh").is_file() for folder in tests_dirs):
        return None
    files = {} if shared.task_data_model is None else {"task_data.py": shared.task_data_model}
    if any((folder / "verifier.py").is_file() for folder in tests_dirs):
        return PythonVerifier("/tests/verifier.py", files, task_data)
    if not tests_dirs and shared.verifier is not None:
        return PythonVerifier(SHARED_MODULE, {**files, "verifier.py": shared.verifier}, task_data)
    return None


def read_task_data(task_dir: Path) -> dict[str, Any] | None:
    """The task's `task_data.json` (a JSON object), None without one; TaskLoadError names
    the file when it is not one."""
    path = task_dir / TASK_DATA
    if not path.exists() and not path.is_symlink():
        return None
    if not path.is_file():
        raise TaskLoadError(path, "must be a file")
    with path.open("rb") as handle:
        data = handle.read(_TASK_DATA_CAP + 1)
    if len(data) > _TASK_DATA_CAP:
        raise TaskLoadError(path, f"is larger than {_TASK_DATA_CAP} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise TaskLoadError(path, f"not valid JSON: {error}") from None
    parsed = load_json(text)  # depth bounded before json reads it
    if parsed.error is not None:
        raise TaskLoadError(path, parsed.error.removeprefix("is "))
    fields = parsed.value
    if not isinstance(fields, dict):
        raise TaskLoadError(path, f"must hold a JSON object, not {type(fields).__name__}")
    return fields
