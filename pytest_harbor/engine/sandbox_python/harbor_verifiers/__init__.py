"""Helpers for a task's Python verifier (`verify(...)` in `tests/verifier.py`, or the
dataset's `verifier.py`), shipped by pytest-harbor into the sandbox with every
Python-verified turn: standard library only, Python 3.8 or newer.

    from harbor_verifiers import fraction, read_text, run

    def verify(workspace):
        answer = read_text(workspace / "answer.txt", default="")
        tests = run(["python3", "-m", "pytest", "-q"], cwd=workspace, timeout=120)
        return {"reward": fraction([answer.strip() == "42", tests.ok]), "tests": float(tests.ok)}

The runner loads this copy before the verifier, so a module of the same name in the task
or the image never takes its place.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = ["Completed", "fraction", "read_text", "run"]

#: Which helpers these are (a verifier may check it).
VERSION = "1"


class Completed:
    """What run() gave: the exit status (None when the command timed out) and output."""

    def __init__(self, returncode: int | None, stdout: str, stderr: str) -> None:
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def __repr__(self) -> str:
        return f"Completed(returncode={self.returncode!r})"


def read_text(path: str | Path, default: str | None = None, limit: int = 16 << 20) -> str | None:
    """The text of the file `path` (its first `limit` bytes, bytes that are not UTF-8
    replaced), or `default` when it cannot be read."""
    try:
        with open(str(path), "rb") as handle:
            return handle.read(limit).decode("utf-8", "replace")
    except OSError:
        return default


def run(
    command: str | Sequence[str],
    cwd: str | Path | None = None,
    timeout: float = 60.0,
    input: str | None = None,
) -> Completed:
    """Run `command` (a list, or a string for `bash -c`) and wait at most `timeout`
    seconds; it never raises for the command's own failure."""
    argv = ["bash", "-c", command] if isinstance(command, str) else list(command)
    try:
        done = subprocess.run(
            argv,
            cwd=None if cwd is None else str(cwd),
            input=input,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as expired:
        return Completed(None, _text(expired.stdout), _text(expired.stderr))
    except OSError as error:
        return Completed(127, "", str(error))
    return Completed(done.returncode, done.stdout, done.stderr)


def fraction(checks: Iterable[object]) -> float:
    """The share of `checks` that hold (0.0 when there are none)."""
    values = [bool(check) for check in checks]
    return sum(values) / len(values) if values else 0.0


def _text(value: str | bytes | None) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value
