"""What a harbor item's test report carries from the xdist worker that ran it to the
controller: one model, dumped to plain JSON data on the worker and loaded back there."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from pytest_harbor.engine.outcomes import Status
from pytest_harbor.engine.results import EpisodeResult

__all__ = ["ReportPayload", "ReportedFailure"]


class ReportedFailure(BaseModel):
    """Why the episode ended with no result: a failure kind and its reason."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    kind: str
    reason: str


class ReportPayload(BaseModel):
    """The harbor data of one report of a harbor item. A key it does not know is ignored,
    and one it lacks reads as its default: the controller reads what it needs, as the
    report of a phase has it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    #: The item's taskset and task (every report names them).
    taskset: str = ""
    task_id: str = ""
    #: Setup: the harness cannot run the task (the trial is skipped), and why.
    unvalidated: bool | None = None
    skip_reason: str | None = None
    #: Setup: why the task could not be built, when --harbor-skip-unloadable skipped it.
    unloadable: str | None = None
    #: Call: the turn that ran and where its verifier files are (as placed with the row).
    episode_id: str | None = None
    step: str | None = None
    verifier_dir: str | None = None
    #: Call: the episode's row, carried by the item that ends the episode.
    result: EpisodeResult | None = None
    #: Call: the turn's outcome; `error` when the episode broke down with no result.
    status: Status | None = None
    #: Why the episode ended with no result, when it did.
    failure: ReportedFailure | None = None

    def dump(self) -> dict[str, Any]:
        """Plain JSON data, as xdist carries a report's attributes between processes."""
        return self.model_dump(mode="json")

    @classmethod
    def load(cls, data: object) -> ReportPayload | None:
        """The payload `data` holds; None for data that is not one (not a dict, or a
        dict whose values do not fit), as for a report that carries none."""
        if not isinstance(data, dict):
            return None
        try:
            return cls.model_validate(data)
        except ValidationError:
            return None
