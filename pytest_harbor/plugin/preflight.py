"""Before any episode: the model endpoint and the engine answer, leftovers of dead runs
go, each taskset is planned, its results folder locked, a resumed run checked, the
manifest made, and the images of what will run start building."""

from __future__ import annotations

import os
import socket
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_harbor.plugin.endpoint_check import check_model_endpoint
from pytest_harbor.plugin.ledger import trial_id
from pytest_harbor.plugin.nodes import task_warnings
from pytest_harbor.plugin.recorded import describe_run, recorded_differences
from pytest_harbor.plugin.relay import check_spend_options, start_relay, stop_relay
from pytest_harbor.plugin.reporting import RunReport
from pytest_harbor.plugin.run import Target
from pytest_harbor.relay import RelayProcess
from pytest_harbor.run.durations import expected_seconds, read_history
from pytest_harbor.run.planning import TasksetPlan
from pytest_harbor.sandboxes import SandboxStartError
from pytest_harbor.sandboxes.base import ReadinessCheck
from pytest_harbor.tasks import TaskLoadError
from pytest_harbor.writers.lock import ResultsFolderBusy, ResultsLock
from pytest_harbor.writers.manifest import ManifestError, RunManifest, read_manifest, secrets_key
from pytest_harbor.writers.materialized import write_task_rows
from pytest_harbor.writers.resume import ResumePoint, read_resume_point
from pytest_harbor.writers.run_config import run_config_name
from pytest_harbor.writers.runs import migrate, run_folder_name, runs_of, unused_name

__all__ = ["PreFlight", "warn_once"]


class PreFlight:
    """Registered on the controller (or the sole process); holds the results folders'
    locks until the run ends. The one writer of the run's plan (PlannedRun) and of what
    the report holds of each taskset's start (its manifest, record, earlier run, plan)."""

    def __init__(self, state: RunReport) -> None:
        self.state = state
        self.run = state.run
        self.planned = state.planned
        self.locks: list[ResultsLock] = []
        self.relay: RelayProcess | None = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Before any worker starts: plan every target, check a resumed run, write the
        manifest, materialized rows and skipped.json; the rows' digests (and, resuming,
        the finished trials) go to the workers with their start-up data."""
        config = session.config
        run, planned = self.run, self.planned
        if config.option.collectonly or not run.targets:
            return
        self._check_services()
        planned.reaped = run.reap()
        for target in run.targets.values():
            try:
                plan = run.plan(target)
            except TaskLoadError:
                continue  # collection reports it, as an error of the taskset
            self._start_taskset(config, target, plan)
        if not _selects(config):
            # Every planned trial runs: its images can start now, while workers start.
            self.state.builds.start(
                (taskset, task)
                for taskset, plan in self.state.planned.plans.items()
                for task in plan.tasks
                if any(
                    trial_id(taskset, task.id, repeat) not in planned.done_trials
                    for repeat in range(plan.repeats)
                )
            )

    def _check_services(self) -> None:
        """The model endpoint answers, and the engine is ready (else a usage error)."""
        run = self.run
        check_model_endpoint(run)
        for provider, where in zip(
            run.providers, ("--harbor-sandbox", "setting gpu_sandbox_provider"), strict=False
        ):
            if isinstance(provider, ReadinessCheck):
                try:
                    provider.check_ready()
                except SandboxStartError as error:
                    raise pytest.UsageError(f"{where} {provider.name}: {error}") from None
        check_spend_options(run.options.model, None if run.model is None else run.model.name)
        self.relay = start_relay(run)

    def _start_taskset(self, config: pytest.Config, target: Target, plan: TasksetPlan) -> None:
        run, state, planned, taskset = self.run, self.state, self.planned, plan.taskset
        layout = run.layout
        root = layout.root_dir(taskset)
        self._lock(root)
        notes = planned.folder_notes.setdefault(taskset, [])
        try:
            moved = migrate(root, layout.verifier_home_of(taskset))
        except OSError as error:
            raise pytest.UsageError(
                f"{root}: could not move the runs of the earlier layout into runs/: {error}"
            ) from None
        notes.extend(found.message(taskset) for found in moved)
        digests = {task.id: task.digest for task in plan.tasks}
        manifest = RunManifest.describe(
            run_id=run.run_id,
            started_at=planned.started_at,
            target=target.described,
            taskset=taskset,
            agent=run.harness.name,
            sandbox=run.provider.name,
            repeats=plan.repeats,
            settings=run.settings,
            task_digests=digests,
            secrets_key=secrets_key(root),
            model=None if run.model is None else run.model.identity(),
            agent_options=run.options.agent_options,
            dataset_config=None if target.is_task else target.path / "dataset.toml",
            dataset_files_digest=plan.files.digest,
            reference=run.reference_record(target),
        )
        recorded = run.options.recorded.get(taskset)
        if recorded is not None:
            differences = recorded_differences(recorded, digests)
            if differences:
                raise pytest.UsageError(
                    f"--harbor-config: the tasks of {taskset} are not those of the recorded "
                    f"run {recorded.run_id}:\n  " + "\n  ".join(differences)
                )
        state.planned.run_records[taskset] = describe_run(run, config, target, manifest)
        planned.trial_ids.update(state.ledger.plan(taskset, plan.repeats, digests))
        point = self._resume(manifest) if run.options.resume else None
        if taskset not in layout.runs:
            model = None if run.model is None else run.model.name
            name = run_folder_name(planned.started_at, run.harness.name, model)
            layout.use_run(taskset, unused_name(root, name))
        state.planned.manifests[taskset] = manifest
        skipped = {}
        if run.options.skip_unloadable:
            skipped = {path.name: str(error) for path, error in plan.failures.items()}
        state.skipped.start(taskset, skipped)
        # A fresh run's folder begins now; a resumed run's once it has something to write
        # (see RolloutsWriter).
        state.writer.plan(taskset, resume=point, on_begin=self._beginning(plan))
        if point is None:
            state.writer.begin(taskset)
        history = read_history(root)
        planned.history_tasks.update(f"{taskset}/{name}" for name in history)
        for task in plan.tasks:
            for warning in task_warnings(task):
                warn_once(config, warning, task.path / "task.toml", warning.line or 1)
            planned.row_digests[f"{taskset}/{task.id}"] = task.digest
            planned.expected_s[f"{taskset}/{task.id}"] = expected_seconds(
                task, run.settings, history
            )
        state.planned.plans[taskset] = plan

    def _lock(self, folder: Path) -> None:
        lock = ResultsLock(
            folder,
            f"run {self.run.run_id}, pid {os.getpid()} on {socket.gethostname()}, "
            f"since {self.planned.started_at}",
        )
        try:
            lock.acquire()
        except ResultsFolderBusy as error:
            raise pytest.UsageError(str(error)) from None
        self.locks.append(lock)

    def pytest_unconfigure(self) -> None:
        stop_relay(self.relay, self.run)
        self.relay = None
        for lock in self.locks:
            lock.release()
        self.locks = []

    def _beginning(self, plan: TasksetPlan) -> Callable[[], None]:
        """What the run writes of its own once the taskset's folder begins: the manifest,
        the materialized rows and skipped.json."""
        run, state = self.run, self.state

        def begin() -> None:
            taskset = plan.taskset
            state.planned.manifests[taskset].write(run.layout.manifest_file(taskset), run.redactor)
            folder = run.layout.taskset_dir(taskset)
            state.planned.run_records[taskset].write(
                folder / run_config_name(run.options.agent), run.redactor
            )
            write_task_rows(run.layout, run.harness.name, plan)
            state.skipped.open(taskset)

        return begin

    def _resume(self, manifest: RunManifest) -> ResumePoint | None:
        """The newest run of the taskset that this one continues (its folder becomes this
        run's), or None to start afresh under `--harbor-resume-or-start`."""
        layout, taskset = self.run.layout, manifest.taskset
        root = layout.root_dir(taskset)
        found, latest_differs = _resumable(root, manifest)
        if found is None:
            if self.run.options.resume_or_start:
                self.planned.folder_notes.setdefault(taskset, []).append(
                    f"{taskset}: no earlier run in {root} to resume; this one starts afresh"
                )
                return None
            if latest_differs is None:
                raise pytest.UsageError(
                    f"--harbor-resume: {root} holds no earlier run of {taskset} to continue "
                    "(check --harbor-results-dir and --harbor-agent); run without "
                    "--harbor-resume, or with --harbor-resume-or-start, to start afresh"
                )
            folder, differences = latest_differs
            raise pytest.UsageError(
                f"--harbor-resume: no run of {taskset} in {root} matches this one; the "
                f"latest, {folder.name}, differs:\n  "
                + "\n  ".join(differences)
                + "\nrun with the same targets, agent and settings, or without "
                "--harbor-resume to start afresh"
            )
        layout.use_run(taskset, found.name)
        try:
            point = read_resume_point(
                taskset,
                rollouts=layout.rollouts_file(taskset),
                failures=layout.failures_file(taskset),
                manifest=layout.manifest_file(taskset),
            )
        except ManifestError as error:
            raise pytest.UsageError(f"--harbor-resume: {error}") from None
        self.planned.folder_notes.setdefault(taskset, []).append(
            f"{taskset}: resuming the run in {found} ({len(point.rows)} row"
            f"{'s' if len(point.rows) != 1 else ''} kept)"
        )
        self.planned.done_trials.update(self.state.ledger.keep(point))
        return point


def _resumable(
    root: Path, manifest: RunManifest
) -> tuple[Path | None, tuple[Path, list[str]] | None]:
    """The newest run in `root` this run can continue (its manifest differs in nothing),
    and, when there is none, the newest run with what differs in it (None: no run)."""
    newest: tuple[Path, list[str]] | None = None
    for folder in runs_of(root):
        try:
            earlier = read_manifest(folder / "rollouts_manifest.json")
        except ManifestError as error:
            differences = [str(error)]
        else:
            if earlier is None and not _holds_results(folder):
                continue  # a run killed before it wrote anything: nothing to continue
            differences = (
                ["it has no rollouts_manifest.json, so nothing says which run made it"]
                if earlier is None
                else earlier.differences(manifest)
            )
        if not differences:
            return folder, None
        newest = newest or (folder, differences)
    return None, newest


def _holds_results(folder: Path) -> bool:
    """Whether a run folder holds a row or a failure."""
    return any(
        (folder / name).is_file() and (folder / name).stat().st_size > 0
        for name in ("rollouts.jsonl", "rollouts_failures.jsonl")
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


def warn_once(config: pytest.Config, warning: Warning, where: Path, line: int = 1) -> None:
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
