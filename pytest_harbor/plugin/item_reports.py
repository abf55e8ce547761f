"""What each report of a harbor item carries: the episode's result or failure as a
ReportPayload, dumped to plain JSON data (xdist carries a report's attributes from the
worker to the controller), with what the terminal and the junit XML show made safe to
show: every secret value masked, every control character escaped."""

from __future__ import annotations

from collections.abc import Generator

import pytest

from pytest_harbor.engine import EpisodeError, FailureKind
from pytest_harbor.engine.failures import EngineGone
from pytest_harbor.plugin.ledger import trial_of
from pytest_harbor.plugin.nodes import HarborTurnItem
from pytest_harbor.plugin.payload import ReportedFailure, ReportPayload
from pytest_harbor.plugin.planned import PLANNED_RUN
from pytest_harbor.plugin.run import HARBOR_RUN
from pytest_harbor.redaction import Redactor
from pytest_harbor.sandboxes import SandboxError

__all__ = ["harbor_data", "pytest_report_teststatus", "pytest_runtest_makereport"]

#: The attribute of a report that holds the harbor data.
_DATA = "harbor"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Each report of a harbor item carries data (see harbor_data) with the episode's
    result or failure."""
    report = yield
    if not isinstance(item, HarborTurnItem):
        return report
    payload = _phase_payload(item, call)
    if report.skipped and isinstance(report.longrepr, tuple):
        # Skips from inside runtest point at this package; point at the task instead.
        path, line, _ = item.reportinfo()
        report.longrepr = (str(path), (line or 0) + 1, report.longrepr[2])
    excinfo = call.excinfo
    error = excinfo.value if excinfo is not None else None
    if isinstance(error, EngineGone):
        # The run stops here, with this one message (xdist carries it from a worker).
        item.session.shouldstop = error.reason
    if isinstance(error, EpisodeError):
        item.user_properties.append(("failure_kind", error.failure_kind))
        report.user_properties = list(item.user_properties)
    failure = _reported_failure(call, report, payload)
    if failure is not None:
        payload = payload.model_copy(update={"failure": failure})
    if excinfo is not None and isinstance(error, EpisodeError | SandboxError):
        # The engine's own words say what broke; our stack frames would not help.
        report.longrepr = excinfo.getrepr(style="value")
    _make_shown(report, item.config.stash[HARBOR_RUN].redactor)
    # Plain JSON data: xdist carries it (the report's __dict__) to the controller.
    report.__dict__[_DATA] = payload.dump()
    return report


def _phase_payload(item: HarborTurnItem, call: pytest.CallInfo[None]) -> ReportPayload:
    """What the phase's report says of the trial: at setup whether it runs, at the call
    the payload the item made, else only the task's name."""
    trial = item.trial
    if call.when == "setup":
        return ReportPayload(
            taskset=trial.taskset,
            task_id=trial.task.id,
            unvalidated=trial.skip_reason is not None,
            unloadable=trial.unloadable,
            skip_reason=trial.skip_reason if trial.unloadable is None else None,
        )
    if call.when == "call" and item.harbor_payload is not None:
        return item.harbor_payload
    payload = ReportPayload(taskset=trial.taskset, task_id=trial.task.id)
    if call.when == "call" and _broke_down(call):
        # The episode broke down before it had a result: that is an error, not a fail.
        return payload.model_copy(update={"status": "error"})
    return payload


def _broke_down(call: pytest.CallInfo[None]) -> bool:
    """Whether the phase raised something other than a skip."""
    return call.excinfo is not None and not isinstance(call.excinfo.value, pytest.skip.Exception)


def _reported_failure(
    call: pytest.CallInfo[None], report: pytest.TestReport, payload: ReportPayload
) -> ReportedFailure | None:
    """Why the episode has no result: an EpisodeError's kind and reason; for any other
    error in a setup that failed, or in a call that broke down, an internal error named by
    the error's last line."""
    excinfo = call.excinfo
    if excinfo is None:
        return None
    error = excinfo.value
    if isinstance(error, EpisodeError):
        return ReportedFailure(kind=error.failure_kind, reason=error.reason)
    if (call.when == "setup" and report.failed) or payload.status == "error":
        return ReportedFailure(
            kind=FailureKind.INTERNAL_ERROR,
            reason=excinfo.exconly().strip().splitlines()[-1],
        )
    return None


def _make_shown(report: pytest.TestReport, redactor: Redactor) -> None:
    """What a report shows (failure text, captured output and log, properties) is as
    Redactor.shown renders it: no secret value and no raw control character reaches the
    terminal or the junit XML. A failure whose text changes is shown as that text."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):
        path, line, message = longrepr
        report.longrepr = (path, line, redactor.shown(message))
    elif longrepr is not None:
        text = str(longrepr)
        shown = redactor.shown(text)
        if shown != text:
            report.longrepr = shown
    report.sections = [(title, redactor.shown(body)) for title, body in report.sections]
    report.user_properties = [
        (name, redactor.shown(value) if isinstance(value, str) else value)
        for name, value in report.user_properties
    ]


def harbor_data(report: pytest.TestReport | pytest.CollectReport) -> ReportPayload | None:
    """The payload pytest_runtest_makereport put on a harbor item's report (None for any
    other report, and for data that is not a payload)."""
    return ReportPayload.load(report.__dict__.get(_DATA))


@pytest.hookimpl(tryfirst=True)
def pytest_report_teststatus(
    report: pytest.TestReport | pytest.CollectReport, config: pytest.Config
) -> tuple[str, str, str] | None:
    data = harbor_data(report)
    if report.when == "call" and report.failed and data is not None and data.status == "error":
        return "error", "E", "ERROR"
    if report.when not in ("setup", "call", "teardown") and report.failed:
        # xdist's report for an item whose worker died: the episode has no result.
        planned = config.stash.get(PLANNED_RUN, None)
        if planned is not None and trial_of(report.nodeid) in planned.trial_ids:
            return "error", "E", "ERROR"
    return None
