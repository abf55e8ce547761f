"""Reporting hooks: episode data on test reports, the controller's writes, the summary."""

from __future__ import annotations

import base64
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_harbor.engine import EpisodeError, EpisodeResult
from pytest_harbor.plugin.nodes import HarborTurnItem
from pytest_harbor.plugin.run import HarborRun
from pytest_harbor.sandboxes import SandboxError
from pytest_harbor.tasks import TaskLoadError
from pytest_harbor.writers.materialized import SkippedLog, write_task_rows

__all__ = ["HarborReporter", "pytest_report_teststatus", "pytest_runtest_makereport"]


@dataclass
class _TasksetTally:
    episodes: int = 0
    reward_sum: float = 0.0
    outcomes: dict[str, int] = field(default_factory=dict)


@dataclass
class _Tally:
    """What the controller has seen: per taskset, and whether anything was validatable."""

    tasksets: dict[str, _TasksetTally] = field(default_factory=dict)
    items: int = 0
    unvalidated: int = 0

    def episode(self, result: EpisodeResult) -> None:
        tally = self.tasksets.setdefault(result.taskset, _TasksetTally())
        tally.episodes += 1
        tally.reward_sum += result.reward

    def outcome(self, taskset: str, status: str) -> None:
        tally = self.tasksets.setdefault(taskset, _TasksetTally())
        tally.outcomes[status] = tally.outcomes.get(status, 0) + 1

    @property
    def nothing_validatable(self) -> bool:
        return self.items > 0 and self.items == self.unvalidated


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if not isinstance(item, HarborTurnItem):
        return report
    data: dict[str, Any] = {"taskset": item.trial.taskset, "task_id": item.trial.task.id}
    if call.when == "setup":
        data["unvalidated"] = item.trial.skip_reason is not None
        if item.trial.unloadable is not None:
            data["unloadable"] = item.trial.unloadable
    elif call.when == "call":
        if item.harbor_payload is not None:
            data.update(item.harbor_payload)
        elif call.excinfo is not None and not isinstance(call.excinfo.value, pytest.skip.Exception):
            # The episode broke down before it had a result: that is an error, not a fail.
            data["status"] = "error"
    if report.skipped and isinstance(report.longrepr, tuple):
        # Skips from inside runtest point at this package; point at the task instead.
        path, line, _ = item.reportinfo()
        report.longrepr = (str(path), (line or 0) + 1, report.longrepr[2])
    error = call.excinfo.value if call.excinfo is not None else None
    if isinstance(error, EpisodeError):
        data["failure"] = {"kind": error.failure_kind, "reason": error.reason}
    if isinstance(error, EpisodeError | SandboxError):
        # The engine's own words say what broke; our stack frames would not help.
        report.longrepr = call.excinfo.getrepr(style="value")  # type: ignore[union-attr]
    # Plain JSON data: xdist carries it from the worker to the controller.
    report.harbor = data  # type: ignore[attr-defined]
    return report


@pytest.hookimpl(tryfirst=True)
def pytest_report_teststatus(
    report: pytest.TestReport | pytest.CollectReport, config: pytest.Config
) -> tuple[str, str, str] | None:
    data = getattr(report, "harbor", None)
    if report.when == "call" and report.failed and data and data.get("status") == "error":
        return "error", "E", "ERROR"
    return None


class HarborReporter:
    """Registered on the controller (or the sole process): writes the result files as
    reports arrive, decides the exit status and prints the summary."""

    def __init__(self, run: HarborRun) -> None:
        assert run.writer is not None
        self.run = run
        self.writer = run.writer
        self.skipped = SkippedLog(run.layout)
        self.tally = _Tally()

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Before any worker starts: plan every target and write its materialized rows
        and skipped.json; the rows' digests go to the workers with their start-up data."""
        if session.config.option.collectonly:
            return
        self.writer.start(self.run.tasksets)
        for target in self.run.targets.values():
            try:
                plan = self.run.plan(target)
            except TaskLoadError:
                continue  # collection reports it, as an error of the taskset
            write_task_rows(self.run.layout, self.run.harness.name, plan)
            skipped = {}
            if self.run.options.skip_unloadable:
                skipped = {path.name: str(error) for path, error in plan.failures.items()}
            self.skipped.start(plan.taskset, skipped)
            for task in plan.tasks:
                self.run.row_digests[f"{plan.taskset}/{task.id}"] = task.digest
                self.run.trial_ids.update(
                    f"{plan.taskset}/{task.id}::r{repeat}" for repeat in range(plan.repeats)
                )

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        data = getattr(report, "harbor", None)
        if not data:
            return
        if report.when == "setup":
            self.tally.items += 1
            self.tally.unvalidated += int(bool(data.get("unvalidated")))
            if "unloadable" in data:
                self.skipped.add(data["taskset"], data["task_id"], data["unloadable"])
        if report.when != "call":
            return
        if "verifier_files" in data:
            files = {name: base64.b64decode(blob) for name, blob in data["verifier_files"].items()}
            self.writer.write_turn_files(data["taskset"], data["episode_id"], data["step"], files)
        if "status" in data:
            self.tally.outcome(data["taskset"], str(data["status"]))
        if "result" in data:
            result = EpisodeResult.model_validate(data["result"])
            self.writer.append_row(result)
            self.tally.episode(result)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.run.harness.validates and self.tally.nothing_validatable:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.tally.tasksets and not self.tally.items:
            return
        terminalreporter.section("harbor")
        for taskset, counts in sorted(self.tally.tasksets.items()):
            mean = counts.reward_sum / counts.episodes if counts.episodes else 0.0
            outcomes = ", ".join(f"{n} {status}" for status, n in sorted(counts.outcomes.items()))
            terminalreporter.write_line(
                f"{taskset}: {counts.episodes} episodes, mean reward {mean:.3f} ({outcomes}); "
                f"rows in {self.run.layout.rollouts_file(taskset)}"
            )
        if self.run.harness.validates and self.tally.nothing_validatable:
            terminalreporter.write_line(
                "no selected task has a solution/solve.sh: nothing was validated", red=True
            )
