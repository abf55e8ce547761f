"""Each episode's phase, from the process that runs it to the controller: a small file per
trial in the run's scratch folder, rewritten (atomically) as the episode enters a phase and
read by the controller's live view.

xdist carries a report only when a phase of pytest's ends (setup, call); an episode's own
phases (making its images, seeding, the agent's turn, verifying) change inside them, and
xdist offers a plugin no other way from a worker to the controller. Workers run on the
controller's machine (the scratch folder is shared by the run's processes there)."""

from __future__ import annotations

import contextlib
import hashlib
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from pytest_harbor.atomic import write_atomically
from pytest_harbor.engine.progress import Phase

__all__ = ["PhaseBoard", "PhaseReport"]


class PhaseReport(BaseModel):
    """The phase a trial's episode entered, and when (seconds since the epoch)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    trial: str
    phase: Phase
    #: The turn (multi-step: the step's name) once the agent began.
    step: str | None = None
    since: float


class PhaseBoard:
    """The folder of phase reports: written by the processes that run episodes, read by
    the controller. Neither side fails for it: a report that cannot be written or read is
    left out (the live view then shows less, the episode runs the same)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _file(self, trial: str) -> Path:
        # A trial's node id has slashes and colons: its digest names the file.
        return self.folder / f"{hashlib.sha256(trial.encode()).hexdigest()[:24]}.json"

    def post(self, trial: str, phase: Phase, step: str | None) -> None:
        report = PhaseReport(trial=trial, phase=phase, step=step, since=time.time())
        with contextlib.suppress(OSError):
            write_atomically(self._file(trial), report.model_dump_json())

    def read(self, trial: str) -> PhaseReport | None:
        try:
            report = PhaseReport.model_validate_json(self._file(trial).read_bytes())
        except (OSError, ValidationError):
            return None
        return report if report.trial == trial else None
