"""Results as they arrive: each episode's row or failure goes to the taskset's files the
moment its report reaches the controller; at the end the summaries, the check, the HTML
report and the exit status."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pytest_harbor.display import harbor_logger
from pytest_harbor.engine import FailureKind
from pytest_harbor.engine.failures import disk_full
from pytest_harbor.plugin.item_reports import harbor_data
from pytest_harbor.plugin.ledger import TrialRecord, split_trial, trial_id, trial_of
from pytest_harbor.plugin.nodes import HarborWarning
from pytest_harbor.plugin.payload import ReportedFailure, ReportPayload
from pytest_harbor.plugin.preflight import warn_once
from pytest_harbor.plugin.reporting import RunReport, first_line
from pytest_harbor.relay import RelayError
from pytest_harbor.run.durations import record_history
from pytest_harbor.writers.failures import FailureRecord
from pytest_harbor.writers.rollouts import REPORT
from pytest_harbor.writers.rows import read_rows
from pytest_harbor.writers.summary import run_summary, write_run_summary

__all__ = ["ResultRecorder"]

log = harbor_logger()


class ResultRecorder:
    """Registered on the controller (or the sole process)."""

    def __init__(self, state: RunReport) -> None:
        self.state = state
        self.run = state.run

    # ------------------------------------------------------------------------ during

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.state.ledger.select(item.nodeid for item in session.items)
        self._build_ahead(item.nodeid for item in session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self.state.ledger.select(ids)
        self._build_ahead(ids)

    def _build_ahead(self, nodeids: Iterable[str]) -> None:
        """Start making the images of the trials the run selected (once)."""
        builds, plans = self.state.builds, self.state.planned.plans
        if builds.started or not plans:
            return
        tasks = {taskset: {task.id: task for task in plan.tasks} for taskset, plan in plans.items()}
        selected = []
        for nodeid in nodeids:
            taskset, task_name, _ = split_trial(trial_of(nodeid))
            task = tasks.get(taskset, {}).get(task_name)
            if task is not None:
                selected.append((taskset, task))
        builds.start(selected)

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        record = self.state.ledger.get(nodeid)
        if record is not None:
            if not record.started:
                record.began_at = time.monotonic()
            record.started = True
            record.step = nodeid.rsplit("::", 1)[1]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        state = self.state
        if state.check is not None:
            state.check.add(report)
        record = state.ledger.get(report.nodeid)
        if report.when not in ("setup", "call", "teardown"):
            # xdist's report for the item a worker was running when it died.
            if record is not None and report.failed:
                self._worker_died(record, report)
            return
        payload = harbor_data(report)
        if payload is None or record is None:
            return
        if report.when == "setup":
            self._setup(record, report, payload)
        elif report.when == "call":
            self._call(record, payload)

    def _setup(
        self, record: TrialRecord, report: pytest.TestReport, payload: ReportPayload
    ) -> None:
        state = self.state
        state.items += 1
        state.unvalidated += int(bool(payload.unvalidated))
        if payload.unloadable is not None:
            state.skipped.add(payload.taskset, payload.task_id, payload.unloadable)
            record.skip_reason = f"unloadable: {payload.unloadable}"
        elif report.skipped:
            record.skip_reason = payload.skip_reason or _skip_text(report)
        if report.passed:
            record.seeded = True
        elif report.failed:
            self._failed(record, payload)

    def _call(self, record: TrialRecord, payload: ReportPayload) -> None:
        result = payload.result
        if result is not None:
            if record.finished:
                return  # one row per episode, whatever a worker sends twice
            try:
                self.state.writer.append_row(result)
            except OSError as error:
                self._not_written(record, error)
                return
            record.result = result
        elif payload.status == "error":
            self._failed(record, payload)

    def _failed(self, record: TrialRecord, payload: ReportPayload) -> None:
        failure = payload.failure or ReportedFailure(
            kind=FailureKind.INTERNAL_ERROR,
            reason="the episode ended with an error and no reason",
        )
        self._write_failure(self.state.ledger.failed(record, failure.kind, failure.reason))

    def _worker_died(self, record: TrialRecord, report: pytest.TestReport) -> None:
        reason = str(report.longrepr).strip().splitlines()[0] if report.longrepr else ""
        failure = self.state.ledger.failed(
            record,
            FailureKind.WORKER_DIED,
            f"the process running the episode died ({reason or 'no word from it'})",
        )
        self._write_failure(failure)
        # Its sandboxes now belong to a process that is gone: remove them at once.
        self.state.reaped += self.run.reap()

    def _write_failure(self, failure: FailureRecord | None) -> None:
        if failure is None:
            return
        try:
            self.state.writer.append_failure(failure)
        except OSError as error:
            self._unwritable(self.run.layout.taskset_dir(failure.taskset), error)

    def _not_written(self, record: TrialRecord, error: OSError) -> None:
        """The episode's row could not be written (a full disk, say): it counts as an
        episode without a result, which --harbor-resume runs again."""
        folder = self.run.layout.taskset_dir(record.taskset)
        full = disk_full(error, folder)
        kind, reason = (
            (full.failure_kind, full.reason)
            if full is not None
            else (FailureKind.INTERNAL_ERROR, f"its row could not be written to {folder}: {error}")
        )
        self._write_failure(self.state.ledger.failed(record, kind, reason))
        self._unwritable(folder, error)

    def _unwritable(self, folder: Path, error: OSError) -> None:
        full = disk_full(error, folder)
        reason = full.reason if full is not None else f"{folder}: {error}"
        self.state.unwritten += 1
        self.state.unwritten_reason = reason
        log.warning("a result was not written: %s", reason)

    # ------------------------------------------------------------------------ finish

    @pytest.hookimpl(tryfirst=True)
    def pytest_keyboard_interrupt(self) -> None:
        """Noted here, not read from the exit status: pytest reports an internal error
        instead when printing the interrupt's traceback fails."""
        self.state.interrupted = True

    @pytest.hookimpl(tryfirst=True)
    def _take_spend(self, session: pytest.Session) -> None:
        """The run's spend as the relay counted it; a run its budget stopped ends with a
        failing status, whatever else passed."""
        relay = self.run.relay
        if relay is None:
            return
        with contextlib.suppress(RelayError):
            self.state.spend = relay.spend()
        spend = self.state.spend
        if spend is not None and spend.budget_reached and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """After pytest's own: an interrupted run's last items are torn down there. Their
        sandboxes are removed in the background and their harness sessions closed there:
        what a session's close writes is staged before the staging is settled."""
        self.run.wait_for_cleanup()
        state = self.state
        state.builds.close()
        if session.config.option.collectonly or not state.planned.manifests:
            return
        self._take_spend(session)
        if state.check is not None:
            self._finish_check(session)
        interrupted = state.interrupted or session.exitstatus == pytest.ExitCode.INTERRUPTED
        if interrupted:
            for failure in state.ledger.interrupted():
                state.cut_short += 1
                # An interruption alone does not begin a folder: the earlier run stays.
                state.writer.append_failure(failure, begins=False)
        finished_at = datetime.now(UTC).isoformat(timespec="milliseconds")
        for taskset in state.planned.manifests:
            try:
                state.writer.finish(taskset, ran=state.ledger.ran_any(taskset))
            except OSError as error:
                self._unwritable(self.run.layout.taskset_dir(taskset), error)
        summaries = []
        for taskset, manifest in state.planned.manifests.items():
            if not state.writer.begun(taskset):
                continue
            self._record_durations(taskset)
            summary = run_summary(
                self.run.layout,
                manifest,
                finished_at=finished_at,
                interrupted=interrupted,
                episodes=list(state.ledger.entries(taskset)),
                score=state.ledger.score(taskset),
            )
            try:
                summaries.append(
                    write_run_summary(self.run.layout, taskset, summary, self.run.redactor)
                )
            except OSError as error:
                self._unwritable(self.run.layout.taskset_dir(taskset), error)
        self._write_reports(session.config, summaries)
        if state.unwritten:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if self.run.harness.validates and state.nothing_validatable:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        self._count_kept(session)
        self._evaluation_exit(session)

    def _evaluation_exit(self, session: pytest.Session) -> None:
        """`exit_status = "results"`: a run that gave every selected episode a result exits
        0, whatever the rewards; one where an episode has none (no result, masked, not run)
        exits 1. pytest's other statuses (interrupted, a usage or internal error), a result
        this machine could not write and an oracle run with nothing to validate stay."""
        state = self.state
        if self.run.options.settings.exit_status != "results" or state.check is not None:
            return
        if session.exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
            return
        if state.unwritten or (self.run.harness.validates and state.nothing_validatable):
            return
        without = sum(
            state.ledger.score(taskset).count(status)
            for taskset in state.planned.manifests
            for status in ("no_result", "masked", "not_run")
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED if without else pytest.ExitCode.OK

    def _record_durations(self, taskset: str) -> None:
        """This run's episode and build times join the results folder's record."""
        try:
            lines = read_rows(self.run.layout.rollouts_file(taskset))
        except OSError:
            return
        # Every row in the file: a resumed run's earlier rows count too.
        rows = [line.row for line in lines if line.row is not None]
        try:
            record_history(self.run.layout.root_dir(taskset), rows)
        except OSError as error:
            log.warning("could not record the durations of %s: %s", taskset, error)

    def _count_kept(self, session: pytest.Session) -> None:
        """A resumed run's exit status counts the episodes it kept as if they had run now:
        one that failed (or had no result, or was a masked oracle sample) fails the run;
        a run with nothing left to run, all it kept fine, passes."""
        state = self.state
        if not state.planned.done_trials:
            return
        # Those of the tasks this run selects (--harbor-only-tasks may leave some out).
        kept = [
            entry
            for taskset in state.planned.manifests
            for entry in state.ledger.entries(taskset)
            if entry.earlier
            and trial_id(taskset, entry.task_id, entry.repeat) in state.planned.trial_ids
        ]
        state.kept = len(kept)
        bad = {"failed", "no_result"} | ({"masked"} if self.run.harness.validates else set())
        state.kept_failed = sum(1 for entry in kept if entry.status in bad)
        if state.kept_failed and session.exitstatus in (
            pytest.ExitCode.OK,
            pytest.ExitCode.NO_TESTS_COLLECTED,
        ):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        elif not state.kept_failed and session.exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
            state.all_kept = True
            session.exitstatus = pytest.ExitCode.OK

    def _finish_check(self, session: pytest.Session) -> None:
        """Check mode: list each task's problems, write them beside the rows, fail the run
        when a task has one, and have `--lf` run such a task again whole."""
        from pytest_harbor.plugin.checks import Problem

        state = self.state
        assert state.check is not None
        tasks = {
            (taskset, task.id): task
            for taskset, plan in state.planned.plans.items()
            for task in plan.tasks
        }
        refused = {
            (taskset, path.name): first_line(str(error))
            for taskset, plan in state.planned.plans.items()
            for path, error in plan.failures.items()
        }
        redact = self.run.redactor.text
        state.problems = {
            key: [Problem(problem.kind, redact(problem.detail)) for problem in found]
            for key, found in state.check.problems(tasks, refused).items()
        }
        for taskset in state.planned.manifests:
            if not state.writer.begun(taskset):
                continue
            try:
                state.check_files[taskset] = state.check.write(
                    self.run.layout.check_file(taskset), taskset, state.problems
                )
            except OSError as error:
                log.warning("could not write the check of %s: %s", taskset, error)
        if any(state.problems.values()) and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        lastfailed = getattr(
            session.config.pluginmanager.get_plugin("lfplugin"), "lastfailed", None
        )
        if isinstance(lastfailed, dict):
            for nodeid in state.check.failed_nodeids(state.problems):
                lastfailed[nodeid] = True
            # The cache plugin saved its list before this hook (trylast): save it again.
            cache = session.config.cache
            if cache is not None and not hasattr(session.config, "workerinput"):
                cache.set("cache/lastfailed", {str(key): True for key in lastfailed})

    def _write_reports(self, config: pytest.Config, summaries: list[Path]) -> None:
        """The HTML report: one per taskset beside its summary, or one file for the run.
        Whatever goes wrong here only warns: the run's files and exit status stand."""
        options = self.run.options
        if not options.report or not summaries:
            return
        if options.report_path is not None:
            jobs = [(options.report_path, summaries)]
        else:
            jobs = [(summary.parent / REPORT, [summary]) for summary in summaries]
        from pytest_harbor.report import write_report  # only a run that writes one

        redact = self.run.redactor.text if self.run.redactor else None
        for out, files in jobs:
            try:
                self.state.reports.append(write_report(files, out, redact=redact))
            except Exception as error:  # a bug or a full disk must not cost the run's files
                message = f"could not write the HTML report {out}: {type(error).__name__}: {error}"
                log.warning("%s", message)
                self.state.report_errors.append(message)
                warn_once(config, HarborWarning(message), out)


def _skip_text(report: pytest.TestReport) -> str:
    if isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    return str(report.longrepr or "skipped")
