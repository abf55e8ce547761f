"""The harness protocol: what drives a turn in the sandbox (the oracle, nothing, an agent)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pytest_harbor.sandboxes.base import Sandbox
from pytest_harbor.tasks.task import Task, Turn

__all__ = ["AgentRun", "Harness"]


@dataclass(frozen=True)
class AgentRun:
    """What a harness reports for one turn."""

    exit_code: int | None = None
    timed_out: bool = False
    log_tail: str = ""
    response: str | None = None


class Harness(Protocol):
    """Accepts the sandbox for one turn and leaves it to the episode when it returns."""

    name: str
    #: True for the oracle: outcomes follow the validation contract (reward 1, exit 0).
    validates: bool
    #: Whether one session can carry on across the turns of a multi-step task
    #: (`turn_sessions = continue`); a fresh session per turn is the default.
    can_continue: bool

    def unavailable_reason(self, task: Task) -> str | None:
        """Why this harness cannot run `task` (its items are skipped), or None."""
        ...

    def run_turn(self, sandbox: Sandbox, turn: Turn, *, workdir: str | None) -> AgentRun:
        """Work on `turn` inside `sandbox` within `turn.agent_timeout_sec`."""
        ...
