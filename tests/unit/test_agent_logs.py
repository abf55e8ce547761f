"""A harness's folder on this machine: written below, never made again once the run has
cleared it (a harness abandoned at a deadline or an interrupted run may still write)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_harbor.harnesses.base import AgentLogs
from pytest_harbor.harnesses.oracle import _ran
from pytest_harbor.sandboxes.base import ExecResult


def test_a_file_below_the_folder_gets_its_folders(tmp_path: Path) -> None:
    logs = AgentLogs(sandbox_dir="/logs/agent", host_dir=tmp_path / "agent" / "task__r0")
    logs.host_dir.mkdir(parents=True)
    target = logs.place("sessions/one/log.jsonl")
    assert target == logs.host_dir / "sessions" / "one" / "log.jsonl"
    assert target.parent.is_dir()
    assert logs.place("top.txt") == logs.host_dir / "top.txt"


@pytest.mark.parametrize("relative", ["oracle.txt", "sessions/one/log.jsonl"])
def test_a_folder_the_run_cleared_is_not_made_again(tmp_path: Path, relative: str) -> None:
    staging = tmp_path / ".incoming" / "run"
    logs = AgentLogs(sandbox_dir="/logs/agent", host_dir=staging / "agent" / "task__r0")
    with pytest.raises(FileNotFoundError):
        logs.place(relative)
    assert not (tmp_path / ".incoming").exists()


def test_the_oracle_log_of_an_interrupted_run_is_dropped(tmp_path: Path) -> None:
    staging = tmp_path / ".incoming" / "run"
    logs = AgentLogs(sandbox_dir="/logs/agent", host_dir=staging / "agent" / "world__r0")
    context = SimpleNamespace(sandbox=None, logs=logs)
    result = ExecResult(exit_code=1, stdout_bytes=b"killed\n", stderr_bytes=b"")
    run = _ran(context, result, read_back=True)  # type: ignore[arg-type]
    assert run.exit_code == 1
    assert "killed" in run.log_tail
    assert not (tmp_path / ".incoming").exists()


def test_the_oracle_log_is_kept_while_the_folder_is_there(tmp_path: Path) -> None:
    logs = AgentLogs(sandbox_dir="/logs/agent", host_dir=tmp_path / "world__r0")
    logs.host_dir.mkdir()
    context = SimpleNamespace(sandbox=None, logs=logs)
    result = ExecResult(exit_code=0, stdout_bytes=b"done\n", stderr_bytes=b"")
    run = _ran(context, result, read_back=True)  # type: ignore[arg-type]
    assert run.exit_code == 0
    assert (logs.host_dir / "oracle.txt").read_bytes() == b"done\n"
