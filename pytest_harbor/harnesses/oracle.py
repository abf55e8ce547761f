"""The oracle: runs the task's reference solution instead of an agent."""

from __future__ import annotations

from pytest_harbor.harnesses.base import AgentRun
from pytest_harbor.sandboxes.base import Sandbox
from pytest_harbor.tasks.task import Task, Turn

__all__ = ["OracleHarness"]

SOLUTION_DIR = "/solution"
ORACLE_LOG = "/logs/agent/oracle.txt"
_LOG_TAIL_BYTES = 4000
_NEXT_TURN = (
    f"rm -rf {SOLUTION_DIR}/* {SOLUTION_DIR}/.[!.]* {SOLUTION_DIR}/..?*; rm -f {ORACLE_LOG}"
)


class OracleHarness:
    """Uploads `solution/` to /solution and runs `bash /solution/solve.sh`."""

    name = "oracle"
    validates = True
    can_continue = False

    def __init__(self) -> None:
        #: Sandboxes whose /solution holds an earlier turn's solution.
        self._filled: set[str] = set()

    def unavailable_reason(self, task: Task) -> str | None:
        missing = [turn.name for turn in task.turns if turn.solve_script is None]
        if not missing:
            return None
        if not task.config.is_multi_step:
            return "unvalidated: the task has no solution/solve.sh"
        return f"unvalidated: step {missing[0]!r} has no solve.sh (its own or the task's)"

    def run_turn(self, sandbox: Sandbox, turn: Turn, *, workdir: str | None) -> AgentRun:
        if turn.solution_dir is None:
            raise ValueError(f"turn {turn.name} has no solution")
        if sandbox.id in self._filled:
            # A later turn: its own solution only, and a log the turn's user can write.
            sandbox.exec(["/bin/sh", "-c", _NEXT_TURN], user="root")
        sandbox.upload(turn.solution_dir, SOLUTION_DIR)
        self._filled.add(sandbox.id)
        result = sandbox.exec(
            ["bash", "-c", f"bash {SOLUTION_DIR}/solve.sh > {ORACLE_LOG} 2>&1"],
            user=turn.agent_user,
            workdir=workdir,
            env={"DEBIAN_FRONTEND": "noninteractive", **turn.solution_env},
            timeout=turn.agent_timeout_sec,
        )
        log_tail = ""
        if result.exit_code != 0 or result.timed_out:
            log = sandbox.download(ORACLE_LOG).get("oracle.txt", b"")
            log_tail = log[-_LOG_TAIL_BYTES:].decode("utf-8", errors="replace")
        return AgentRun(exit_code=result.exit_code, timed_out=result.timed_out, log_tail=log_tail)
