"""Reporting hooks: episode data on test reports, the controller's writes, the summary."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
import warnings
from collections.abc import Callable, Generator, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pytest_harbor.engine import EpisodeError, EpisodeResult, FailureKind
from pytest_harbor.engine.durations import expected_seconds, read_history, record_history
from pytest_harbor.engine.metrics import TasksetScore
from pytest_harbor.engine.planning import TasksetPlan
from pytest_harbor.harnesses.model import ModelEndpointError, check_endpoint
from pytest_harbor.plugin.builds import BuildsAhead
from pytest_harbor.plugin.checks import Problem, TaskCheck
from pytest_harbor.plugin.ledger import EpisodeLedger, TrialRecord, split_trial, trial_id, trial_of
from pytest_harbor.plugin.nodes import HarborTurnItem, HarborWarning, task_warnings
from pytest_harbor.plugin.run import HARBOR_RUN, HarborRun
from pytest_harbor.redaction import Redactor
from pytest_harbor.report import write_report
from pytest_harbor.sandboxes import SandboxError, SandboxStartError
from pytest_harbor.sandboxes.base import ReadinessCheck
from pytest_harbor.tasks import TaskLoadError
from pytest_harbor.tasks.loader import matches_any
from pytest_harbor.writers.failures import FailureRecord
from pytest_harbor.writers.folder import EarlierRun, earlier_run
from pytest_harbor.writers.lock import ResultsFolderBusy, ResultsLock
from pytest_harbor.writers.manifest import ManifestError, RunManifest, secrets_key
from pytest_harbor.writers.materialized import SkippedLog, write_task_rows
from pytest_harbor.writers.resume import ResumePoint, read_resume_point
from pytest_harbor.writers.rollouts import REPORT
from pytest_harbor.writers.summary import run_summary, write_run_summary

log = logging.getLogger("pytest_harbor")

__all__ = ["HarborReporter", "pytest_report_teststatus", "pytest_runtest_makereport"]

#: How many tasks the terminal's pass@k table shows before it says "and N more".
_PASS_AT_K_ROWS = 20


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
        elif item.trial.skip_reason is not None:
            data["skip_reason"] = item.trial.skip_reason
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
        item.user_properties.append(("failure_kind", error.failure_kind))
        report.user_properties = list(item.user_properties)
    elif call.excinfo is not None and (
        (call.when == "setup" and report.failed) or data.get("status") == "error"
    ):
        data["failure"] = {
            "kind": FailureKind.INTERNAL_ERROR,
            "reason": call.excinfo.exconly().strip().splitlines()[-1],
        }
    if isinstance(error, EpisodeError | SandboxError):
        # The engine's own words say what broke; our stack frames would not help.
        report.longrepr = call.excinfo.getrepr(style="value")  # type: ignore[union-attr]
    _mask_report(report, item.config.stash[HARBOR_RUN].redactor)
    # Plain JSON data: xdist carries it from the worker to the controller.
    report.harbor = data  # type: ignore[attr-defined]
    return report


def _mask_report(report: pytest.TestReport, redactor: Redactor) -> None:
    """No secret value reaches the terminal or the junit XML: the failure text and the
    captured output are masked."""
    if not redactor:
        return
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):
        path, line, message = longrepr
        report.longrepr = (path, line, redactor.text(message))
    elif longrepr is not None:
        text = str(longrepr)
        masked = redactor.text(text)
        if masked != text:
            report.longrepr = masked
    report.sections = [(title, redactor.text(body)) for title, body in report.sections]
    report.user_properties = [
        (name, redactor.text(value) if isinstance(value, str) else value)
        for name, value in report.user_properties
    ]


@pytest.hookimpl(tryfirst=True)
def pytest_report_teststatus(
    report: pytest.TestReport | pytest.CollectReport, config: pytest.Config
) -> tuple[str, str, str] | None:
    data = getattr(report, "harbor", None)
    if report.when == "call" and report.failed and data and data.get("status") == "error":
        return "error", "E", "ERROR"
    if report.when not in ("setup", "call", "teardown") and report.failed:
        # xdist's report for an item whose worker died: the episode has no result.
        run = config.stash.get(HARBOR_RUN, None)
        if run is not None and trial_of(report.nodeid) in run.trial_ids:
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
        self.ledger = EpisodeLedger(
            run_id=run.run_id,
            agent=run.harness.name,
            validation=run.harness.validates,
            pass_reward=run.options.pass_reward,
        )
        self.manifests: dict[str, RunManifest] = {}
        #: What each taskset's folder held from an earlier run as this one started.
        self.earlier: dict[str, EarlierRun | None] = {}
        #: Each taskset's plan, as the run planned it at its start.
        self.plans: dict[str, TasksetPlan] = {}
        self.builds = BuildsAhead(run)
        self._status_at: float | None = None
        self.locks: list[ResultsLock] = []
        self.items = 0
        self.unvalidated = 0
        self.kept = 0
        self.reaped = 0
        self.interrupted = False
        #: Of the episodes a resumed run kept: how many failed; whether they were all
        #: there was to run.
        self.kept_failed = 0
        self.all_kept = False
        #: Episodes under way or waiting when the run was interrupted.
        self.cut_short = 0
        #: Check mode's findings: fed every report, read at the end of the run.
        self.check = TaskCheck(run.options.repeats or 1) if run.options.check else None
        self.problems: dict[tuple[str, str], list[Problem]] = {}
        self.check_files: dict[str, Path] = {}
        #: The HTML reports written at the end of the run, and those that failed.
        self.reports: list[Path] = []
        self.report_errors: list[str] = []

    # ------------------------------------------------------------------------ start

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Before any worker starts: plan every target, check a resumed run, write the
        manifest, materialized rows and skipped.json; the rows' digests (and, resuming,
        the finished trials) go to the workers with their start-up data."""
        config = session.config
        self.run.terminal = config.pluginmanager.get_plugin("terminalreporter")
        self.run.config_verbosity = config.get_verbosity()
        try:
            self.run.workers = max(1, int(getattr(config.option, "numprocesses", 0) or 1))
        except (TypeError, ValueError):  # `-n auto` not yet turned into a number
            self.run.workers = os.cpu_count() or 1
        if session.config.option.collectonly or not self.run.targets:
            return
        if self.run.model is not None:
            try:
                check_endpoint(
                    self.run.model,
                    api=getattr(self.run.harness, "model_api", "chat-completions"),
                )
            except ModelEndpointError as error:
                raise pytest.UsageError(
                    f"--harbor-model {self.run.model.name} at {self.run.model.base_url}: {error}"
                ) from None
        if isinstance(self.run.provider, ReadinessCheck):
            try:
                self.run.provider.check_ready()
            except SandboxStartError as error:
                raise pytest.UsageError(
                    f"--harbor-sandbox {self.run.provider.name}: {error}"
                ) from None
        self.reaped = self.run.reap()
        for target in self.run.targets.values():
            try:
                plan = self.run.plan(target)
            except TaskLoadError:
                continue  # collection reports it, as an error of the taskset
            self._lock(self.run.layout.taskset_dir(plan.taskset))
            digests = {task.id: task.digest for task in plan.tasks}
            manifest = RunManifest.describe(
                run_id=self.run.run_id,
                started_at=self.run.started_at,
                target=target.path,
                taskset=plan.taskset,
                agent=self.run.harness.name,
                sandbox=self.run.provider.name,
                repeats=plan.repeats,
                settings=self.run.settings,
                task_digests=digests,
                secrets_key=secrets_key(self.run.layout.taskset_dir(plan.taskset)),
                model=None if self.run.model is None else self.run.model.identity(),
                agent_options=self.run.options.agent_options,
                dataset_config=None if target.is_task else target.path / "dataset.toml",
            )
            self.run.trial_ids.update(self.ledger.plan(plan.taskset, plan.repeats, digests))
            point = self._resume(manifest) if self.run.options.resume else None
            self.manifests[plan.taskset] = manifest
            skipped = {}
            if self.run.options.skip_unloadable:
                skipped = {path.name: str(error) for path, error in plan.failures.items()}
            self.skipped.start(plan.taskset, skipped)
            # Nothing is written to the taskset's folder yet (see RolloutsWriter), unless
            # it holds no earlier results to keep: then it begins now, as the run starts.
            self.writer.plan(plan.taskset, resume=point, on_begin=self._beginning(plan))
            self.earlier[plan.taskset] = earlier_run(self.run.layout.taskset_dir(plan.taskset))
            if self.earlier[plan.taskset] is None:
                self.writer.begin(plan.taskset)
            history = read_history(self.run.layout.taskset_dir(plan.taskset))
            self.run.history_tasks.update(f"{plan.taskset}/{name}" for name in history)
            for task in plan.tasks:
                for warning in task_warnings(task):
                    _warn_once(config, warning, task.path / "task.toml", warning.line or 1)
                self.run.row_digests[f"{plan.taskset}/{task.id}"] = task.digest
                self.run.expected_s[f"{plan.taskset}/{task.id}"] = expected_seconds(
                    task, self.run.settings, history
                )
            self.plans[plan.taskset] = plan
        if not _selects(config):
            # Every planned trial runs: its images can start now, while workers start.
            self.builds.start(
                (taskset, task)
                for taskset, plan in self.plans.items()
                for task in plan.tasks
                if any(
                    trial_id(taskset, task.id, repeat) not in self.run.done_trials
                    for repeat in range(plan.repeats)
                )
            )

    def _record_durations(self, taskset: str) -> None:
        """This run's episode and build times join the results folder's record."""
        rows_file = self.run.layout.rollouts_file(taskset)
        try:
            lines = rows_file.read_text().splitlines()
        except OSError:
            return
        rows = []
        for line in lines:
            with contextlib.suppress(ValueError):
                rows.append(json.loads(line))
        try:
            record_history(self.run.layout.taskset_dir(taskset), rows)
        except OSError as error:
            log.warning("could not record the durations of %s: %s", taskset, error)

    def _lock(self, folder: Path) -> None:
        lock = ResultsLock(
            folder,
            f"run {self.run.run_id}, pid {os.getpid()} on {socket.gethostname()}, "
            f"since {self.run.started_at}",
        )
        try:
            lock.acquire()
        except ResultsFolderBusy as error:
            raise pytest.UsageError(str(error)) from None
        self.locks.append(lock)

    def pytest_unconfigure(self) -> None:
        for lock in self.locks:
            lock.release()
        self.locks = []

    def _beginning(self, plan: TasksetPlan) -> Callable[[], None]:
        """What the run writes of its own once the taskset's folder begins: the manifest,
        the materialized rows and skipped.json."""

        def begin() -> None:
            taskset = plan.taskset
            self.manifests[taskset].write(self.run.layout.manifest_file(taskset), self.run.redactor)
            write_task_rows(self.run.layout, self.run.harness.name, plan)
            self.skipped.open(taskset)

        return begin

    def _resume(self, manifest: RunManifest) -> ResumePoint:
        layout, taskset = self.run.layout, manifest.taskset
        try:
            point = read_resume_point(
                taskset,
                rollouts=layout.rollouts_file(taskset),
                failures=layout.failures_file(taskset),
                manifest=layout.manifest_file(taskset),
            )
        except ManifestError as error:
            raise pytest.UsageError(f"--harbor-resume: {error}") from None
        if point.manifest is None and point.has_results:
            raise pytest.UsageError(
                f"--harbor-resume: {layout.taskset_dir(taskset)} holds results but no "
                "rollouts_manifest.json, so nothing says which run made them; run without "
                "--harbor-resume to start afresh"
            )
        if point.manifest is not None:
            differences = point.manifest.differences(manifest)
            if differences:
                raise pytest.UsageError(
                    f"--harbor-resume: this run of {taskset} differs from the one in "
                    f"{layout.taskset_dir(taskset)}:\n  "
                    + "\n  ".join(differences)
                    + "\nrun with the same targets, agent and settings, or without "
                    "--harbor-resume to start afresh"
                )
        kept = self.ledger.keep(point)
        self.kept += len(kept)
        self.run.done_trials.update(kept)
        return point

    # ------------------------------------------------------------------------ reports

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.ledger.select(item.nodeid for item in session.items)
        self._build_ahead(item.nodeid for item in session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self.ledger.select(ids)
        self._build_ahead(ids)

    def _write_left_out(
        self, write: Any, taskset: str, failures: dict[Path, TaskLoadError]
    ) -> None:
        """Task folders that were refused or did not load (also under -q): how many, the
        first few reasons, and where the rest are."""
        count = len(failures)
        write(
            f"{taskset}: left out {count} task folder{'s' if count != 1 else ''} "
            "(refused, or could not load)",
            yellow=True,
        )
        for path, error in sorted(failures.items())[:_LEFT_OUT_SHOWN]:
            write(f"  {path.name}: {_first_line(str(error))}")
        if count > _LEFT_OUT_SHOWN:
            write(f"  ... and {count - _LEFT_OUT_SHOWN} more")
        if self.run.options.skip_unloadable:
            write(f"  all of them: {self.run.layout.skipped_file(taskset)}")
        else:
            write(
                "  (each is a collection error above; --harbor-skip-unloadable lists them in "
                "skipped.json and runs the rest)"
            )

    def _maybe_status(self) -> None:
        """For a long run, a compact line now and then (at most every STATUS_EVERY_S): the
        images being made, the episodes running and waiting, and the time left once the
        results folder recorded earlier runs. Not with -q."""
        if not self.manifests:
            return  # no taskset in this run (pytest-harbor's own tests, say)
        now = time.monotonic()
        if self._status_at is None:
            self._status_at = now
            return
        if now - self._status_at < STATUS_EVERY_S or self.run.config_verbosity < 0:
            return
        self._status_at = now
        reporter = self.run.terminal
        if reporter is None:
            return
        # On a line of its own, never glued to the progress dots.
        writer = getattr(reporter, "_tw", None)
        if writer is not None and writer.width_of_current_line:
            reporter.write("\n")
        reporter.write_line(status_line(self.ledger, self.builds, self.run))

    def _build_ahead(self, nodeids: Iterable[str]) -> None:
        """Start making the images of the trials the run selected (once)."""
        if self.builds.started or not self.plans:
            return
        tasks = {
            taskset: {task.id: task for task in plan.tasks} for taskset, plan in self.plans.items()
        }
        selected = []
        for nodeid in nodeids:
            taskset, task_name, _ = split_trial(trial_of(nodeid))
            task = tasks.get(taskset, {}).get(task_name)
            if task is not None:
                selected.append((taskset, task))
        self.builds.start(selected)

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        record = self.ledger.get(nodeid)
        if record is not None:
            record.started = True
            record.step = nodeid.rsplit("::", 1)[1]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._maybe_status()
        if self.check is not None:
            self.check.add(report)
        record = self.ledger.get(report.nodeid)
        if report.when not in ("setup", "call", "teardown"):
            # xdist's report for the item a worker was running when it died.
            if record is not None and report.failed:
                self._worker_died(record, report)
            return
        data = getattr(report, "harbor", None)
        if not data or record is None:
            return
        if report.when == "setup":
            self._setup(record, report, data)
        elif report.when == "call":
            self._call(record, data)

    def _setup(self, record: TrialRecord, report: pytest.TestReport, data: dict[str, Any]) -> None:
        self.items += 1
        self.unvalidated += int(bool(data.get("unvalidated")))
        if "unloadable" in data:
            self.skipped.add(data["taskset"], data["task_id"], data["unloadable"])
            record.skip_reason = f"unloadable: {data['unloadable']}"
        elif report.skipped:
            record.skip_reason = str(data.get("skip_reason") or _skip_text(report))
        if report.passed:
            record.seeded = True
        elif report.failed:
            self._failed(record, data)

    def _call(self, record: TrialRecord, data: dict[str, Any]) -> None:
        if "result" in data:
            if record.finished:
                return  # one row per episode, whatever a worker sends twice
            result = EpisodeResult.model_validate(data["result"])
            record.result = result
            self.writer.append_row(result)
        elif data.get("status") == "error":
            self._failed(record, data)

    def _failed(self, record: TrialRecord, data: dict[str, Any]) -> None:
        failure = data.get("failure") or {
            "kind": FailureKind.INTERNAL_ERROR,
            "reason": "the episode ended with an error and no reason",
        }
        self._write_failure(self.ledger.failed(record, failure["kind"], failure["reason"]))

    def _worker_died(self, record: TrialRecord, report: pytest.TestReport) -> None:
        reason = str(report.longrepr).strip().splitlines()[0] if report.longrepr else ""
        failure = self.ledger.failed(
            record,
            FailureKind.WORKER_DIED,
            f"the process running the episode died ({reason or 'no word from it'})",
        )
        self._write_failure(failure)
        # Its sandboxes now belong to a process that is gone: remove them at once.
        self.reaped += self.run.reap()

    def _write_failure(self, failure: FailureRecord | None) -> None:
        if failure is not None:
            self.writer.append_failure(failure)

    # ------------------------------------------------------------------------ finish

    @pytest.hookimpl(tryfirst=True)
    def pytest_keyboard_interrupt(self) -> None:
        """Noted here, not read from the exit status: pytest reports an internal error
        instead when printing the interrupt's traceback fails."""
        self.interrupted = True

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.builds.close()
        if session.config.option.collectonly or not self.manifests:
            return
        if self.check is not None:
            self._finish_check(session)
        interrupted = self.interrupted or session.exitstatus == pytest.ExitCode.INTERRUPTED
        if interrupted:
            for failure in self.ledger.interrupted():
                self.cut_short += 1
                # An interruption alone does not begin a folder: the earlier run stays.
                self.writer.append_failure(failure, begins=False)
        finished_at = datetime.now(UTC).isoformat(timespec="milliseconds")
        for taskset in self.manifests:
            self.writer.finish(taskset)
        begun = {taskset for taskset in self.manifests if self.writer.begun(taskset)}
        for taskset in begun:
            self._record_durations(taskset)
        summaries = []
        for taskset, manifest in self.manifests.items():
            if taskset not in begun:
                continue
            summary = run_summary(
                self.run.layout,
                manifest,
                finished_at=finished_at,
                interrupted=interrupted,
                episodes=list(self.ledger.entries(taskset)),
                score=self.ledger.score(taskset),
            )
            summaries.append(
                write_run_summary(self.run.layout, taskset, summary, self.run.redactor)
            )
        self._write_reports(session.config, summaries)
        if self.run.harness.validates and self._nothing_validatable:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        self._count_kept(session)

    def _count_kept(self, session: pytest.Session) -> None:
        """A resumed run's exit status counts the episodes it kept as if they had run now:
        one that failed (or had no result, or was a masked oracle sample) fails the run;
        a run with nothing left to run, all it kept fine, passes."""
        if not self.kept:
            return
        # Those of the tasks this run selects (--harbor-only-tasks may leave some out).
        kept = [
            entry
            for taskset in self.manifests
            for entry in self.ledger.entries(taskset)
            if entry.earlier
            and trial_id(taskset, entry.task_id, entry.repeat) in self.run.trial_ids
        ]
        self.kept = len(kept)
        bad = (
            ("failed", "no_result", "masked")
            if self.run.harness.validates
            else (
                "failed",
                "no_result",
            )
        )
        self.kept_failed = sum(1 for entry in kept if entry.status in bad)
        if self.kept_failed and session.exitstatus in (
            pytest.ExitCode.OK,
            pytest.ExitCode.NO_TESTS_COLLECTED,
        ):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        elif not self.kept_failed and session.exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
            self.all_kept = True
            session.exitstatus = pytest.ExitCode.OK

    def _finish_check(self, session: pytest.Session) -> None:
        """Check mode: list each task's problems, write them beside the rows, fail the run
        when a task has one, and have `--lf` run such a task again whole."""
        assert self.check is not None
        tasks = {
            (taskset, task.id): task for taskset, plan in self.plans.items() for task in plan.tasks
        }
        refused = {
            (taskset, path.name): _first_line(str(error))
            for taskset, plan in self.plans.items()
            for path, error in plan.failures.items()
        }
        redact = self.run.redactor.text
        self.problems = {
            key: [Problem(problem.kind, redact(problem.detail)) for problem in found]
            for key, found in self.check.problems(tasks, refused).items()
        }
        for taskset in self.manifests:
            if not self.writer.begun(taskset):
                continue
            try:
                self.check_files[taskset] = self.check.write(
                    self.run.layout.check_file(taskset), taskset, self.problems
                )
            except OSError as error:
                log.warning("could not write the check of %s: %s", taskset, error)
        if any(self.problems.values()) and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        lastfailed = getattr(
            session.config.pluginmanager.get_plugin("lfplugin"), "lastfailed", None
        )
        if isinstance(lastfailed, dict):
            for nodeid in self.check.failed_nodeids(self.problems):
                lastfailed[nodeid] = True

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
        redact = self.run.redactor.text if self.run.redactor else None
        for out, files in jobs:
            try:
                self.reports.append(write_report(files, out, redact=redact))
            except Exception as error:  # a bug or a full disk must not cost the run's files
                message = f"could not write the HTML report {out}: {type(error).__name__}: {error}"
                log.warning("%s", message)
                self.report_errors.append(message)
                _warn_once(config, HarborWarning(message), out)

    @property
    def _nothing_validatable(self) -> bool:
        return self.items > 0 and self.items == self.unvalidated

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        left_out = {taskset: plan.failures for taskset, plan in self.plans.items() if plan.failures}
        ran = any(True for taskset in self.manifests for _ in self.ledger.entries(taskset))
        unmatched = self._unmatched_filters(terminalreporter.config)
        if not ran and not left_out and not unmatched:
            return
        write = terminalreporter.write_line
        terminalreporter.section("harbor")
        for message in unmatched:
            write(message, yellow=True)
        for taskset, failures in sorted(left_out.items()):
            self._write_left_out(write, taskset, failures)
        for taskset in sorted(self.manifests):
            score = self.ledger.score(taskset)
            if not score.episodes and not score.count("not_run"):
                continue
            _write_score(write, taskset, score)
            if not self.writer.begun(taskset):
                continue
            write(f"  rows: {self.run.layout.rollouts_file(taskset)}")
            write(f"  summary: {self.run.layout.summary_file(taskset)}")
            report = self.run.layout.report_file(taskset)
            if report in self.reports:
                write(f"  report: {report}")
        for taskset in sorted(self.manifests):
            aside = self.writer.set_aside.get(taskset)
            if aside is not None:
                write(aside.message(taskset))
            earlier = self.earlier.get(taskset)
            if not self.writer.begun(taskset) and earlier is not None:
                write(earlier.message(taskset, self.run.layout.taskset_dir(taskset)))
        if self.run.options.report_path in self.reports:
            write(f"report: {self.run.options.report_path}")
        for message in self.report_errors:
            write(message, yellow=True)
        if self.check is not None:
            self._write_check(write)
        if self.all_kept:
            write(
                f"resumed: all {self.kept} episode(s) were kept from the earlier run and "
                "passed; nothing was left to run",
                green=True,
            )
        elif self.kept:
            write(
                f"resumed: {self.kept} episode(s) kept from the earlier run, not run again"
                + (
                    f"; {self.kept_failed} of them failed, which fails this run"
                    if self.kept_failed
                    else ""
                )
            )
        if self.cut_short and any(self.writer.begun(taskset) for taskset in self.manifests):
            write(
                f"interrupted: {self.cut_short} episode(s) did not end; the same command with "
                "--harbor-resume runs only those, keeping the rest",
                yellow=True,
            )
        if self.reaped:
            write(f"removed {self.reaped} sandbox(es) left by runs whose process is gone")
        if self.builds.started and (self.builds.done or self.builds.failed):
            builds = self.builds
            builder = getattr(self.run.provider, "builder", None)
            write(
                f"images made ahead for {builds.done} task{'s' if builds.done != 1 else ''}"
                + (f" ({builds.failed} failed)" if builds.failed else "")
                + (f", built with {_BUILDERS.get(builder, builder)}" if builder else "")
            )
        if self.run.harness.validates and self._nothing_validatable:
            write("no selected task has a solution/solve.sh: nothing was validated", red=True)
        partial = sum(self.ledger.score(taskset).count("partial") for taskset in self.manifests)
        if partial:
            write(
                f"{partial} episode(s) ran only some of their steps (the others were not "
                "selected): their rows are marked partial, out of the score, and "
                "--harbor-resume runs them again in full",
                yellow=True,
            )

    def _unmatched_filters(self, config: pytest.Config) -> list[str]:
        """The task filters that matched nothing: each `--harbor-only-tasks` name or glob
        that names no task, and `-k` or `-m` when they left no episode selected."""
        if not self.plans:
            return []
        ids = [task_id for plan in self.plans.values() for task_id in plan.task_ids]
        shown = ", ".join(sorted(ids)[:8]) + (" ..." if len(ids) > 8 else "")
        found = [
            f"--harbor-only-tasks={pattern}: no task matches (the tasks: {shown})"
            for pattern in self.run.options.only_tasks
            if not any(matches_any(task_id, (pattern,)) for task_id in ids)
        ]
        planned = [record for record in self.ledger.trials.values() if not record.earlier]
        if planned and not any(record.selected for record in planned):
            option = config.option
            for flag, value in (("-k", option.keyword), ("-m", option.markexpr)):
                if value:
                    found.append(f"{flag} {value!r}: no episode matches ({len(planned)} planned)")
        return found

    def _write_check(self, write: Any) -> None:
        """One table of problems per taskset: task, problem, detail."""
        for taskset in sorted(self.manifests):
            checked = {
                task: found for (owner, task), found in self.problems.items() if owner == taskset
            }
            if not checked:
                continue
            bad = {task: found for task, found in checked.items() if found}
            repeats = self.check.repeats if self.check else 1
            write(
                f"{taskset}: task check (oracle x{repeats} and nop per task): "
                f"{len(checked)} task(s), {len(bad)} with problems",
                red=bool(bad),
                green=not bad,
            )
            if bad:
                width = max(len(task) for task in bad)
                kinds = max(len(problem.kind) for found in bad.values() for problem in found)
                write(f"  {'task':<{width}}  {'problem':<{kinds}}  detail")
                for task, found in sorted(bad.items()):
                    for problem in found:
                        write(
                            f"  {task:<{width}}  {problem.kind:<{kinds}}  "
                            f"{_first_line(problem.detail, 160)}"
                        )
            if taskset in self.check_files:
                write(f"  check: {self.check_files[taskset]}")


_BUILDERS = {"buildkit": "BuildKit (docker buildx)", "classic": "the classic builder"}

#: How many refused task folders the summary names (the rest are counted).
_LEFT_OUT_SHOWN = 3


def _first_line(text: str, limit: int = 200) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


#: A long run says what it is doing at most this often.
STATUS_EVERY_S = 30.0


def _warn_once(config: pytest.Config, warning: Warning, where: Path, line: int = 1) -> None:
    """A warning in the run's summary, placed at the file (and line) it is about (once per
    run: workers do not repeat it)."""
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always", type(warning))
        warnings.warn_explicit(warning, type(warning), filename=str(where), lineno=line)
    for record in records:
        config.hook.pytest_warning_recorded.call_historic(
            kwargs={
                "warning_message": record,
                "when": "config",
                "nodeid": "",
                "location": (str(where), line, "task.toml"),
            }
        )


def _selects(config: pytest.Config) -> bool:
    """Whether pytest's own selection (-k, -m, --lf, --deselect) may leave trials out."""
    option = config.option
    return bool(
        getattr(option, "keyword", "")
        or getattr(option, "markexpr", "")
        or getattr(option, "lf", False)
        or getattr(option, "deselect", None)
    )


def status_line(ledger: EpisodeLedger, builds: BuildsAhead, run: HarborRun) -> str:
    """`harbor: 2 images being made, 2 episodes running, 14 waiting, about 3 min left`."""
    selected = [record for record in ledger.trials.values() if record.selected]
    running = [r for r in selected if r.started and not r.finished]
    waiting = [r for r in selected if not r.started and not r.finished]
    parts = []
    if builds.building:
        parts.append(f"{builds.building} image{'s' if builds.building != 1 else ''} being made")
    parts.append(f"{len(running)} episode{'s' if len(running) != 1 else ''} running")
    parts.append(f"{len(waiting)} waiting")
    known = [
        run.expected_s.get(f"{r.taskset}/{r.task_id}")
        for r in running + waiting
        if f"{r.taskset}/{r.task_id}" in run.history_tasks
    ]
    if known and len(known) == len(running) + len(waiting):
        left = sum(value or 0.0 for value in known) / max(1, run.workers)
        parts.append(f"about {_duration(left)} left")
    return "harbor: " + ", ".join(parts)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _skip_text(report: pytest.TestReport) -> str:
    if isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    return str(report.longrepr or "skipped")


def _write_score(write: Any, taskset: str, score: TasksetScore) -> None:
    mean = "n/a" if score.mean_reward is None else f"{score.mean_reward:.3f}"
    counts = ", ".join(
        f"{score.count(status)} {status.replace('_', ' ')}"
        for status in ("passed", "failed", "masked", "no_result")
    )
    extra = [
        f"{score.count(status)} {status.replace('_', ' ')}"
        for status in ("partial", "skipped", "not_run")
        if score.count(status)
    ]
    write(
        f"{taskset}: {score.episodes} episode{'s' if score.episodes != 1 else ''}, "
        f"mean reward {mean} ({counts})" + (f"; {', '.join(extra)}" if extra else "")
    )
    if score.usage is not None:
        usage = score.usage
        cost = "" if usage.cost_usd is None else f", ${usage.cost_usd:.4f}"
        write(
            f"  model usage: {usage.prompt_tokens:,} prompt + {usage.completion_tokens:,} "
            f"completion tokens in {usage.requests:,} requests{cost}"
        )
    if score.failure_kinds:
        width = max(len(kind) for kind in score.failure_kinds)
        write("  failure kind" + " " * (width - 10) + "episodes")
        for kind, count in sorted(
            score.failure_kinds.items(), key=lambda item: (-item[1], item[0])
        ):
            write(f"  {kind:<{width}}  {count}")
    if score.pass_at_k:
        ks = sorted(score.pass_at_k)
        write("  pass@k: " + "  ".join(f"pass@{k} {score.pass_at_k[k]:.3f}" for k in ks))
        tasks = sorted(
            {task for per_task in score.pass_at_k_per_task.values() for task in per_task}
        )
        width = max(len(task) for task in tasks)
        write("  " + "task".ljust(width) + "".join(f"  pass@{k}".rjust(9) for k in ks))
        for task in tasks[:_PASS_AT_K_ROWS]:
            cells = []
            for k in ks:
                value = score.pass_at_k_per_task.get(k, {}).get(task)
                cells.append(("-" if value is None else f"{value:.3f}").rjust(9))
            write("  " + task.ljust(width) + "".join(cells))
        if len(tasks) > _PASS_AT_K_ROWS:
            write(f"  ... and {len(tasks) - _PASS_AT_K_ROWS} more tasks (see the run summary)")
