"""What each phase's report of a harbor item carries (plugin/item_reports.py), from the
hook itself: the payload of each phase, the failure an error becomes, the run stopped by
an engine that is gone, and the report's text made safe to show."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_harbor.engine import EpisodeError, FailureKind
from pytest_harbor.engine.failures import EngineGone
from pytest_harbor.plugin.item_reports import harbor_data, pytest_runtest_makereport
from pytest_harbor.plugin.nodes import HarborTurnItem
from pytest_harbor.plugin.payload import ReportedFailure, ReportPayload
from pytest_harbor.plugin.run import HARBOR_RUN
from pytest_harbor.redaction import Redactor
from pytest_harbor.sandboxes import SandboxError

SECRET = "tok-9d1c77aa02"
TASK = Path("/data/tasks/alpha/instruction.md")


def turn_item(
    *,
    payload: ReportPayload | None = None,
    skip_reason: str | None = None,
    unloadable: str | None = None,
) -> Any:
    """A turn item without a session around it: only what the hook reads of one."""
    item: Any = HarborTurnItem.__new__(HarborTurnItem)
    item.trial = SimpleNamespace(
        taskset="tasks",
        task=SimpleNamespace(id="alpha"),
        skip_reason=skip_reason,
        unloadable=unloadable,
    )
    item.harbor_payload = payload
    item.user_properties = []
    item.session = SimpleNamespace(shouldstop=False)
    item.config = SimpleNamespace(stash={HARBOR_RUN: SimpleNamespace(redactor=Redactor([SECRET]))})
    item.reportinfo = lambda: (TASK, 4, "alpha")
    return item


def raising(error: BaseException) -> Callable[[], None]:
    def call() -> None:
        raise error

    return call


def report_of(item: Any, when: str, action: Callable[[], None] = lambda: None) -> pytest.TestReport:
    """The report the hook makes of `action` run as `when`, from pytest's own."""
    call = pytest.CallInfo.from_call(action, when)  # type: ignore[arg-type]
    if call.excinfo is None:
        outcome, longrepr = "passed", None
    elif isinstance(call.excinfo.value, pytest.skip.Exception):
        outcome, longrepr = "skipped", ("/site/pytest_harbor/nodes.py", 9, "Skipped: stopped")
    else:
        outcome, longrepr = "failed", call.excinfo.getrepr(style="long")
    made = pytest.TestReport(
        "tasks/alpha::r0::episode", (str(TASK), 4, "alpha"), {}, outcome, longrepr, when
    )  # type: ignore[arg-type]
    hook = pytest_runtest_makereport(item, call)  # type: ignore[arg-type]
    next(hook)
    with pytest.raises(StopIteration) as done:
        hook.send(made)
    report: pytest.TestReport = done.value.value
    return report


def payload_of(report: pytest.TestReport) -> ReportPayload:
    payload = harbor_data(report)
    assert payload is not None
    return payload


class PlainItem(pytest.Item):
    def runtest(self) -> None:
        pass


def test_other_items_reports_carry_nothing() -> None:
    item = PlainItem.__new__(PlainItem)
    call = pytest.CallInfo.from_call(lambda: None, "call")
    made = pytest.TestReport("x::y", ("x", 0, "y"), {}, "passed", None, "call")
    hook = pytest_runtest_makereport(item, call)
    next(hook)
    with pytest.raises(StopIteration) as done:
        hook.send(made)
    assert done.value.value is made and harbor_data(made) is None


def test_the_setup_report_says_whether_the_trial_runs() -> None:
    runs = payload_of(report_of(turn_item(), "setup"))
    assert (runs.unvalidated, runs.unloadable, runs.skip_reason) == (False, None, None)
    unvalidated = payload_of(report_of(turn_item(skip_reason="no solve.sh"), "setup"))
    assert (unvalidated.unvalidated, unvalidated.skip_reason) == (True, "no solve.sh")
    unloadable = payload_of(
        report_of(turn_item(skip_reason="unloadable", unloadable="no image"), "setup")
    )
    assert (unloadable.unvalidated, unloadable.unloadable, unloadable.skip_reason) == (
        True,
        "no image",
        None,
    )


def test_the_call_report_carries_the_items_payload() -> None:
    carried = ReportPayload(taskset="tasks", task_id="alpha", step="episode", status="passed")
    assert payload_of(report_of(turn_item(payload=carried), "call")) == carried


@pytest.mark.parametrize("when", ["call", "teardown"])
def test_a_phase_without_a_payload_names_the_task(when: str) -> None:
    assert payload_of(report_of(turn_item(), when)) == ReportPayload(
        taskset="tasks", task_id="alpha"
    )


def test_an_episode_error_is_its_failure_named_in_its_own_words() -> None:
    item = turn_item()
    error = EpisodeError("harbor:sandbox_start_failed", f"no start ({SECRET})")
    report = report_of(item, "setup", raising(error))
    assert payload_of(report).failure == ReportedFailure(
        kind="harbor:sandbox_start_failed", reason=f"no start ({SECRET})"
    )
    assert payload_of(report).status is None
    assert item.user_properties == [("failure_kind", "harbor:sandbox_start_failed")]
    assert report.user_properties == item.user_properties
    # The engine's words alone, masked: no stack frames of ours.
    assert str(report.longrepr).strip() == "no start (***)"
    assert item.session.shouldstop is False


def test_an_engine_gone_stops_the_run() -> None:
    item = turn_item()
    report = report_of(item, "call", raising(EngineGone("harbor:engine_gone", "engine silent")))
    assert item.session.shouldstop == "engine silent"
    assert payload_of(report).failure == ReportedFailure(
        kind="harbor:engine_gone", reason="engine silent"
    )


def test_a_call_that_broke_down_without_a_result_is_an_error() -> None:
    report = report_of(turn_item(), "call", raising(RuntimeError("first\nlast line")))
    payload = payload_of(report)
    assert payload.status == "error"
    assert payload.failure == ReportedFailure(kind=FailureKind.INTERNAL_ERROR, reason="last line")
    # A bug of ours is shown with its stack frames.
    assert "raise error" in str(report.longrepr)


def test_a_sandbox_error_is_shown_in_its_own_words() -> None:
    report = report_of(turn_item(), "call", raising(SandboxError("sandbox x is gone")))
    assert payload_of(report).status == "error"
    assert str(report.longrepr).strip() == "sandbox x is gone"


def test_a_setup_that_failed_otherwise_is_an_internal_error() -> None:
    report = report_of(turn_item(), "setup", raising(ValueError("bad value")))
    payload = payload_of(report)
    assert payload.status is None
    assert payload.failure == ReportedFailure(
        kind=FailureKind.INTERNAL_ERROR, reason="ValueError: bad value"
    )


def test_a_failing_call_with_a_payload_keeps_it_without_a_failure() -> None:
    carried = ReportPayload(taskset="tasks", task_id="alpha", step="episode")
    report = report_of(turn_item(payload=carried), "call", raising(AssertionError("reward 0")))
    assert payload_of(report) == carried


def test_a_skip_points_at_the_task_and_is_no_error() -> None:
    report = report_of(turn_item(), "call", raising(pytest.skip.Exception("stopped")))
    assert report.longrepr == (str(TASK), 5, "Skipped: stopped")
    assert payload_of(report) == ReportPayload(taskset="tasks", task_id="alpha")
