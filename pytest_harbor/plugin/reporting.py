"""The state shared by the controller's reporting plugins, each with one job: the
pre-flight (preflight.py), result recording (recording.py) and the terminal (summary.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_harbor.plugin.builds import BuildsAhead
from pytest_harbor.plugin.ledger import EpisodeLedger
from pytest_harbor.plugin.planned import PlannedRun
from pytest_harbor.plugin.run import HarborRun
from pytest_harbor.relay import RunSpend
from pytest_harbor.writers import RolloutsWriter
from pytest_harbor.writers.materialized import SkippedLog

if TYPE_CHECKING:
    from pytest_harbor.plugin.checks import Problem, TaskCheck

__all__ = [
    "RunReport",
    "first_line",
]


@dataclass(eq=False)
class RunReport:
    """What the controller (or the sole process) learns of the run as it goes, shared by
    the pre-flight, the recorder and the terminal summary; a worker has none.

    Made where the controller's plugins are registered (`RunReport.of`), with the run's
    writer, ledger, skipped log, builds ahead and check, which each of them uses. What the
    pre-flight (`PreFlight`) writes is the plan (`planned`, see PlannedRun); every field
    here is the recorder's (`ResultRecorder`). The terminal summary only reads."""

    run: HarborRun
    #: What the pre-flight settled before any worker started.
    planned: PlannedRun
    writer: RolloutsWriter
    ledger: EpisodeLedger
    skipped: SkippedLog
    builds: BuildsAhead
    #: Check mode's findings: fed every report, read at the end of the run.
    check: TaskCheck | None
    #: Episodes seeded (setup reports), and of them those with nothing to validate.
    items: int = 0
    unvalidated: int = 0
    #: Episodes a resumed run kept (of the trials this run planned): how many, how many of
    #: them failed, and whether they were all there was to run.
    kept: int = 0
    kept_failed: int = 0
    all_kept: bool = False
    #: Sandboxes removed that workers of this run which died had left.
    reaped: int = 0
    interrupted: bool = False
    #: Episodes under way or waiting when the run was interrupted.
    cut_short: int = 0
    #: The run's model spend as the relay last counted it (at the end of the session).
    spend: RunSpend | None = None
    #: Results that could not be written (a full disk, say), and why the last did not.
    unwritten: int = 0
    unwritten_reason: str = ""
    problems: dict[tuple[str, str], list[Problem]] = field(default_factory=dict)
    check_files: dict[str, Path] = field(default_factory=dict)
    #: The HTML reports written at the end of the run, and those that failed.
    reports: list[Path] = field(default_factory=list)
    report_errors: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, run: HarborRun, planned: PlannedRun) -> RunReport:
        assert not run.is_worker, "only the controller reports"
        check = None
        if run.options.check:
            from pytest_harbor.plugin.checks import TaskCheck  # check mode only

            check = TaskCheck(run.options.repeats or 1)
        return cls(
            run=run,
            planned=planned,
            writer=RolloutsWriter(run.layout, run.redactor, run.run_id),
            ledger=EpisodeLedger(
                run_id=run.run_id,
                agent=run.harness.name,
                validation=run.harness.validates,
                pass_reward=run.options.pass_reward,
            ),
            skipped=SkippedLog(run.layout),
            builds=BuildsAhead(run, planned),
            check=check,
        )

    @property
    def nothing_validatable(self) -> bool:
        return self.items > 0 and self.items == self.unvalidated


def first_line(text: str, limit: int = 200) -> str:
    """The first line of a message, cut to `limit` characters."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."
