"""One episode: seed a sandbox, run each turn (agent, then verifier), clean up.

Usable from plain Python; the pytest layer only decides when each phase runs. The episode
coordinates; its parts live beside it, each handed the episode's context once
(engine/context.py): the clock (engine/clock.py), images and sandboxes
(engine/launcher.py), users (engine/users.py), the agent's side (engine/agent_phase.py),
the verifier modes (engine/verifiers/) and the result (engine/records.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from pytest_harbor.display import harbor_logger
from pytest_harbor.engine.admission import (
    check_digest,
    refuse_at_seed,
    refuse_secrets_beside_root,
)
from pytest_harbor.engine.afresh import FreshStarts
from pytest_harbor.engine.agent_phase import AgentPhase
from pytest_harbor.engine.ahead import EarlyStart
from pytest_harbor.engine.artifacts import collect_artifacts
from pytest_harbor.engine.attempt import Attempt
from pytest_harbor.engine.budget import EpisodeBudget, setup_seconds
from pytest_harbor.engine.clock import EpisodeClock
from pytest_harbor.engine.context import EpisodeContext
from pytest_harbor.engine.failures import EpisodeError, FailureKind, start_failure
from pytest_harbor.engine.folders import EpisodeFolders
from pytest_harbor.engine.harness_calls import HARNESS_GRACE_S, InProcessGate
from pytest_harbor.engine.launcher import SandboxLauncher
from pytest_harbor.engine.model_access import ModelAccess
from pytest_harbor.engine.processes import (
    end_processes_since,
    end_user_processes,
    survey,
)
from pytest_harbor.engine.progress import EpisodeProgress
from pytest_harbor.engine.readiness import start_entrypoint, wait_healthy
from pytest_harbor.engine.records import TurnOutput, episode_result, turn_result
from pytest_harbor.engine.results import EpisodeResult, TurnResult, TurnTimings, episode_id
from pytest_harbor.engine.retries import AgentRetries
from pytest_harbor.engine.rewards import RewardReading
from pytest_harbor.engine.rollup import stop_reason
from pytest_harbor.engine.steps import prepare_step
from pytest_harbor.engine.trajectory import transcript
from pytest_harbor.engine.users import SandboxUsers
from pytest_harbor.engine.verification import VerifierRun, clear_for_next_turn, run_collect_hooks
from pytest_harbor.engine.verifiers import (
    SharedVerifier,
    SnapshotVerifier,
    Verification,
    verifier_mode,
    verifies_separately,
)
from pytest_harbor.harnesses.base import AgentFailure, AgentRun, Harness, ModelGate, Usage
from pytest_harbor.harnesses.mcp.access import mcp_access
from pytest_harbor.harnesses.model import ModelConfig
from pytest_harbor.redaction import Redactor, run_redactor
from pytest_harbor.relay import RelayClient
from pytest_harbor.sandboxes.base import Sandbox, SandboxError, SandboxProvider, set_phase_network
from pytest_harbor.sandboxes.compose.tasks import prompted, with_overlay
from pytest_harbor.settings import HarborSettings
from pytest_harbor.tasks import Task, Turn

__all__ = ["Episode", "TurnOutput"]

log = harbor_logger()

#: The timings of a turn that never reached its agent.
_UNTIMED = TurnTimings(agent_s=0.0, verify_s=0.0)


class Episode:
    """Seed, turns, cleanup for one task and repeat.

    Call `prepare()` (images; not on the episode clock), `seed()`, `run_turn()` for each
    turn, then `result()`; `cleanup()` is idempotent and safe from any state. Failures
    that leave the episode without a result raise EpisodeError.

    `model` is what a model-driven harness talks to; `model_gate` caps its requests in
    flight (one process's own cap when not given); the harness's files go to
    `agent_logs_dir`, each verification's to `verifier_logs_dir`, each turn's artifacts to
    `artifacts_dir` (a folder per step below each for a multi-step task); each, when not
    given, a temporary folder removed at cleanup. Values of `redactor` (the run's when not
    given), and MCP header credentials, never reach those files or a failure message.
    With `relay` (the run's model relay), the harness reaches `model` through it alone,
    with a token of the episode's (engine/model_access.py). `progress` is told each phase
    the episode enters (engine/progress.py).
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
        artifacts_dir: Path | None = None,
        redactor: Redactor | None = None,
        name: str | None = None,
        relay: RelayClient | None = None,
        progress: EpisodeProgress | None = None,
    ) -> None:
        settings = settings or HarborSettings()
        task = with_overlay(task, settings)
        mcp = mcp_access(task, settings, os.environ)
        self.context = context = EpisodeContext(
            id=name or episode_id(task.id, repeat),
            task=task,
            taskset=taskset,
            repeat=repeat,
            harness=harness,
            settings=settings,
            model=model,
            mcp=mcp,
            redactor=(redactor or run_redactor(settings, model)).adding(mcp.secrets),
            clock=EpisodeClock(settings.verifier_grace_s),
            labels=dict(labels),
            image_labels=dict(labels if image_labels is None else image_labels),
            separate_verifier=verifies_separately(task, settings),
            expected_digest=expected_digest,
        )
        self._model = ModelAccess(
            model, relay, harness, cassette=f"{taskset}/{context.id}", episode=context.id
        )
        self.launcher = SandboxLauncher(
            context, provider, routes_model=self._model.routes_into_sandbox
        )
        self._verifier = verifier_mode(context, self.launcher)
        gate = model_gate or InProcessGate(model.max_concurrent_requests if model else 1)
        image = self.launcher.image_config  # asked once the image is made
        self._agent = AgentPhase(
            context, self._model, model_gate=gate, logs_dir=agent_logs_dir, image=image
        )
        self._attempt = Attempt(1, SandboxUsers(task))
        self._fresh = FreshStarts(
            context.id, self.launcher, context.redactor, settings.engine_recovery_timeout_s
        )
        self._early = EarlyStart(self.launcher)
        self._turns: list[TurnResult] = []
        self.progress = progress or EpisodeProgress()
        self._stopped_after: str | None = None
        self._stop_reason: str | None = None
        self._retries = AgentRetries(settings.agent_outcome_policy, context.id)
        #: Model usage of attempts given up for a retry.
        self._spent: list[Usage] = []
        self._folders = EpisodeFolders(
            verifier_logs_dir, artifacts_dir, per_step=task.config.is_multi_step
        )

    @property
    def id(self) -> str:
        """`<task>__r<repeat>`, or the name the episode was given."""
        return self.context.id

    @property
    def task(self) -> Task:
        return self.context.task

    @property
    def provider(self) -> SandboxProvider:
        """The provider of the episode's sandboxes: the run's, or the engine it was placed on."""
        return self.launcher.provider

    @property
    def verifier_mode(self) -> str:
        return self._verifier.name

    @property
    def budget(self) -> EpisodeBudget:
        """The time budget (raises EpisodeError when the settings refuse the task)."""
        return self.context.budget

    @property
    def stopped_after(self) -> str | None:
        """The step after which the episode stopped early (its later turns do not run)."""
        return self._stopped_after

    @property
    def stop_reason(self) -> str | None:
        return self._stop_reason

    # ------------------------------------------------------------------------ seed

    def prepare(self) -> None:
        """Make the images (build once per content hash, or fetch the prebuilt one)."""
        if not self._early.prepared():
            self.launcher.prepare()

    def prepare_images(self) -> None:
        """Make every image the episode needs, as prepare() does, but on no engine's place
        (a run that builds them ahead); raises EpisodeError when one cannot be made."""
        self.launcher.prepare(place=False)

    def start_early(self) -> None:
        """Make the images and start the sandbox in the background, so that a later seed()
        finds it running (while another episode still works, say). The seed still checks
        the folder, opens the deadline and does everything else."""
        if self._attempt.sandbox is None:
            self._early.begin()

    def seed(self) -> None:
        """Check the folder is unchanged, start the sandbox, copy loose environment files,
        start the image's ENTRYPOINT and wait for the healthcheck. A sandbox the engine
        loses meanwhile is started afresh (engine/afresh.py)."""
        while True:
            try:
                self._seed()
                return
            except SandboxError as error:
                self._afresh_or_raise(error, start_failure(error))

    def _afresh_or_raise(self, error: SandboxError, failure: EpisodeError) -> None:
        """Before any agent: drop a sandbox the engine lost (afresh.py), else raise."""
        self._fresh.take(self._attempt.sandbox, error, failure)
        self._attempt = Attempt(self._attempt.number, SandboxUsers(self.task))

    def _seed(self) -> None:
        budget = self.budget
        if budget.warning:
            log.warning(budget.warning)
        context = self.context
        refuse_at_seed(
            context.task,
            context.settings,
            context.harness,
            self.launcher.provider,
            separate_verifier=context.separate_verifier,
            relayed=self._model.relayed,
        )
        self._model.begin_attempt()
        if self.launcher.image is None:
            self.prepare()
        self.progress.enter("seeding")
        image = self.launcher.image
        assert image is not None
        started = self.context.clock.start(budget.deadline_s)
        check_digest(self.task, self.context.expected_digest)
        attempt = self._attempt
        early = self._early.take()
        sandbox, attempt.survey = early or (self.launcher.start_agent_sandbox(), None)
        attempt.sandbox = sandbox
        if self.task.loose_environment_files:
            sandbox.upload(self.task.environment_dir, self._workdir_now())
        attempt.entrypoint = start_entrypoint(
            sandbox, self.launcher.image_config(), self.context.workdir
        )
        healthcheck = self.task.config.environment.healthcheck
        if healthcheck is not None:
            agent_user = self.task.config.agent.user
            wait_healthy(
                sandbox,
                healthcheck,
                workdir=self.context.workdir,
                user=None if agent_user is None else str(agent_user),
                remaining=self.context.clock.remaining,
            )
        self._attempt.masked(bool(self._turns))
        if attempt.survey is None:
            attempt.survey = self.launcher.survey(sandbox)
        attempt.users.learn(attempt.survey.ids, self._image_user())
        shares = self._verifier.name in (SharedVerifier.name, SnapshotVerifier.name)
        if shares and not self.context.harness.trusted:
            refuse_secrets_beside_root(
                self.task,
                lambda turn: attempt.users.agent_id(turn, self._image_user),
                self._verifier.name,
            )
        self.context.clock.took("seed_s", started)

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
        if self.stopped_after is not None:
            raise RuntimeError(f"episode {self.id} stopped after turn {self.stopped_after}")
        while True:
            output = self._try_turn(turn)
            if output is not None:
                return output

    def _try_turn(self, turn: Turn) -> TurnOutput | None:
        """One go at `turn`; None when the agent failed and a fresh attempt was seeded."""
        sandbox = self._require_sandbox()
        masked = self._attempt.masked(bool(self._turns))
        if masked is not None:
            return self._record(turn, AgentRun(), VerifierRun(masked), _UNTIMED)
        try:
            if self._turns:
                clear_for_next_turn(sandbox)
            turn = self._attempt.users.as_agent(
                sandbox, turn, self._workdir_now, first=not self._turns
            )
            turn = prompted(turn, self.context.settings)
            hosts = self._agent.allowed_hosts(turn.agent_hosts)
            relay = self._model.open_turn(sandbox, filtered=self.launcher.filtered)
            set_phase_network(sandbox, turn.agent_network, hosts, relay=relay)
            before = self._processes_now(sandbox)
        except SandboxError as error:
            if not self._turns:
                # No agent has had it yet: a sandbox the engine lost is started afresh.
                self._afresh_or_raise(error, EpisodeError(FailureKind.SANDBOX_LOST, str(error)))
                self.seed()
                return None
            reading = self._fault(sandbox, error, f"preparing the sandbox for turn {turn.name}")
            return self._record(turn, AgentRun(), VerifierRun(reading), _UNTIMED)
        self.progress.enter("agent", turn.name)
        if self._attempt.users.agent_id(turn, self._image_user) is None:
            self._attempt.root_had_sandbox = True
        self._agent.root_had_sandbox = self._attempt.root_had_sandbox
        started = time.monotonic()
        unprepared = self._prepare_step(sandbox, turn)
        if unprepared is not None:
            timings = TurnTimings(setup_s=time.monotonic() - started, agent_s=0.0, verify_s=0.0)
            return self._record(turn, AgentRun(), VerifierRun(unprepared), timings)
        agent = self._open_session(sandbox, turn)
        setup_s = time.monotonic() - started
        started = time.monotonic()
        if agent is None:
            agent = self._work(sandbox, turn)
        agent = self._model.settle(agent)
        agent_s = time.monotonic() - started
        unended: RewardReading | None = None
        if agent.timed_out:
            try:
                # Every process the turn started goes (the agent's CLI, and whatever it
                # left running or detached), before anything else.
                end_processes_since(sandbox, before)
            except SandboxError as error:
                unended = self._fault(sandbox, error, "ending the processes of a turn out of time")
        self.context.clock.require("the agent")
        if agent.failure is not None and self._handle_agent_failure(agent):
            return None
        if not self._continuing or turn.name == self.task.turns[-1].name:
            self._close_session(sandbox)
        started = time.monotonic()
        notes = self._attempt.entrypoint_note()
        if unended is not None:
            verification = VerifierRun(unended)
        else:
            verification = self._after_agent(sandbox, turn, agent, notes)
        if self.context.clock.remaining() <= 0:
            # The verifier had its share of the episode's time; running past the deadline
            # in the steps around it does not undo what it found.
            notes.append("the verification ended past the episode's deadline")
        timings = TurnTimings(setup_s=setup_s, agent_s=agent_s, verify_s=time.monotonic() - started)
        if not verification.reading.masked:
            into, workdir = self._folders.artifacts_dir(turn), self._workdir_now()
            notes.extend(
                collect_artifacts(sandbox, turn.artifacts, workdir, into, self.context.redactor)
            )
        output = self._record(turn, agent, verification, timings, notes)
        if self._stopped_after is not None:
            self._close_session(sandbox)
        return output

    def _prepare_step(self, sandbox: Sandbox, turn: Turn) -> RewardReading | None:
        """A step's files, set-up and healthcheck (engine/steps.py): None when it has none
        or they went well, else the reading the turn scores."""
        survey_, context = self._attempt.survey, self.context
        try:
            return prepare_step(
                sandbox,
                turn,
                workdir=self._workdir_now(),
                user=self._attempt.users.agent_id(turn, self._image_user),
                bash=survey_.bash if survey_ is not None else None,
                setup_s=setup_seconds(turn, context.settings)
                or context.clock.before_verifier(turn),
                remaining=lambda: context.clock.before_verifier(turn),
                redactor=context.redactor,
            )
        except SandboxError as error:
            if not self._turns:
                raise EpisodeError(FailureKind.SANDBOX_LOST, str(error)) from None
            return self._fault(sandbox, error, f"preparing step {turn.name}")

    def _open_session(self, sandbox: Sandbox, turn: Turn) -> AgentRun | None:
        """Open the harness session when the turn needs one (within the allowance, and
        what the episode leaves once the verifier has its share); an AgentRun when it
        failed, or when the harness could not make its image."""
        failure = self.launcher.setup_failure
        if failure is not None:
            return AgentRun(failure=failure)
        context = self.context
        room = min(context.settings.harness_setup_allowance_s, context.clock.before_verifier(turn))
        return self._agent.open_session(sandbox, turn, workdir=context.workdir, seconds=room)

    def _work(self, sandbox: Sandbox, turn: Turn) -> AgentRun:
        """The agent's turn, in what the deadline leaves once the verifier has its share."""
        budget, grace_s = self.context.clock.agent_window(turn, HARNESS_GRACE_S)
        return self._agent.run_turn(
            sandbox,
            turn if budget == turn.agent_timeout_sec else replace(turn, agent_timeout_sec=budget),
            index=self._index(turn),
            workdir=self.context.workdir,
            seconds=budget,
            grace_s=grace_s,
        )

    def _after_agent(
        self, sandbox: Sandbox, turn: Turn, agent: AgentRun, notes: list[str]
    ) -> VerifierRun:
        """A non-root agent's processes ended (before a network the verifier has and the
        agent had not, and before the collect hooks), the verifier's network, the collect
        hooks (their failures go to `notes`), then the verification."""
        self.progress.enter("verifying", turn.name)
        doing = "ending the agent's processes"
        users, survey_, context = self._attempt.users, self._attempt.survey, self.context
        assert survey_ is not None
        try:
            agent_id = users.agent_id(turn, self._image_user)
            phases = {
                (turn.agent_network, turn.agent_hosts),
                (turn.verifier_network, turn.verifier_hosts),
            }
            if agent_id is not None and (len(phases) > 1 or self.task.config.verifier.collect):
                end_user_processes(sandbox, agent_id)
            doing = f"giving the verification of {turn.name} its network"
            set_phase_network(sandbox, turn.verifier_network, turn.verifier_hosts)
            doing = "running the collect hooks"
            notes.extend(
                run_collect_hooks(sandbox, self.task, context.workdir, context.clock.within)
            )
            doing = f"verifying {turn.name}"
            verification = Verification(
                turn=turn,
                transcript=transcript(f"{self.id}/{turn.name}", context.harness.name, turn, agent),
                seed=survey_,
                into=self._folders.verifier_dir(turn),
                verifier_user=users.verifier_id(turn),
                agent_id=agent_id,
                more_turns=turn.name != self.task.turns[-1].name,
                response=None if context.harness.validates else agent.response,
                agent_into=self._agent.host_dir(turn),
            )
            return self._verifier.verify(sandbox, verification)
        except SandboxError as error:
            return VerifierRun(self._fault(sandbox, error, doing))

    def _workdir_now(self) -> str:
        """The working directory: the task's, else the image's."""
        return self.context.workdir or self.launcher.image_workdir()

    def _image_user(self) -> str:
        return self.launcher.image_config().user

    def _fault(self, sandbox: Sandbox, error: SandboxError, doing: str) -> RewardReading:
        return self.context.fault(sandbox, error, doing, root_had_it=self._attempt.root_had_sandbox)

    def _processes_now(self, sandbox: Sandbox) -> frozenset[str]:
        """The processes there as the turn begins: the seed's survey for the first turn of
        an attempt, a fresh look for a later one."""
        if not self._turns and self._attempt.survey is not None:
            return self._attempt.survey.processes
        return survey(sandbox).processes

    @property
    def _continuing(self) -> bool:
        """One harness session for every turn (`turn_sessions = continue`)."""
        return self.task.config.is_multi_step and self.context.settings.turn_sessions == "continue"

    def _index(self, turn: Turn) -> int:
        return next(i for i, each in enumerate(self.task.turns) if each.name == turn.name)

    def _close_session(self, sandbox: Sandbox | None) -> None:
        self._agent.close(
            sandbox,
            workdir=self.context.workdir,
            seconds=self.context.settings.cleanup_timeout_seconds,
        )

    def _handle_agent_failure(self, agent: AgentRun) -> bool:
        """Apply `agent_outcome_policy`: False to verify, True when a fresh attempt has
        been seeded; raises EpisodeError when the episode ends with no result."""
        assert agent.failure is not None
        pause_s = self._retries.pause_before_retry(agent.failure, len(self._turns))
        if pause_s is None:
            return False
        if agent.usage is not None:  # what the abandoned attempt cost still counts
            self._spent.append(agent.usage)
        self._start_over(agent.failure, pause_s)
        return True

    def _start_over(self, failure: AgentFailure, pause_s: float) -> None:
        """Remove the sandbox, wait `pause_s`, and seed a fresh one (a new deadline)."""
        log.warning(
            "%s: the agent failed (%s: %s); running the episode again in a fresh sandbox in %g s",
            self.id,
            failure.cause,
            failure.message,
            pause_s,
        )
        sandbox = self._attempt.sandbox
        self._close_session(sandbox)
        if sandbox is not None:
            self.launcher.stop(sandbox)
        time.sleep(pause_s)
        self._attempt = Attempt(self._attempt.number + 1, SandboxUsers(self.task))
        self.launcher.forget_failed_install()  # the install is tried again too
        self.seed()

    def _record(
        self,
        turn: Turn,
        agent: AgentRun,
        verification: VerifierRun,
        timings: TurnTimings,
        notes: list[str] | None = None,
    ) -> TurnOutput:
        oracle = self.context.harness.validates
        result = turn_result(turn, agent, verification, timings, notes or [], oracle=oracle)
        artifacts = self._folders.artifacts_dir(turn)
        result = result.model_copy(
            update={
                "verifier_mode": self.verifier_mode,
                "verifier_logs_dir": str(self._folders.verifier_dir(turn)),
                "verifier_files_cut": verification.cut,
                "artifacts_dir": str(artifacts) if artifacts.is_dir() else None,
            }
        )
        self._turns.append(result)
        if self.task.config.is_multi_step:
            reason = stop_reason(result, turn.min_reward)
            if reason is not None and turn is not self.task.turns[-1]:
                self._stopped_after, self._stop_reason = turn.name, reason
        self.context.clock.turn_ended()
        return TurnOutput(result, self._folders.verifier_dir(turn))

    # ------------------------------------------------------------------------ results

    def result(self) -> EpisodeResult:
        """The result of the turns that ran: a single-step task's one turn, or a multi-step
        task's turns rolled up by its `multi_step_reward_strategy`.

        `cleanup_s` is set only once cleanup() has run; `total_s` runs from the start of
        the seed to the end of cleanup, or of the last turn when cleanup is still to come."""
        if not self._turns:
            raise RuntimeError(f"episode {self.id} ran no turn")
        return episode_result(
            self.context,
            self._turns,
            attempts=self._attempt.number,
            spent=self._spent,
            stopped_after=self._stopped_after,
            stop_reason=self._stop_reason,
        )

    def cleanup(self) -> None:
        """Close the harness session and remove the sandbox at once, whatever happened
        before; idempotent. A removal that takes longer than `cleanup_timeout_seconds` is
        left to the end-of-run sweep."""
        attempt = self._attempt
        self._model.end()
        early = self._early.abandon()
        if attempt.sandbox is None:
            attempt.sandbox = early
        if self._agent.has_session:
            self._close_session(attempt.sandbox)
        self._agent.discard_logs()
        self._folders.discard()
        try:
            if attempt.sandbox is None:
                return
            started = time.monotonic()
            sandbox, attempt.sandbox = attempt.sandbox, None
            self.launcher.stop(sandbox)
            self.context.clock.cleaned(started)
        finally:
            self.launcher.release()

    def _require_sandbox(self) -> Sandbox:
        if self._attempt.sandbox is None:
            raise SandboxError(f"episode {self.id} has no sandbox: seed() it first")
        return self._attempt.sandbox
