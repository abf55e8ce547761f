"""The oracle: runs the task's reference solution instead of an agent."""

from __future__ import annotations

import contextlib
import tarfile
from collections.abc import Mapping
from typing import Any, ClassVar

from pytest_harbor.harnesses.base import (
    AgentLogs,
    AgentRun,
    Harness,
    HarnessSession,
    SessionContext,
    TurnContext,
    no_options,
)
from pytest_harbor.sandboxes.archives import pack_folder
from pytest_harbor.sandboxes.base import (
    ROOT_USER,
    TRUSTED_BUSYBOX,
    ExecResult,
    Sandbox,
    SandboxError,
    is_root_user,
)
from pytest_harbor.sandboxes.copies import LOG_FILE_COPY, bounded, members
from pytest_harbor.sandboxes.output import EXEC_OUTPUT_CAP
from pytest_harbor.tasks.task import Task

__all__ = ["OracleHarness"]

SOLUTION_DIR = "/solution"
ORACLE_LOG = "/logs/agent/oracle.txt"
_LOG_NAME = "oracle.txt"  # kept as agent/<episode>/oracle.txt
_LOG_TAIL_BYTES = 4000
#: How long reading the end of the log may take.
_TAIL_TIMEOUT_S = 10.0
#: Of solve.sh's output, this much is kept with the results (agent/<episode>/oracle.txt).
LOG_CAP_BYTES = 8 * 1024 * 1024
_NEXT_TURN = (
    f"rm -rf {SOLUTION_DIR}/* {SOLUTION_DIR}/.[!.]* {SOLUTION_DIR}/..?*; rm -f {ORACLE_LOG}"
)
_UNPACK_FAILED = "pytest-harbor-error: cannot unpack the solution"
_UNPACK = f'tar -x -f - -C {SOLUTION_DIR} || {{ echo "{_UNPACK_FAILED}" >&2; exit 97; }}; '
_NOT_REGULAR = "pytest-harbor-oracle-log: not a regular file"
#: A log up to this long comes back with solve.sh's exec (an exec keeps twice as much of
#: its output uncut); a longer one is copied through the archive API.
_READ_BACK_BYTES = min(LOG_CAP_BYTES, EXEC_OUTPUT_CAP // 2)
#: After solve.sh, in the same exec: its log, when a regular file, on stdout (a byte past
#: _READ_BACK_BYTES says it is longer), read by the trusted busybox within
#: _TAIL_TIMEOUT_S; solve.sh's exit status is the exec's. (The log is solve.sh's own
#: output: nothing graded comes this way.)
_READ_BACK = (
    f"status=$?; if [ -f {ORACLE_LOG} ] && [ ! -L {ORACLE_LOG} ]; then "
    f"{TRUSTED_BUSYBOX} timeout {_TAIL_TIMEOUT_S:g} "
    f"{TRUSTED_BUSYBOX} head -c {_READ_BACK_BYTES + 1} {ORACLE_LOG}; "
    f'else echo "{_NOT_REGULAR}" >&2; fi; exit $status'
)


class OracleHarness(Harness):
    """Uploads `solution/` to /solution and runs `bash /solution/solve.sh`."""

    name = "oracle"
    validates: ClassVar[bool] = True
    trusted: ClassVar[bool] = True

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        no_options(self.name, options or {})

    def unavailable_reason(self, task: Task) -> str | None:
        missing = [turn.name for turn in task.turns if turn.solve_script is None]
        if not missing:
            return None
        if not task.config.is_multi_step:
            return "unvalidated: the task has no solution/solve.sh"
        return f"unvalidated: step {missing[0]!r} has no solve.sh (its own or the task's)"

    def open_session(self, context: SessionContext) -> HarnessSession:
        return _OracleSession()


class _OracleSession:
    def run_turn(self, context: TurnContext) -> AgentRun:
        turn, sandbox = context.turn, context.sandbox
        if turn.solution_dir is None:
            raise ValueError(f"turn {turn.name} has no solution")
        solution = turn.solution_dir

        def execute(script: str, stdin: bytes | None = None) -> ExecResult:
            return sandbox.exec(
                ["bash", "-c", script],
                user=context.agent_user,
                workdir=context.workdir,
                env={"DEBIAN_FRONTEND": "noninteractive", **turn.solution_env},
                timeout=context.deadline.remaining(),
                stdin=stdin,
            )

        # A later turn gets its own solution only, and a log its user can write.
        later = context.index > 0
        run = f"bash {SOLUTION_DIR}/solve.sh > {ORACLE_LOG} 2>&1"
        if is_root_user(context.agent_user or ""):
            # As root, one exec: clear, unpack the solution from stdin, run it, read its log.
            result = execute(
                (_NEXT_TURN + "; " if later else "") + _UNPACK + run + "; " + _READ_BACK,
                pack_folder(solution),
            )
            if _UNPACK_FAILED not in result.stderr:
                return _ran(context, result, read_back=True)
            # An image without tar: upload the solution through the engine instead.
        elif later:
            sandbox.exec(["/bin/sh", "-c", _NEXT_TURN], user=ROOT_USER)
        sandbox.upload(solution, SOLUTION_DIR)
        return _ran(context, execute(run))

    def close(self, context: SessionContext) -> None:
        pass


def _ran(context: TurnContext, result: ExecResult, *, read_back: bool = False) -> AgentRun:
    sandbox = context.sandbox
    log = result.stdout_bytes
    whole = len(log) <= _READ_BACK_BYTES and _NOT_REGULAR not in result.stderr
    if read_back and whole and not result.timed_out:
        # The log came back with the exec: kept as it is, its end the tail.
        with contextlib.suppress(FileNotFoundError):  # the run has cleared its folder
            context.logs.place(_LOG_NAME).write_bytes(log)
        failed = result.exit_code != 0
        tail = log[-_LOG_TAIL_BYTES:].decode("utf-8", "replace") if failed else ""
        return AgentRun(exit_code=result.exit_code, timed_out=False, log_tail=tail)
    trouble = _keep_log(sandbox, context.logs)
    log_tail = ""
    if result.exit_code != 0 or result.timed_out:
        if trouble is not None:
            log_tail = trouble
        else:
            # Its end only (the log may be huge), with the engine's own `tail`, within a
            # deadline: the log may have become something else since it was looked at.
            tail_run = sandbox.exec(
                [
                    TRUSTED_BUSYBOX,
                    "timeout",
                    f"{_TAIL_TIMEOUT_S:g}",
                    TRUSTED_BUSYBOX,
                    "tail",
                    "-c",
                    str(_LOG_TAIL_BYTES),
                    ORACLE_LOG,
                ],
                user=ROOT_USER,
                timeout=_TAIL_TIMEOUT_S + 5,
            )
            log_tail = tail_run.stdout if tail_run.exit_code == 0 else ""
    return AgentRun(exit_code=result.exit_code, timed_out=result.timed_out, log_tail=log_tail)


def _keep_log(sandbox: Sandbox, logs: AgentLogs) -> str | None:
    """solve.sh's output (stdout and stderr), copied to `logs` through the engine's
    archive API within LOG_FILE_COPY: its first LOG_CAP_BYTES, the cut marked. Returns
    why it could not be kept when it is not a regular file (solve.sh may have made it
    anything: a FIFO that would hold every reader) or the copy broke off or reached its
    cap; None when it was kept, or is not there."""
    try:
        chunks = sandbox.iter_archive(ORACLE_LOG)
        if chunks is None:
            return None
        with bounded(chunks, LOG_FILE_COPY, ORACLE_LOG) as stream:
            for archive, member in members(stream):
                source = archive.extractfile(member) if member.isreg() else None
                if source is None:
                    return f"(solve.sh's log {ORACLE_LOG} is not a regular file: not read)"
                with logs.place(_LOG_NAME).open("wb") as handle:
                    handle.write(source.read(LOG_CAP_BYTES))
                    if member.size > LOG_CAP_BYTES:
                        cut = member.size - LOG_CAP_BYTES
                        handle.write(f"\n[... {cut} bytes cut ...]\n".encode())
                return None
    except (tarfile.TarError, OSError, SandboxError) as error:
        return f"(solve.sh's log {ORACLE_LOG} could not be read: {error})"
    return None
