"""The nop harness: does nothing, so a sound task scores 0."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pytest_harbor.harnesses.base import (
    AgentRun,
    Harness,
    HarnessSession,
    SessionContext,
    TurnContext,
    no_options,
)

__all__ = ["NopHarness"]


class NopHarness(Harness):
    name = "nop"
    trusted: ClassVar[bool] = True

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        no_options(self.name, options or {})

    def open_session(self, context: SessionContext) -> HarnessSession:
        return _NopSession()


class _NopSession:
    def run_turn(self, context: TurnContext) -> AgentRun:
        return AgentRun()

    def close(self, context: SessionContext) -> None:
        pass
