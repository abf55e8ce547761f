"""`rollouts_failures.jsonl`: the episodes that ended with no result, one row each."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

from pytest_harbor.engine.failures import FailureKind
from pytest_harbor.engine.results import episode_id

__all__ = ["FailureRecord", "FailureStage"]

#: Where the episode was when it failed: waiting for a place under the cap, making its
#: image and sandbox (`seed`), or in a turn.
FailureStage = Literal["queue", "seed", "turn"]


class FailureRecord(BaseModel):
    """One row of rollouts_failures.jsonl. It never carries a reward or a response."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = 1
    task_id: str
    taskset: str
    repeat: int
    agent: str
    digest: str | None = None
    stage: FailureStage
    #: The turn the episode was in, when the stage is `turn`.
    step: str | None = None
    failure_kind: str
    failure_reason: str
    #: Whether `--harbor-resume` runs the episode again (every kind but the terminal ones).
    retry: bool
    run_id: str
    at: str

    @classmethod
    def new(
        cls,
        *,
        failure_kind: str,
        failure_reason: str,
        stage: FailureStage,
        **identity: object,
    ) -> FailureRecord:
        return cls.model_validate(
            {
                **identity,
                "stage": stage,
                "failure_kind": failure_kind,
                "failure_reason": failure_reason,
                "retry": failure_kind not in FailureKind.TERMINAL,
                "at": datetime.now(UTC).isoformat(timespec="milliseconds"),
            }
        )

    @property
    def episode_id(self) -> str:
        return episode_id(self.task_id, self.repeat)
