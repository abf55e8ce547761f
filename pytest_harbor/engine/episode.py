"""One episode: seed a sandbox, run each turn (agent, then verifier), clean up.

Usable from plain Python; the pytest layer only decides when each phase runs.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pytest_harbor.engine.agent_phase import AgentPhase
from pytest_harbor.engine.budget import EpisodeBudget, episode_budget
from pytest_harbor.engine.compose_tasks import compose_spec, with_overlay
from pytest_harbor.engine.failures import EpisodeError, FailureKind
from pytest_harbor.engine.faults import blame
from pytest_harbor.engine.harness_calls import HARNESS_GRACE_S, InProcessGate
from pytest_harbor.engine.processes import (
    SandboxSurvey,
    end_processes_since,
    end_user_processes,
    survey,
)
from pytest_harbor.engine.readiness import entrypoint_failure, start_entrypoint, wait_healthy
from pytest_harbor.engine.results import (
    EpisodeResult,
    PhaseTimings,
    TurnResult,
    TurnTimings,
    episode_id,
)
from pytest_harbor.engine.rewards import RewardReading
from pytest_harbor.engine.rollup import roll_up, stop_reason
from pytest_harbor.engine.scripts import HAND_WORKDIR, check, trusted
from pytest_harbor.engine.trajectory import transcript
from pytest_harbor.engine.verification import (
    SANDBOX_DIRECTORIES,
    VerifierRun,
    clear_for_next_turn,
    run_verifier,
)
from pytest_harbor.harnesses.base import (
    AgentFailure,
    AgentRun,
    AgentSetupError,
    Harness,
    ModelGate,
    Usage,
)
from pytest_harbor.harnesses.model import ModelConfig
from pytest_harbor.redaction import Redactor
from pytest_harbor.sandboxes.archives import filter_archive
from pytest_harbor.sandboxes.base import (
    ROOT_USER,
    ImageSource,
    Placement,
    Sandbox,
    SandboxError,
    SandboxGroup,
    SandboxProvider,
    SandboxSpec,
    SandboxStartError,
    Spawned,
)
from pytest_harbor.sandboxes.compose import ComposeSpec
from pytest_harbor.settings import HarborSettings
from pytest_harbor.tasks import Task, Turn, task_digest
from pytest_harbor.tasks.config import EnvironmentConfig
from pytest_harbor.tasks.errors import TaskLoadError
from pytest_harbor.threads import join

__all__ = ["Episode", "TurnOutput", "verifies_separately"]

log = logging.getLogger("pytest_harbor")

#: Where the agent publishes what a separate verifier gets, besides declared artifacts.
ARTIFACTS_DIR = "/logs/artifacts"


@dataclass(frozen=True)
class TurnOutput:
    """A turn's result, and the folder that holds what the verifier left in
    /logs/verifier (with the transcript it was given)."""

    result: TurnResult
    verifier_dir: Path

    @property
    def verifier_files(self) -> dict[str, bytes]:
        """The files of `verifier_dir` (read now: mind their size)."""
        if not self.verifier_dir.is_dir():
            return {}
        return {
            path.relative_to(self.verifier_dir).as_posix(): path.read_bytes()
            for path in sorted(self.verifier_dir.rglob("*"))
            if path.is_file()
        }


class Episode:
    """Seed, turns, cleanup for one task and repeat.

    Call `prepare()` (images; not on the episode clock), `seed()`, `run_turn()` for each
    turn, then `result()`; `cleanup()` is idempotent and safe from any state. Failures
    that leave the episode without a result raise EpisodeError.

    `model` is what a model-driven harness talks to; `model_gate` caps its requests in
    flight (one process's own cap when not given); the harness keeps its files in
    `agent_logs_dir`, and each verification's files go to `verifier_logs_dir` (for a
    multi-step task, a folder per step below it); either, when not given, is a temporary
    folder removed at cleanup. Values of `redactor` (by default the settings' secrets and
    the model's key) never reach those files or a failure message.
    """

    def __init__(
        self,
        task: Task,
        *,
        taskset: str,
        repeat: int,
        harness: Harness,
        provider: SandboxProvider,
        labels: Mapping[str, str],
        image_labels: Mapping[str, str] | None = None,
        settings: HarborSettings | None = None,
        expected_digest: str | None = None,
        model: ModelConfig | None = None,
        model_gate: ModelGate | None = None,
        agent_logs_dir: Path | None = None,
        verifier_logs_dir: Path | None = None,
        redactor: Redactor | None = None,
        name: str | None = None,
    ) -> None:
        settings = settings or HarborSettings()
        self.task = with_overlay(task, settings)
        self.taskset = taskset
        self.repeat = repeat
        self._name = name
        self.harness = harness
        #: The provider the episode's sandbox comes from: the run's own, or the engine a
        #: provider of several engines placed the episode on (see _place()).
        self.provider = provider
        self._home = provider
        self._placement: Placement | None = None
        self.labels = dict(labels)
        #: Labels of an image this episode builds (images outlive episodes and runs).
        self.image_labels = dict(labels if image_labels is None else image_labels)
        self.settings = settings
        self.expected_digest = expected_digest
        self.separate_verifier = verifies_separately(task, self.settings)
        self._image: str | None = None
        self._verifier_image: str | None = None
        self._sandbox: Sandbox | None = None
        self._turns: list[TurnResult] = []
        self._timings: dict[str, float] = {}
        self._clock_start: float | None = None
        self._clock_end: dict[str, float] = {}
        self._wall: list[str | None] = [None, None]
        self._deadline: float | None = None
        self._masked: RewardReading | None = None
        self._entrypoint: Spawned | None = None
        self._entrypoint_noted = False
        self._stopped_after: str | None = None
        self._stop_reason: str | None = None
        #: Numeric users of the task's turns, resolved to names at seed.
        self._users: dict[str, str] = {}
        #: The task's users (and the image's) as `uid:gid`, read at the end of the seed.
        self._ids: dict[str, str] = {}
        self._workdir_owner: str | None = None
        self._budget: EpisodeBudget | None = None
        self._early: _EarlyStart | None = None
        self.model = model
        self.redactor = redactor or Redactor(
            [*self.settings.secrets.values(), *(model.secret_values() if model else [])]
        )
        self._agent = AgentPhase(
            harness,
            episode_id=self.id,
            task=task,
            model=model,
            model_gate=model_gate or InProcessGate(model.max_concurrent_requests if model else 1),
            logs_dir=agent_logs_dir,
            redactor=self.redactor,
        )
        #: The agent's sandbox as the seed left it (before any agent).
        self._survey: SandboxSurvey | None = None
        #: Each run of the episode (a retry after an agent failure starts a fresh one).
        self._attempt = 1
        self._retries: dict[str, int] = {}
        #: Model usage of attempts given up for a retry.
        self._spent: list[Usage] = []
        self._verifier_root = verifier_logs_dir
        self._own_verifier_root: Path | None = None
        #: The harness could not make its image (prepare_image): every turn fails so.
        self._setup_failure: AgentFailure | None = None
        #: A Compose task's images built for services other than main.
        self._built: dict[str, str] = {}

    @property
    def id(self) -> str:
        """`<task>__r<repeat>`, or the name the episode was given."""
        return self._name or episode_id(self.task.id, self.repeat)

    @property
    def workdir(self) -> str | None:
        return self.task.config.environment.workdir

    @property
    def verifier_mode(self) -> str:
        if self.separate_verifier:
            return "separate"
        return "snapshot" if self.settings.verify_from_snapshot else "shared"

    @property
    def budget(self) -> EpisodeBudget:
        """The time budget (raises EpisodeError when the settings refuse the task)."""
        if self._budget is None:
            self._budget = episode_budget(
                self.task, self.settings, separate_verifier=self.separate_verifier
            )
        return self._budget

    # ------------------------------------------------------------------------ seed

    def prepare(self) -> None:
        """Make the images (build once per content hash, or fetch the prebuilt one)."""
        if self._early is not None:
            self._early.join()
            if self._early.prepare_error is not None:
                raise self._early.prepare_error
            return
        self._prepare_now()

    def prepare_images(self) -> None:
        """Make every image the episode needs, as prepare() does (for a run that builds
        them ahead of its episodes); raises EpisodeError when one cannot be made. It takes
        no place on an engine: the images go where the provider makes unplaced ones."""
        self._prepare_now(place=False)

    def _place(self) -> None:
        """On a provider of several engines, take a place on one with room (it may wait
        for one) and make everything of the episode there; cleanup() gives it back."""
        place = getattr(self._home, "place", None)
        if place is None or self._placement is not None:
            return
        try:
            self._placement = place()
        except SandboxStartError as error:
            raise EpisodeError(FailureKind.SANDBOX_START_FAILED, str(error)) from None
        self.provider = self._placement.provider

    def _prepare_now(self, place: bool = True) -> None:
        if self._image is not None:
            return
        if place:
            self._place()
        started = time.monotonic()
        try:
            image = self._prepare_task_images()
            if self.separate_verifier:
                self._verifier_image = self.provider.prepare_image(self._verifier_source())
        except SandboxStartError as error:
            raise EpisodeError(FailureKind.SANDBOX_START_FAILED, str(error)) from None
        self._timings["build_s"] = time.monotonic() - started
        started = time.monotonic()
        self._setup_failure = None
        try:
            prepare = getattr(self.harness, "prepare_image", None)
            self._image = (
                image if prepare is None else prepare(image, self.provider, self.image_labels)
            )
        except AgentSetupError as error:
            # The agent's turn fails (agent_outcome_policy decides); the sandbox is the
            # task's own, so that a verification has something to grade.
            self._setup_failure = AgentFailure(
                cause=error.cause, message=self.redactor.text(str(error))
            )
            self._image = image
        if self._image != image or self._setup_failure is not None:
            self._timings["agent_install_s"] = time.monotonic() - started

    def _prepare_task_images(self) -> str:
        """The main image; for a Compose task also every service's (built once per
        content hash, pulled when missing), kept for the start."""
        spec = self._compose
        if spec is None:
            return self.provider.prepare_image(self._image_source(self.task.config.environment))
        environment = self.task.config.environment
        built = {
            service: self.provider.prepare_image(
                ImageSource(
                    docker_image=None,
                    context_dir=context,
                    build_timeout_sec=environment.build_timeout_sec,
                    labels=self.image_labels,
                )
            )
            for service, context in spec.builds.items()
        }
        for image in spec.images().values():
            self.provider.prepare_image(
                ImageSource(
                    docker_image=image,
                    context_dir=None,
                    build_timeout_sec=environment.build_timeout_sec,
                    pull_retries=self.settings.image_pull_retries,
                )
            )
        self._built = {service: tag for service, tag in built.items() if service != "main"}
        return built.get("main") or spec.images()["main"]

    @property
    def _compose(self) -> ComposeSpec | None:
        try:
            return compose_spec(self.task, self.settings)
        except TaskLoadError as error:
            raise EpisodeError(FailureKind.TASK_REFUSED, str(error)) from None

    def start_early(self) -> None:
        """Make the images and start the sandbox in the background, so that a later seed()
        finds it running (while another episode still works, say). The seed still checks
        the folder, opens the deadline and does everything else."""
        if self._early is None and self._sandbox is None:
            self._early = _EarlyStart(self)

    def _image_source(self, environment: EnvironmentConfig) -> ImageSource:
        dockerfile = self.task.dockerfile
        return ImageSource(
            docker_image=environment.docker_image,
            context_dir=None if dockerfile is None else dockerfile.parent,
            build_timeout_sec=environment.build_timeout_sec,
            labels=self.image_labels,
            pull_retries=self.settings.image_pull_retries,
        )

    def _verifier_source(self) -> ImageSource:
        environment = self.task.config.verifier.environment
        tests_dockerfile = self.task.verifier_dockerfile
        if environment is not None and environment.docker_image is not None:
            return ImageSource(
                docker_image=environment.docker_image,
                context_dir=None,
                build_timeout_sec=environment.build_timeout_sec,
                labels=self.image_labels,
                pull_retries=self.settings.image_pull_retries,
            )
        if tests_dockerfile is not None:
            return ImageSource(
                docker_image=None,
                context_dir=tests_dockerfile.parent,
                build_timeout_sec=(environment or self.task.config.environment).build_timeout_sec,
                labels=self.image_labels,
            )
        return self._image_source(self.task.config.environment)

    def seed(self) -> None:
        """Check the folder is unchanged, start the sandbox, copy loose environment files,
        start the image's ENTRYPOINT and wait for the healthcheck."""
        budget = self.budget
        if budget.warning:
            log.warning(budget.warning)
        self._refuse_what_cannot_run()
        if self._image is None:
            self.prepare()
        assert self._image is not None
        self._clock_start = started = time.monotonic()
        self._wall[0] = _now()
        self._deadline = started + budget.deadline_s
        self._check_digest()
        environment = self.task.config.environment
        try:
            self._sandbox = self._take_early_sandbox() or self._start_agent_sandbox()
            if self.task.loose_environment_files:
                target = self.workdir or self._image_workdir(self._image)
                self._sandbox.upload(self.task.environment_dir, target)
            self._entrypoint = start_entrypoint(
                self._sandbox, self.provider.image_config(self._image), self.workdir
            )
        except SandboxError as error:
            raise EpisodeError(FailureKind.SANDBOX_START_FAILED, str(error)) from None
        self._users = self._resolve_uids(self._sandbox)
        if environment.healthcheck is not None:
            wait_healthy(
                self._sandbox,
                environment.healthcheck,
                workdir=self.workdir,
                user=_user(self.task.config.agent.user),
                remaining=self._remaining,
            )
        self._entrypoint_masks()
        try:
            if self._survey is None:
                self._survey = survey(self._sandbox, self._named_users())
            self._ids = dict(self._survey.ids)
        except SandboxError as error:
            raise EpisodeError(FailureKind.SANDBOX_START_FAILED, str(error)) from None
        self._timings["seed_s"] = time.monotonic() - started

    @property
    def _nothing_starts_at_seed(self) -> bool:
        """The seed adds no process to the started sandbox (no ENTRYPOINT, no healthcheck):
        a survey right after the start is as good as one at the end of the seed."""
        assert self._image is not None
        return (
            not self.provider.image_config(self._image).entrypoint
            and self.task.config.environment.healthcheck is None
        )

    def _take_early_sandbox(self) -> Sandbox | None:
        if self._early is None:
            return None
        early, self._early = self._early, None
        early.join()
        if early.start_error is not None:
            raise early.start_error
        return early.sandbox

    def _refuse_what_cannot_run(self) -> None:
        """Seed-time refusals that depend on the settings, the harness or the provider."""
        config = self.task.config
        multi_step = config.is_multi_step
        if (
            multi_step
            and self.settings.turn_sessions == "continue"
            and not self.harness.can_continue
        ):
            raise EpisodeError(
                FailureKind.TASK_REFUSED,
                f"turn_sessions = continue needs a harness that can continue a session; "
                f"{self.harness.name} cannot (set turn_sessions to fresh)",
            )
        if multi_step and self.settings.separate_verifier_for_artifacts and config.artifacts:
            raise EpisodeError(
                FailureKind.TASK_REFUSED,
                "separate_verifier_for_artifacts cannot send a multi-step task to a separate "
                "verifier: multi-step tasks verify in their agent's sandbox",
            )
        if not self.provider.capabilities.network_off:
            offline = config.environment.network_mode == "no-network" or any(
                not (turn.agent_network and turn.verifier_network) for turn in self.task.turns
            )
            if offline:
                raise EpisodeError(
                    FailureKind.TASK_REFUSED,
                    "the task has a phase without the network (network_mode = no-network), "
                    f"which the {self.provider.name} sandboxes cannot go without on this "
                    "network (sandbox_provider_options.network)",
                )
        if not self.provider.capabilities.user_groups:
            for turn in self.task.turns:
                for role, user in (("agent", turn.agent_user), ("verifier", turn.verifier_user)):
                    if user is not None and ":" in user:
                        raise EpisodeError(
                            FailureKind.TASK_REFUSED,
                            f"step {turn.name!r}: the {role} user {user!r} names a group, "
                            f"which the {self.provider.name} sandbox cannot apply",
                        )

    def _named_users(self) -> set[str]:
        """The users the engine runs or ends processes as, but root (nothing to look up)."""
        image_user = self.provider.image_config(self._image or "").user
        named = {image_user, *(u for t in self.task.turns for u in (t.agent_user, t.verifier_user))}
        return {user for user in named if user and user.split(":")[0] not in ("root", "0")}

    def _resolve_uids(self, sandbox: Sandbox) -> dict[str, str]:
        """Numeric agent users, as names (once per episode); an unknown uid stays a number."""
        uids = sorted(
            {t.agent_user for t in self.task.turns if t.agent_user and t.agent_user.isdigit()}
        )
        names: dict[str, str] = {}
        for uid in uids:
            found = sandbox.exec(["getent", "passwd", uid], user=ROOT_USER)
            name = found.stdout.split(":", 1)[0].strip() if found.exit_code == 0 else ""
            names[uid] = name or uid
        return names

    def _check_digest(self) -> None:
        if self.expected_digest is None:
            return
        now = task_digest(self.task.path)
        if now != self.expected_digest:
            raise EpisodeError(
                FailureKind.DIGEST_MISMATCH,
                f"{self.task.path} changed since its row was written ({self.expected_digest} "
                f"then, {now} now); run again to materialize it afresh",
            )

    def _start(
        self,
        image: str,
        environment: EnvironmentConfig,
        *,
        record: bool = True,
        network: bool | None = None,
        group: SandboxGroup | None = None,
    ) -> Sandbox:
        """A sandbox from `image` with `environment`'s settings; `network` (else the
        environment's mode) says whether it has the network from its start."""
        override = self.settings.sandbox_resources_override
        cpus, memory = environment.cpus, environment.memory_mb
        if override is not None:
            cpus = override.cpu if override.cpu is not None else cpus
            memory = override.memory_mib if override.memory_mib is not None else memory
        # A leaked sandbox ends itself once the episode and its cleanup are long over.
        ttl = (
            self.budget.deadline_s
            + self.settings.cleanup_timeout_seconds
            + self.settings.sandbox_ttl_slack_s
        )
        started = time.monotonic()
        sandbox = self.provider.start(
            SandboxSpec(
                image=image,
                workdir=environment.workdir,
                env=environment.env,
                cpus=cpus,
                memory_mb=memory,
                network=network
                if network is not None
                else environment.network_mode != "no-network",
                labels=self.labels,
                directories=SANDBOX_DIRECTORIES,
                ttl_s=ttl,
                ready_timeout_s=self.settings.sandbox_ready_timeout_s,
                group=group,
                pids_limit=self.settings.sandbox_pids_limit,
            )
        )
        if record:
            self._timings["start_s"] = time.monotonic() - started
        return sandbox

    def _start_agent_sandbox(self) -> Sandbox:
        """The agent's sandbox: with the network when any phase of any turn has it, and
        without it through the seed when the environment says `no-network`."""
        assert self._image is not None
        environment = self.task.config.environment
        online = environment.network_mode != "no-network"
        needed = online or any(t.agent_network or t.verifier_network for t in self.task.turns)
        spec = self._compose
        if spec is not None:
            # One network for every phase (checked at planning).
            group = SandboxGroup(config=spec.config, built=self._built, episode=self.id)
            return self._start(self._image, environment, network=needed, group=group)
        sandbox = self._start(self._image, environment, network=needed)
        if needed and not online:
            sandbox.set_network(False)
        return sandbox

    def _image_workdir(self, image: str) -> str:
        return self.provider.image_config(image).workdir or "/"

    def _entrypoint_masks(self) -> RewardReading | None:
        """Before any agent: an ENTRYPOINT that exited non-zero masks the sample (the image's
        fault: no agent has had the sandbox yet); returns the masking reading."""
        if self._masked is None and not self._turns:
            failure = entrypoint_failure(self._entrypoint)
            if failure is not None:
                self._masked = RewardReading.failed(
                    FailureKind.ENTRYPOINT_FAILED, failure, masked=True
                )
        return self._masked

    def _entrypoint_note(self) -> list[str]:
        """Once an agent has had the sandbox: an ENTRYPOINT that exited non-zero is noted
        (once), and the episode verified as usual (the agent may have ended it; nothing
        tells)."""
        code = None if self._entrypoint is None else self._entrypoint.exit_code()
        if code in (None, 0) or self._entrypoint_noted:
            return []
        self._entrypoint_noted = True
        return [f"the image's ENTRYPOINT exited with code {code} after the agent's turn began"]

    # ------------------------------------------------------------------------ turns

    def run_turn(self, turn: Turn) -> TurnOutput:
        """Prepare the sandbox for `turn`, let the harness work on it, run the collect
        hooks, then verify. After a turn that stops the episode, `stopped_after` is set.

        An agent that failed for a classified cause is handled by `agent_outcome_policy`:
        verified, run again from a fresh sandbox (retry, first turn only), or failed with
        no result (EpisodeError).

        Once an agent has had the sandbox (this turn's, or an earlier turn's), a step of
        the engine that fails scores the turn 0 unless the engine shows that no agent can
        have caused it (engine/faults.py)."""
        sandbox = self._require_sandbox()
        if self.stopped_after is not None:
            raise RuntimeError(f"episode {self.id} stopped after turn {self.stopped_after}")
        if self._entrypoint_masks() is not None:
            assert self._masked is not None
            return self._record(turn, AgentRun(), VerifierRun(self._masked), 0.0, 0.0)
        original = turn
        try:
            if self._turns:
                clear_for_next_turn(sandbox)
            turn = self._prompted(self._as_user(sandbox, turn))
            sandbox.set_network(turn.agent_network)
            before = self._processes_now(sandbox)
        except SandboxError as error:
            if not self._turns:
                raise EpisodeError(FailureKind.SANDBOX_LOST, str(error)) from None
            reading = self._fault(sandbox, error, f"preparing the sandbox for turn {turn.name}")
            return self._record(turn, AgentRun(), VerifierRun(reading), 0.0, 0.0)
        started = time.monotonic()
        if self._setup_failure is not None:
            agent: AgentRun | None = AgentRun(failure=self._setup_failure)
        else:
            agent = self._agent.open_session(
                sandbox, turn, workdir=self.workdir, seconds=self._setup_room(turn)
            )
        setup_s = time.monotonic() - started
        started = time.monotonic()
        if agent is None:
            bounded = self._bounded(turn)
            seconds = bounded.agent_timeout_sec or self._remaining()
            # A harness that overruns gets a little time to wind down, from what the
            # verifier's share leaves (at least a second).
            spare = self._remaining() - seconds - turn.verifier_timeout_sec
            agent = self._agent.run_turn(
                sandbox,
                bounded,
                index=self._index(turn),
                workdir=self.workdir,
                seconds=seconds,
                grace_s=min(HARNESS_GRACE_S, max(1.0, spare - self.settings.verifier_grace_s)),
            )
        agent_s = time.monotonic() - started
        unended: RewardReading | None = None
        if agent.timed_out:
            try:
                # Every process the turn started goes (the agent's CLI, and whatever it
                # left running or detached), before anything else.
                end_processes_since(sandbox, before)
            except SandboxError as error:
                unended = self._fault(sandbox, error, "ending the processes of a turn out of time")
        self._require_time("the agent")
        if agent.failure is not None and self._handle_agent_failure(agent):
            return self.run_turn(original)
        last = turn.name == self.task.turns[-1].name
        if not self._continuing or last:
            self._close_session(sandbox)
        started = time.monotonic()
        notes = self._entrypoint_note()
        if unended is not None:
            verification = VerifierRun(unended)
        else:
            verification = self._after_agent(sandbox, turn, agent, notes)
        if self._remaining() <= 0:
            # The verifier had its share of the episode's time; running past the deadline
            # in the steps around it does not undo what it found.
            notes.append("the verification ended past the episode's deadline")
        verify_s = time.monotonic() - started
        output = self._record(turn, agent, verification, agent_s, verify_s, notes, setup_s)
        if self._stopped_after is not None:
            self._close_session(sandbox)
        return output

    def _after_agent(
        self, sandbox: Sandbox, turn: Turn, agent: AgentRun, notes: list[str]
    ) -> VerifierRun:
        """The network for the verifier, the agent's processes ended (a non-root agent's,
        before the collect hooks too), the collect hooks (their failures go to `notes`),
        then the verification."""
        doing = f"giving the verification of {turn.name} its network"
        try:
            sandbox.set_network(turn.verifier_network)
            agent_uid = self._agent_uid(turn)
            if agent_uid is not None and self.task.config.verifier.collect:
                doing = "ending the agent's processes"
                end_user_processes(sandbox, agent_uid)
            doing = "running the collect hooks"
            notes.extend(self._run_collect_hooks(sandbox))
            doing = f"verifying {turn.name}"
            written = transcript(f"{self.id}/{turn.name}", self.harness.name, turn, agent)
            return self._verify(sandbox, turn, written)
        except SandboxError as error:
            return VerifierRun(self._fault(sandbox, error, doing))

    def _fault(self, sandbox: Sandbox, error: SandboxError, doing: str) -> RewardReading:
        """A step that failed once an agent had `sandbox`: scored 0 when the sandbox is to
        blame; a masked sample (`harbor:sandbox_lost`) when the engine is."""
        blamed = blame(sandbox, error, doing)
        if blamed is not None:
            log.warning("%s: %s", self.id, self.redactor.text(blamed.failure_reason or ""))
            return blamed
        return RewardReading.failed(FailureKind.SANDBOX_LOST, f"{doing}: {error}", masked=True)

    def _processes_now(self, sandbox: Sandbox) -> frozenset[str]:
        """The processes there as the turn begins: the seed's survey for the first turn of
        an attempt, a fresh look for a later one."""
        if not self._turns and self._survey is not None:
            return self._survey.processes
        return survey(sandbox).processes

    @property
    def _continuing(self) -> bool:
        """One harness session for every turn (`turn_sessions = continue`)."""
        return self.task.config.is_multi_step and self.settings.turn_sessions == "continue"

    def _index(self, turn: Turn) -> int:
        return next(i for i, each in enumerate(self.task.turns) if each.name == turn.name)

    def _setup_room(self, turn: Turn) -> float:
        """What a session may take to open: the allowance, within what the episode leaves
        once the verifier has its share."""
        room = self._remaining() - turn.verifier_timeout_sec - self.settings.verifier_grace_s
        return min(self.settings.harness_setup_allowance_s, room)

    def _close_session(self, sandbox: Sandbox | None) -> None:
        self._agent.close(
            sandbox, workdir=self.workdir, seconds=self.settings.cleanup_timeout_seconds
        )

    def _handle_agent_failure(self, agent: AgentRun) -> bool:
        """Apply `agent_outcome_policy`: False to verify, True when a fresh attempt has
        been seeded; raises EpisodeError when the episode ends with no result."""
        failure = agent.failure
        assert failure is not None
        rule = self.settings.agent_outcome_policy.rule(failure.cause)
        if rule.action == "verify":
            return False
        kind = FailureKind.for_agent_cause(failure.cause)
        done = self._retries.get(failure.cause, 0)
        if rule.action == "retry":
            if self._turns:
                raise EpisodeError(
                    kind,
                    f"{failure.message} (in turn {len(self._turns) + 1}: a retry would run the "
                    "earlier turns again, so the episode has no result; --harbor-resume runs "
                    "it afresh)",
                )
            if done < rule.retries:
                if agent.usage is not None:  # what the abandoned attempt cost still counts
                    self._spent.append(agent.usage)
                self._start_over(failure, rule.backoff_before(done))
                self._retries[failure.cause] = done + 1
                return True
            raise EpisodeError(
                kind,
                f"{failure.message} (still after {done} retr{'y' if done == 1 else 'ies'} in "
                "a fresh sandbox)",
            )
        raise EpisodeError(kind, failure.message)

    def _start_over(self, failure: AgentFailure, pause_s: float) -> None:
        """Remove the sandbox, wait `pause_s`, and seed a fresh one (a new deadline)."""
        log.warning(
            "%s: the agent failed (%s: %s); running the episode again in a fresh sandbox in %g s",
            self.id,
            failure.cause,
            failure.message,
            pause_s,
        )
        sandbox, self._sandbox = self._sandbox, None
        self._close_session(sandbox)
        if sandbox is not None:
            _stop_within(sandbox, self.settings.cleanup_timeout_seconds)
        time.sleep(pause_s)
        self._attempt += 1
        self._masked = None
        self._entrypoint = None
        self._entrypoint_noted = False
        self._survey = None
        self._users = {}
        self._ids = {}
        self._workdir_owner = None
        if self._setup_failure is not None:  # the install is tried again too
            self._image = None
        self.seed()

    @property
    def stopped_after(self) -> str | None:
        """The step after which the episode stopped early (its later turns do not run)."""
        return self._stopped_after

    @property
    def stop_reason(self) -> str | None:
        return self._stop_reason

    def _as_user(self, sandbox: Sandbox, turn: Turn) -> Turn:
        """The turn's agent user (a uid resolved to its name) owns the working directory
        (handed over by number, as the seed read it)."""
        user = self._users.get(turn.agent_user or "", turn.agent_user)
        if user is not None and user != self._workdir_owner:
            workdir = self.workdir or self._image_workdir(self._image or "")
            owner = self._ids.get(turn.agent_user or "", user)
            first = "1" if not self._turns else "0"
            owned = sandbox.exec(trusted(HAND_WORKDIR, owner, workdir, first), user=ROOT_USER)
            check(owned, f"handing {workdir} to {user}")
            self._workdir_owner = user
        return turn if user == turn.agent_user else dataclasses.replace(turn, agent_user=user)

    def _record(
        self,
        turn: Turn,
        agent: AgentRun,
        verification: VerifierRun,
        agent_s: float,
        verify_s: float,
        notes: list[str] | None = None,
        setup_s: float | None = None,
    ) -> TurnOutput:
        result = _turn_result(
            turn,
            agent,
            verification,
            agent_s,
            verify_s,
            setup_s,
            notes or [],
            oracle=self.harness.validates,
        )
        result = result.model_copy(
            update={
                "verifier_mode": self.verifier_mode,
                "verifier_logs_dir": str(self._verifier_dir(turn)),
                "verifier_files_cut": verification.cut,
            }
        )
        self._turns.append(result)
        if self.task.config.is_multi_step:
            reason = stop_reason(result, turn.min_reward)
            if reason is not None and turn is not self.task.turns[-1]:
                self._stopped_after, self._stop_reason = turn.name, reason
        self._clock_end["turn"] = time.monotonic()
        self._wall[1] = _now()
        return TurnOutput(result, self._verifier_dir(turn))

    def _prompted(self, turn: Turn) -> Turn:
        """The instruction inside `compose_overlay.prompt_template`, when there is one."""
        overlay = self.settings.compose_overlay
        if overlay is None or overlay.prompt_template is None:
            return turn
        text = overlay.prompt_template.replace("{instruction}", turn.instruction)
        return dataclasses.replace(turn, instruction=text)

    def _bounded(self, turn: Turn) -> Turn:
        """The turn with its agent budget cut to what the episode deadline leaves, keeping
        the verifier's share."""
        room = self._remaining() - turn.verifier_timeout_sec - self.settings.verifier_grace_s
        budget = turn.agent_timeout_sec
        if budget is not None and budget <= room:
            return turn
        if room <= 0:
            raise self._timed_out("the agent")
        return dataclasses.replace(turn, agent_timeout_sec=room)

    def _run_collect_hooks(self, sandbox: Sandbox) -> list[str]:
        """`[[verifier.collect]]` on main: a failing hook is noted, not fatal."""
        notes = []
        for hook in self.task.config.verifier.collect:
            if hook.service == "main":
                done = sandbox.exec(
                    ["bash", "-c", hook.command],
                    user=_user(hook.user),
                    workdir=self.workdir,
                    timeout=min(hook.timeout_sec, self._remaining()),
                )
            else:
                # Another service of a Compose task: its own shell, user and folder.
                done = _service(sandbox, hook.service).exec(
                    ["sh", "-c", hook.command],
                    user=_user(hook.user),
                    timeout=min(hook.timeout_sec, self._remaining()),
                )
            if done.timed_out or done.exit_code != 0:
                why = "timed out" if done.timed_out else f"exited {done.exit_code}"
                notes.append(f"collect hook `{hook.command}` {why}")
        return notes

    def _verify(self, sandbox: Sandbox, turn: Turn, transcript: bytes) -> VerifierRun:
        if self.separate_verifier:
            return self._verify_separately(sandbox, turn, transcript)
        assert self._survey is not None
        if self.settings.verify_from_snapshot:
            return self._verify_from_snapshot(sandbox, turn, transcript, self._survey)
        return run_verifier(
            sandbox,
            turn,
            workdir=self.workdir,
            grace_s=self.settings.verifier_grace_s,
            budget_s=self._verifier_budget(turn),
            trajectory=transcript,
            seed=self._survey,
            into=self._verifier_dir(turn),
            redactor=self.redactor,
            verifier_user=self._ids.get(turn.verifier_user or ""),
            agent_uid=self._agent_uid(turn),
        )

    def _verifier_dir(self, turn: Turn) -> Path:
        """Where a turn's verifier files go: the episode's folder, or its step's below."""
        root = self._verifier_root
        if root is None:
            if self._own_verifier_root is None:
                self._own_verifier_root = Path(tempfile.mkdtemp(prefix="harbor-verifier-"))
            root = self._own_verifier_root
        return root / turn.name if self.task.config.is_multi_step else root

    def _agent_uid(self, turn: Turn) -> str | None:
        """The uid whose every process ends before the turn's shared verification: the
        turn's agent user's (else the image's), unless that is root, whose processes cannot
        be told from the image's own services (see `verify_from_snapshot`). A user the
        image did not have at the seed is looked up by name."""
        user = turn.agent_user or self.provider.image_config(self._image or "").user
        if (user or "").split(":")[0] in ("", "root", "0"):
            return None
        assert user is not None
        uid = self._ids.get(user, user).split(":")[0]
        return None if uid == "0" else uid

    def _verify_from_snapshot(
        self, agent_sandbox: Sandbox, turn: Turn, transcript: bytes, seed: SandboxSurvey
    ) -> VerifierRun:
        """A fresh sandbox from a snapshot of the agent's file system: not one process of
        the agent's lives on in it. The image's ENTRYPOINT is not started again. The
        snapshot and its start depend on what the agent left (a folder the sandbox needs
        replaced by a file, say): their failures are blamed on the agent's sandbox."""
        image = agent_sandbox.snapshot(self.image_labels)
        try:
            try:
                verifier = self._start(
                    image, self.task.config.environment, record=False, network=turn.verifier_network
                )
            except SandboxStartError as error:
                raise SandboxError(f"the snapshot's sandbox did not start: {error}") from None
            try:
                return self._verify_in(
                    verifier,
                    "the snapshot's sandbox",
                    lambda: run_verifier(
                        verifier,
                        turn,
                        workdir=self.workdir,
                        grace_s=self.settings.verifier_grace_s,
                        budget_s=self._verifier_budget(turn),
                        trajectory=transcript,
                        seed=seed,
                        into=self._verifier_dir(turn),
                        redactor=self.redactor,
                        verifier_user=self._ids.get(turn.verifier_user or ""),
                    ),
                )
            finally:
                _stop_within(verifier, self.settings.cleanup_timeout_seconds)
        finally:
            try:
                self.provider.remove_image(image)
            except SandboxError as error:
                log.warning("%s: the snapshot image was not removed: %s", self.id, error)

    def _verify_in(
        self, verifier: Sandbox, what: str, verify: Callable[[], VerifierRun]
    ) -> VerifierRun:
        """`verify()` in a verifier's own sandbox: its failures are blamed on that sandbox
        (what is in it besides its image came from the agent)."""
        try:
            return verify()
        except SandboxError as error:
            return VerifierRun(self._fault(verifier, error, f"verifying in {what}"))

    def _verifier_budget(self, turn: Turn) -> float:
        return min(turn.verifier_timeout_sec, self._remaining() - self.settings.verifier_grace_s)

    def _verify_separately(
        self, agent_sandbox: Sandbox, turn: Turn, transcript: bytes
    ) -> VerifierRun:
        """A fresh sandbox from the verifier's image, holding the agent's artifacts."""
        assert self._verifier_image is not None
        environment = self.task.config.verifier.environment or self.task.config.environment
        # The verifier's own network_mode, else its environment's.
        network = (
            turn.verifier_network
            if self.task.config.verifier.network_mode is not None
            else environment.network_mode != "no-network"
        )
        try:
            verifier = self._start(self._verifier_image, environment, record=False, network=network)
        except SandboxStartError as error:
            # Its image and nothing of the agent's: the engine's (or the task's) failure.
            lost = f"the separate verifier did not start: {error}"
            return VerifierRun(RewardReading.failed(FailureKind.SANDBOX_LOST, lost, masked=True))
        try:
            try:
                fresh = survey(verifier)
                entrypoint = start_entrypoint(
                    verifier, self.provider.image_config(self._verifier_image), environment.workdir
                )
            except SandboxError as error:
                lost = f"the separate verifier did not start: {error}"
                return VerifierRun(
                    RewardReading.failed(FailureKind.SANDBOX_LOST, lost, masked=True)
                )
            # Before the agent's artifacts are there, a failed ENTRYPOINT is the image's.
            failure = entrypoint_failure(entrypoint)
            if failure is not None:
                return VerifierRun(
                    RewardReading.failed(FailureKind.ENTRYPOINT_FAILED, failure, masked=True)
                )
            try:
                self._copy_artifacts(agent_sandbox, verifier)
            except SandboxError as error:
                return VerifierRun(
                    self._fault(agent_sandbox, error, "copying the agent's artifacts")
                )
            return self._verify_in(
                verifier,
                "the separate verifier",
                lambda: self._run_separate_verifier(verifier, turn, transcript, fresh),
            )
        finally:
            _stop_within(verifier, self.settings.cleanup_timeout_seconds)

    def _run_separate_verifier(
        self, verifier: Sandbox, turn: Turn, transcript: bytes, fresh: SandboxSurvey
    ) -> VerifierRun:
        assert self._verifier_image is not None
        environment = self.task.config.verifier.environment or self.task.config.environment
        # A verifier image of its own ([verifier.environment] or tests/Dockerfile) may
        # ship its tests; the agent's image never counts as shipping them.
        own_image = self.task.verifier_dockerfile is not None or bool(
            self.task.config.verifier.environment
            and self.task.config.verifier.environment.docker_image
        )
        ships_tests = (
            own_image and verifier.exec(trusted('[ -f "$1" ]', "/tests/test.sh")).exit_code == 0
        )
        return run_verifier(
            verifier,
            turn,
            workdir=environment.workdir,
            grace_s=self.settings.verifier_grace_s,
            budget_s=self._verifier_budget(turn),
            trajectory=transcript,
            seed=fresh,
            into=self._verifier_dir(turn),
            redactor=self.redactor,
            upload_tests=not ships_tests,
        )

    def _copy_artifacts(self, source: Sandbox, target: Sandbox) -> None:
        """`/logs/artifacts` and each declared artifact, at the same path in `target`,
        streamed from one engine call to the other (never held whole: the agent decides
        how large they are). A stream that breaks (a file changing as it is read) fails
        the copy: SandboxError."""
        declared = [
            (artifact.source, artifact.exclude, artifact.service)
            for artifact in self.task.config.artifacts
        ]
        for path, exclude, service in [(ARTIFACTS_DIR, [], None), *declared]:
            absolute = path if path.startswith("/") else f"{self.workdir or '/'}/{path}"
            origin = source if service in (None, "main") else _service(source, service)
            chunks = origin.iter_archive(absolute)
            if chunks is None:
                continue
            parent = absolute.rstrip("/").rsplit("/", 1)[0] or "/"
            target.exec(trusted('$B mkdir -p "$1"', parent), user=ROOT_USER)
            try:
                target.write_archive(filter_archive(chunks, exclude), parent)
            except (tarfile.TarError, OSError, ValueError) as error:
                raise SandboxError(f"copying {absolute} broke off: {error}") from None

    # ------------------------------------------------------------------------ results

    def finish(self) -> EpisodeResult:
        """Clean up, then return the episode's result."""
        self.cleanup()
        return self.result()

    def result(self) -> EpisodeResult:
        """The result of the turns that ran: a single-step task's one turn, or a multi-step
        task's turns rolled up by its `multi_step_reward_strategy`.

        `cleanup_s` is set only once cleanup() has run; `total_s` runs from the start of
        the seed to the end of cleanup, or of the last turn when cleanup is still to come.
        """
        if not self._turns:
            raise RuntimeError(f"episode {self.id} ran no turn")
        last = self._turns[-1]
        total = None
        if self._clock_start is not None:
            total = self._clock_end.get("cleanup", self._clock_end["turn"]) - self._clock_start
        strategy = self.task.config.multi_step_reward_strategy or "mean"
        rolled = roll_up(self._turns, strategy, self._stopped_after, self._stop_reason)
        exit_codes = [turn.agent_exit_code for turn in self._turns]
        usages = [*self._spent, *(turn.usage for turn in self._turns if turn.usage is not None)]
        causes = [turn.failure_cause for turn in self._turns if turn.failure_cause]
        return EpisodeResult(
            task_id=self.task.id,
            taskset=self.taskset,
            repeat=self.repeat,
            agent=self.harness.name,
            model=self.model.name if self.model else None,
            digest=self.task.digest,
            reward=rolled.reward,
            verifier_rewards=rolled.verifier_rewards,
            mask_sample=rolled.mask_sample,
            failure_kind=rolled.failure_kind,
            failure_reason=rolled.failure_reason,
            failure_cause=causes[-1] if causes else None,
            verifier_mode=rolled.verifier_mode,
            solution_exit_code=(
                next((code for code in exit_codes if code != 0), 0)
                if self.harness.validates
                else None
            ),
            response=last.response,
            usage=sum(usages[1:], usages[0]) if usages else None,
            attempts=self._attempt,
            stopped_after_turn=self._stopped_after,
            started_at=self._wall[0],
            finished_at=self._wall[1],
            timings=PhaseTimings(
                build_s=self._timings.get("build_s"),
                agent_install_s=self._timings.get("agent_install_s"),
                start_s=self._timings.get("start_s"),
                seed_s=self._timings.get("seed_s"),
                agent_s=sum(turn.timings.agent_s or 0.0 for turn in self._turns),
                verify_s=sum(turn.timings.verify_s or 0.0 for turn in self._turns),
                cleanup_s=self._timings.get("cleanup_s"),
                total_s=total,
            ),
            turns=list(self._turns),
        )

    def cleanup(self) -> None:
        """Close the harness session and remove the sandbox at once, whatever happened
        before; idempotent. A removal that takes longer than `cleanup_timeout_seconds` is
        left to the end-of-run sweep."""
        early, self._early = self._early, None
        if early is not None:
            early.join()
            if self._sandbox is None:
                self._sandbox = early.sandbox
        if self._agent.has_session:
            self._close_session(self._sandbox)
        self._agent.discard_logs()
        if self._own_verifier_root is not None:
            shutil.rmtree(self._own_verifier_root, ignore_errors=True)
            self._own_verifier_root = None
        try:
            if self._sandbox is None:
                return
            started = time.monotonic()
            sandbox, self._sandbox = self._sandbox, None
            _stop_within(sandbox, self.settings.cleanup_timeout_seconds)
            self._clock_end["cleanup"] = time.monotonic()
            self._timings["cleanup_s"] = self._clock_end["cleanup"] - started
        finally:
            placement, self._placement = self._placement, None
            if placement is not None:
                placement.release()

    # ------------------------------------------------------------------------ time

    def _remaining(self) -> float:
        if self._deadline is None:
            return math.inf
        return self._deadline - time.monotonic()

    def _require_time(self, phase: str) -> None:
        if self._remaining() <= 0:
            raise self._timed_out(phase)

    def _timed_out(self, phase: str) -> EpisodeError:
        return EpisodeError(
            FailureKind.EPISODE_TIMEOUT,
            f"the episode ran past its deadline of {self.budget.deadline_s:g} s during {phase}",
        )

    def _require_sandbox(self) -> Sandbox:
        if self._sandbox is None:
            raise SandboxError(f"episode {self.id} has no sandbox: seed() it first")
        return self._sandbox


class _EarlyStart:
    """prepare() and the sandbox's start, run in a thread of their own."""

    def __init__(self, episode: Episode) -> None:
        self.sandbox: Sandbox | None = None
        self.prepare_error: EpisodeError | None = None
        self.start_error: EpisodeError | None = None
        self._episode = episode
        self._thread = threading.Thread(target=self._run, name="harbor-early", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        episode = self._episode
        try:
            episode._prepare_now()
        except EpisodeError as error:
            self.prepare_error = error
            return
        assert episode._image is not None
        try:
            self.sandbox = episode._start_agent_sandbox()
            if episode._nothing_starts_at_seed:
                episode._survey = survey(self.sandbox, episode._named_users())
        except EpisodeError as error:
            self.start_error = error
        except SandboxError as error:
            self.start_error = EpisodeError(FailureKind.SANDBOX_START_FAILED, str(error))

    def join(self) -> None:
        join(self._thread)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def verifies_separately(task: Task, settings: HarborSettings) -> bool:
    if task.config.is_multi_step:
        return False  # the loader refuses separate verification for multi-step tasks
    return (
        task.config.verifier.mode == "separate"
        or task.verifier_dockerfile is not None
        or (settings.separate_verifier_for_artifacts and bool(task.config.artifacts))
    )


def _service(sandbox: Sandbox, name: str) -> Sandbox:
    """Another service of the Compose project `sandbox` is the main service of."""
    find = getattr(sandbox, "service", None)
    if find is None:
        raise SandboxError(f"no service {name!r}: the task is not a Compose task")
    found: Sandbox = find(name)
    return found


def _stop_within(sandbox: Sandbox, seconds: float) -> None:
    def stop() -> None:
        try:
            sandbox.stop()
        except SandboxError as error:
            # Its engine went away, say: the end-of-run sweep tries again.
            log.warning("sandbox %s was not removed: %s", sandbox.id[:12], error)

    stopper = threading.Thread(target=stop, name="harbor-stop", daemon=True)
    stopper.start()
    join(stopper, seconds)
    if stopper.is_alive():
        log.warning(
            "sandbox %s was not removed within cleanup_timeout_seconds = %g s; the run "
            "removes it when it ends",
            sandbox.id[:12],
            seconds,
        )


def _user(value: str | int | None) -> str | None:
    return None if value is None else str(value)


def _turn_result(
    turn: Turn,
    agent: AgentRun,
    verification: VerifierRun,
    agent_s: float,
    verify_s: float,
    setup_s: float | None,
    notes: list[str],
    *,
    oracle: bool,
) -> TurnResult:
    reading = verification.reading
    kind, reason = reading.failure_kind, reading.failure_reason
    failure = agent.failure
    notes = list(notes)
    if kind is None and failure is not None:
        kind, reason = FailureKind.for_agent_cause(failure.cause), failure.message
    elif failure is not None:
        # The verifier's finding is the turn's kind; the agent's failure stays on record.
        notes.append(f"the agent failed ({failure.cause}): {failure.message}")
    elif kind is None and oracle and agent.exit_code != 0:
        kind = FailureKind.SOLUTION_FAILED
        reason = f"solve.sh exited with code {agent.exit_code}"
    return TurnResult(
        step=turn.name,
        reward=reading.reward,
        verifier_rewards=reading.rewards,
        mask_sample=reading.masked,
        failure_kind=kind,
        failure_reason=reason,
        failure_cause=failure.cause if failure is not None else None,
        reward_file=reading.source,
        agent_exit_code=agent.exit_code,
        agent_timed_out=agent.timed_out,
        verifier_exit_code=verification.exit_code,
        verifier_timed_out=verification.timed_out,
        agent_log_tail=agent.log_tail,
        response=agent.response,
        usage=agent.usage,
        notes=notes,
        timings=TurnTimings(setup_s=setup_s, agent_s=agent_s, verify_s=verify_s),
    )
