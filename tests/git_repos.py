"""Real git repositories for the dataset-by-reference tests: made by the test, served by
file path or by `git daemon` on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["TaskRepo", "git_daemon", "write_registry"]


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


class TaskRepo:
    """A work-tree repository on branch `main`; `commit()` returns the new commit id."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True)
        _git(path, "init", "--quiet", "--initial-branch=main")
        _git(path, "config", "user.email", "tests@example.invalid")
        _git(path, "config", "user.name", "tests")

    def commit(self, message: str = "change") -> str:
        _git(self.path, "add", "--all")
        _git(self.path, "commit", "--quiet", "--allow-empty", "-m", message)
        return _git(self.path, "rev-parse", "HEAD")

    def tag(self, name: str) -> None:
        _git(self.path, "tag", name)

    @property
    def file_url(self) -> str:
        return f"file://{self.path}"


def write_registry(path: Path, datasets: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps(datasets, indent=2))
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def git_daemon(base: Path) -> Iterator[str]:
    """`git daemon` serving every repository under `base` on 127.0.0.1; yields the URL
    prefix (`git://127.0.0.1:PORT`) and stops the daemon afterwards."""
    port = _free_port()
    process = subprocess.Popen(
        [
            "git",
            "daemon",
            f"--base-path={base}",
            "--export-all",
            "--reuseaddr",
            "--listen=127.0.0.1",
            f"--port={port}",
            str(base),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        yield f"git://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)
