"""The nop harness: does nothing, so a sound task scores 0."""

from __future__ import annotations

from pytest_harbor.harnesses.base import AgentRun
from pytest_harbor.sandboxes.base import Sandbox
from pytest_harbor.tasks.task import Task, Turn

__all__ = ["NopHarness"]


class NopHarness:
    name = "nop"
    validates = False
    can_continue = False

    def unavailable_reason(self, task: Task) -> str | None:
        return None

    def run_turn(self, sandbox: Sandbox, turn: Turn, *, workdir: str | None) -> AgentRun:
        return AgentRun()
