"""The state of a run in one pytest process: options, run id, targets, harness, provider,
redactor, plans; and what the controller settled that every process reads."""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
import time
from collections.abc import Iterable, Mapping, Set
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest
from pydantic import SecretStr, ValidationError

from pytest_harbor.datasets import ResolvedDataset
from pytest_harbor.display import harbor_logger
from pytest_harbor.engine import Episode, EpisodeError, FailureKind
from pytest_harbor.harnesses import (
    Harness,
    HarnessFactory,
    HarnessOptionsError,
    ModelConfig,
    ModelGate,
    RecipeError,
    UnknownHarness,
    make_harness,
)
from pytest_harbor.harnesses.probe import ProbeHarness
from pytest_harbor.labels import OWNER_LABEL, RUN_LABEL, TASK_LABEL, TRIAL_LABEL
from pytest_harbor.locks import FileLock, Slots
from pytest_harbor.plugin.options import HarborOptions, ModelOptions
from pytest_harbor.plugin.phases import PhaseBoard
from pytest_harbor.reach import reach_openings
from pytest_harbor.redaction import run_redactor
from pytest_harbor.relay import RelayClient
from pytest_harbor.run.planning import Selection, TasksetPlan, plan_taskset
from pytest_harbor.run.reaper import reap_orphans
from pytest_harbor.sandboxes import (
    ImageSource,
    ProviderContext,
    ProviderFactory,
    ProviderOptionsError,
    SandboxError,
    SandboxProvider,
    UnknownProvider,
    make_provider,
)
from pytest_harbor.sandboxes.base import ChecksGpus, GuardsBorder, Opening, WatchesOver
from pytest_harbor.sandboxes.compose.tasks import compose_spec, refuse_compose
from pytest_harbor.tasks import Task, TaskLoadError, is_dataset_dir, is_task_dir
from pytest_harbor.writers import ResultsLayout

__all__ = [
    "HARBOR_RUN",
    "SETTLED_TRIALS",
    "HandedTrials",
    "HarborRun",
    "SettledTrials",
    "Target",
    "find_target",
]


log = harbor_logger()


@dataclass(frozen=True)
class Target:
    """A folder the run collects: a task folder or a dataset; its name is the taskset."""

    path: Path
    is_task: bool
    #: The `--harbor-dataset` reference the folder was made from (None: a folder given).
    reference: str | None = None

    @property
    def taskset(self) -> str:
        # A reference's folder is named by its taskset (the dataset's name).
        return self.path.name

    @property
    def described(self) -> str:
        """What the user gave: the reference, or the folder."""
        return self.reference or str(self.path)

    @property
    def hook_path(self) -> Path:
        """Where pytest looks for conftest.py for this target's nodes: never inside a task."""
        return self.path.parent if self.is_task else self.path


def find_target(path: Path, test_file_patterns: Iterable[str] = ()) -> Target | None:
    """The target a folder argument names, or None when it is an ordinary test folder."""
    if is_task_dir(path):
        return Target(path, is_task=True)
    if is_dataset_dir(path, test_file_patterns):
        return Target(path, is_task=False)
    return None


def new_run_id() -> str:
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{secrets.token_hex(3)}"


class SettledTrials(Protocol):
    """What the controller settles before any worker starts, read by every process that
    collects or runs trials: the controller's `PlannedRun` (written by its pre-flight), a
    worker's `HandedTrials` (from its start-up data)."""

    @property
    def row_digests(self) -> Mapping[str, str]:
        """Each task's digest as the controller materialized its rows: `taskset/task`."""
        ...

    @property
    def done_trials(self) -> Set[str]:
        """The trials a resumed run finished already: they are not collected again."""
        ...


@dataclass(frozen=True)
class HandedTrials:
    """An xdist worker's `SettledTrials`: what the controller handed it at its start."""

    row_digests: Mapping[str, str] = field(default_factory=dict)
    done_trials: frozenset[str] = frozenset()


class HarborRun:
    """Shared by every node of a run in one process (controller or xdist worker): made
    once per process by `pytest_configure`, from the options and (on a worker) what the
    controller handed it. Its fields are set as it is made, and its machinery (plans,
    slots, cleanups, watchdogs) is written by its own methods, but for `started_early`,
    which a trial adds its early-started episode to (nodes.py). What only the controller
    learns is not here: see `PlannedRun` (plugin/planned.py) and `RunReport`."""

    def __init__(
        self,
        options: HarborOptions,
        *,
        run_id: str,
        owner: str,
        targets: Iterable[Target],
        is_worker: bool,
        registered_harnesses: Mapping[str, HarnessFactory] | None = None,
        registered_providers: Mapping[str, ProviderFactory] | None = None,
        references: Iterable[ResolvedDataset] = (),
    ) -> None:
        self.options = options
        #: The run's datasets by reference, by the folder each was made into.
        self.references = {reference.path: reference for reference in references}
        self.run_id = run_id
        self.owner = owner
        self.targets = {target.path: target for target in targets}
        self.is_worker = is_worker
        try:
            self.harness: Harness = make_harness(
                options.agent, options.agent_options, registered=registered_harnesses
            )
        except UnknownHarness as error:
            raise pytest.UsageError(f"--harbor-agent: {error}") from None
        except HarnessOptionsError as error:
            raise pytest.UsageError(f"--harbor-agent-option: {error}") from None
        except RecipeError as error:
            raise pytest.UsageError(f"--harbor-agent: {error}") from None
        except ImportError as error:
            extra = "" if options.agent.startswith("harbor:") else "; install pytest-harbor[agents]"
            raise pytest.UsageError(f"--harbor-agent {options.agent}: {error}{extra}") from None
        #: Check mode's second harness, run once per task beside the oracle's repeats.
        self.check_harness: Harness | None = make_harness("nop", {}) if options.check else None
        #: Check mode's third: an agent that looks for ways to win without the work.
        self.probe_harness: Harness | None = ProbeHarness() if options.check else None
        #: The model the harness talks to (None for harnesses that talk to none).
        self.model: ModelConfig | None = (
            _model_config(options.model, options.agent) if self.harness.needs_model else None
        )
        self.settings = options.settings
        try:
            self._provider: SandboxProvider = make_provider(
                options.sandbox,
                self.settings.sandbox_provider_options,
                registered=registered_providers,
                context=ProviderContext(
                    run_id=run_id, scratch_dir=self.scratch_dir, is_worker=is_worker
                ),
            )
        except UnknownProvider as error:
            raise pytest.UsageError(f"--harbor-sandbox: {error}") from None
        except ProviderOptionsError as error:
            raise pytest.UsageError(f"setting sandbox_provider_options: {error}") from None
        #: The provider tasks that ask for GPUs run on (`gpu_sandbox_provider`), or None.
        self._gpu_provider: SandboxProvider | None = None
        block = self.settings.gpu_sandbox_provider
        if block is not None:
            try:
                self._gpu_provider = make_provider(
                    block.sandbox,
                    block.options,
                    registered=registered_providers,
                    context=ProviderContext(
                        run_id=run_id, scratch_dir=self.scratch_dir, is_worker=is_worker
                    ),
                )
            except (UnknownProvider, ProviderOptionsError) as error:
                raise pytest.UsageError(f"setting gpu_sandbox_provider: {error}") from None
        #: Every value no file or report of the run may show.
        self.redactor = run_redactor(self.settings, self.model)
        self._model_gate: ModelGate | None = None
        #: The run's model relay, every harness's only way to the model (plugin/relay.py):
        #: started by the controller's pre-flight, its address handed to each worker.
        self.relay: RelayClient | None = None
        self.layout = ResultsLayout(
            options.results_dir,
            validation=self.harness.validates,
            verifier_root=Path(self.settings.artifacts_dir)
            if self.settings.artifacts_dir
            else None,
        )
        self._slots: Slots | None = None
        self._plans: dict[Path, TasksetPlan | TaskLoadError] = {}
        #: Episodes whose sandbox started ahead of their trial (see HarborTrial.start_early).
        self.started_early: list[Episode] = []
        self._cleanups: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []
        self._cleanup_errors: list[str] = []
        self._watched = False

    @property
    def provider(self) -> SandboxProvider:
        return self._provider

    @property
    def providers(self) -> list[SandboxProvider]:
        """The run's provider, and the GPU tasks' when the settings name one."""
        return [self._provider] + ([self._gpu_provider] if self._gpu_provider else [])

    def provider_for(self, task: Task) -> SandboxProvider:
        """Where `task`'s episodes run: `gpu_sandbox_provider` for a task that asks for
        GPUs (when set), else the run's provider."""
        if self._gpu_provider is not None and task.config.environment.gpus:
            return self._gpu_provider
        return self._provider

    def plan(self, target: Target) -> TasksetPlan:
        """A target's taskset, planned once per process (the pre-flight and collection
        share it); raises TaskLoadError when the whole taskset is spoilt."""
        planned = self._plans.get(target.path)
        if planned is None:
            try:
                planned = self._plan(target)
            except TaskLoadError as error:
                planned = error
            self._plans[target.path] = planned
        if isinstance(planned, TaskLoadError):
            raise planned
        return planned

    def reference_record(self, target: Target) -> dict[str, Any] | None:
        """A dataset by reference as the results record it (the cache folder left out:
        it is this machine's)."""
        reference = self.references.get(target.path)
        return None if reference is None else reference.model_dump(mode="json", exclude={"folder"})

    def _plan(self, target: Target) -> TasksetPlan:
        reference = self.references.get(target.path)
        if reference is not None and not reference.tasks:
            raise TaskLoadError(
                target.path,
                f"no task of {reference.given} could be fetched: "
                + "; ".join(f"{name}: {why}" for name, why in reference.refused.items()),
            )
        plan = self._plan_folder(target)
        if reference is not None:
            selection = Selection(self.options.only_tasks, self.options.exclude_tasks)
            for name, why in reference.refused.items():
                plan.task_ids.append(name)
                if selection.admits(name):
                    path = target.path / name
                    plan.failures[path] = TaskLoadError(
                        path, f"not fetched ({reference.given}): {why}"
                    )
        return plan

    def _plan_folder(self, target: Target) -> TasksetPlan:
        return plan_taskset(
            target.path,
            harness=self.harness.name,
            capabilities=self._provider.capabilities,
            provider=self._provider.name,
            gpu_provider=None
            if self._gpu_provider is None
            else (self._gpu_provider.capabilities, self._gpu_provider.name),
            selection=Selection(self.options.only_tasks, self.options.exclude_tasks),
            variables=self.settings.template_sources(),
            repeats=self.options.repeats,
            admit_any_harness=self.options.allow_unsupported_pairing,
            check=self._check_task,
            allow_remote_add=self.settings.allow_remote_add,
        )

    def _check_task(self, task: Task) -> None:
        """What only the run knows refuses a task: its provider's engine has no GPUs, or
        cannot choose the GPU type the settings ask for; a Compose task's file."""
        provider = self.provider_for(task)
        environment, task_file = task.config.environment, task.path / "task.toml"
        if environment.gpus:
            problem = provider.gpu_problem() if isinstance(provider, ChecksGpus) else None
            if problem is not None:
                raise TaskLoadError(
                    task_file,
                    f"asks for {environment.gpus} GPU(s): {problem}",
                    key="environment.gpus",
                )
            types = environment.gpu_types if self.settings.request_gpu_type else None
            if types and not provider.capabilities.gpu_types:
                raise TaskLoadError(
                    task_file,
                    f"request_gpu_type asks the {provider.name} sandbox for the GPU type "
                    f"{types[0]!r}, which it cannot choose",
                    key="environment.gpu_types",
                )
        if provider.capabilities.compose:
            self._check_compose(task)

    def _check_compose(self, task: Task) -> None:
        """A Compose task's file is read and checked, and the images its services name
        without a build must be here (or pulled): else it is refused, in skipped.json."""
        spec = compose_spec(task, self.settings)
        if spec is None:
            return
        refuse_compose(task, self.settings)
        for service, image in spec.images().items():
            try:
                self._provider.prepare_image(
                    ImageSource(
                        docker_image=image,
                        context_dir=None,
                        build_timeout_sec=task.config.environment.build_timeout_sec,
                        pull_retries=self.settings.image_pull_retries,
                    )
                )
            except SandboxError as error:
                raise TaskLoadError(
                    spec.file, str(error), key=f"services.{service}.image"
                ) from None

    def acquire_slot(self) -> FileLock | None:
        """A place under `max_concurrent_episodes` (shared by every worker of the run);
        None when the run sets no cap. Waiting past `queue_timeout_seconds` fails."""
        cap = self.settings.max_concurrent_episodes
        if cap is None:
            return None
        if self._slots is None:
            self._slots = Slots(self.scratch_dir / "slots", cap)
        timeout = self.settings.queue_timeout_seconds or 0.0
        slot = self._slots.acquire(timeout)
        if slot is None:
            raise EpisodeError(
                FailureKind.QUEUE_TIMEOUT,
                f"no episode slot came free within queue_timeout_seconds = {timeout:g} s "
                f"(max_concurrent_episodes = {cap})",
            )
        return slot

    @property
    def model_gate(self) -> ModelGate | None:
        """The cap on model requests in flight, shared by every process of the run here."""
        if self.model is None:
            return None
        if self._model_gate is None:
            self._model_gate = Slots(
                self.scratch_dir / "model-requests", self.model.max_concurrent_requests
            )
        return self._model_gate

    @property
    def scratch_dir(self) -> Path:
        """A folder of this run's own, shared by its processes on this machine."""
        return Path(tempfile.gettempdir()) / f"pytest-harbor-{self.run_id}"

    @property
    def phases(self) -> PhaseBoard:
        """Each running episode's phase, for the controller's live view (plugin/phases.py)."""
        return PhaseBoard(self.scratch_dir / "phases")

    def release(self, episode: Episode, slot: FileLock | None = None) -> None:
        """Remove the episode's sandbox in the background, so the next episode can start
        while the engine removes this one, then free its slot; wait_for_cleanup() collects
        them all."""
        if self._cleanups is None:
            self._cleanups = ThreadPoolExecutor(2, thread_name_prefix="harbor-cleanup")

        def clean() -> None:
            try:
                episode.cleanup()
            finally:
                if slot is not None:
                    slot.release()

        self._pending.append(self._cleanups.submit(clean))

    def wait_for_cleanup(self) -> None:
        """Wait until every released sandbox is gone, those started early for a trial that
        never ran included (their harness sessions closed: nothing of theirs writes to
        the run's folders after this); the errors met are kept for cleanup_errors()."""
        for episode in self.started_early:
            self.release(episode)
        self.started_early = []
        pending, self._pending = self._pending, []
        for future in pending:
            try:
                future.result()
            except Exception as error:
                self._cleanup_errors.append(str(error))

    def cleanup_errors(self) -> list[str]:
        """The errors met removing sandboxes since the last call."""
        errors, self._cleanup_errors = self._cleanup_errors, []
        return errors

    @property
    def tasksets(self) -> list[str]:
        return sorted({target.taskset for target in self.targets.values()})

    def labels(self, task: str, trial: str) -> dict[str, str]:
        return {
            **self.settings.sandbox_metadata,
            RUN_LABEL: self.run_id,
            OWNER_LABEL: self.owner,
            TASK_LABEL: task,
            TRIAL_LABEL: trial,
        }

    def image_labels(self) -> dict[str, str]:
        """Built images are a cache for later runs: they name the run and process that
        built them (the reaper leaves them alone)."""
        return {RUN_LABEL: self.run_id, OWNER_LABEL: self.owner}

    def watch(self) -> None:
        """Once per process: what this process makes is removed when it is gone, however
        it ends (each provider that can see to it); one warning when one cannot."""
        if self._watched:
            return
        self._watched = True
        openings = self._openings()
        for provider in self.providers:
            if isinstance(provider, GuardsBorder):
                provider.open_to(openings)
            if not isinstance(provider, WatchesOver):
                continue
            try:
                provider.watch({RUN_LABEL: self.run_id, OWNER_LABEL: self.owner})
            except SandboxError as error:
                log.warning(
                    "%s: %s; what this process leaves if it is killed is removed when the "
                    "next run starts",
                    provider.name,
                    error,
                )

    def _openings(self) -> list[Opening]:
        """What the border opens for this process's sandboxes: the model relay's port on
        this machine, and what the `reach` setting names (a name as it resolves now; one
        that does not is left out, with a warning)."""
        openings = []
        if self.relay is not None:
            openings.append(Opening(None, self.relay.address.port))
        for entry in self.settings.reach:
            try:
                openings += reach_openings([entry])
            except ValueError as error:
                log.warning("%s; it stays closed", error)
        return openings

    def unwatch(self) -> None:
        """This process is done with its providers: their watchdogs go."""
        for provider in self.providers:
            if isinstance(provider, WatchesOver):
                with contextlib.suppress(SandboxError):
                    provider.unwatch()

    def reap(self) -> int:
        """Remove the sandboxes of runs whose process is gone (never a live run's)."""
        reaped = 0
        for provider in self.providers:
            with contextlib.suppress(SandboxError):  # no engine to ask
                reaped += reap_orphans(provider)
        return reaped

    def remove_sandboxes(self) -> int:
        """Remove whatever sandbox of this run is still there (after an interrupt, say)."""
        return sum(
            provider.remove_labelled({RUN_LABEL: self.run_id}) for provider in self.providers
        )


def _model_config(options: ModelOptions, agent: str) -> ModelConfig:
    """The model of a harness that needs one; a usage error names what is missing."""
    if not options.name or not options.url:
        missing = " and ".join(
            flag
            for flag, value in (
                ("--harbor-model", options.name),
                ("--harbor-model-url", options.url),
            )
            if not value
        )
        raise pytest.UsageError(f"--harbor-agent {agent} talks to a model: give {missing}")
    key = options.api_key
    if key is None:
        key = os.environ.get(options.api_key_env)
        if key is None and options.replay is None:  # a replay needs no key
            raise pytest.UsageError(
                f"--harbor-model-api-key-env: the variable {options.api_key_env} is not set; "
                "set it to the endpoint's API key (any value, such as EMPTY, for an endpoint "
                "that needs none)"
            )
    try:
        return ModelConfig(
            name=options.name,
            base_url=options.url,
            params=options.params,
            api_key=SecretStr(key) if key else None,
            max_concurrent_requests=options.concurrency,
        )
    except ValidationError as error:
        first = error.errors()[0]
        raise pytest.UsageError(
            f"--harbor-model-url: {first['msg'].removeprefix('Value error, ')}"
        ) from None


HARBOR_RUN = pytest.StashKey[HarborRun]()
#: What the controller settled, as this process reads it (set with HARBOR_RUN).
SETTLED_TRIALS = pytest.StashKey[SettledTrials]()
