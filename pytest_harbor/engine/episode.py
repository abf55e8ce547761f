"""One episode: seed a sandbox, run each turn (agent, then verifier), clean up.

Usable from plain Python; the pytest layer only decides when each phase runs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from pytest_harbor.engine.failures import FailureKind
from pytest_harbor.engine.results import (
    EpisodeResult,
    PhaseTimings,
    TurnResult,
    TurnTimings,
    episode_id,
)
from pytest_harbor.engine.rewards import RewardReading, read_reward
from pytest_harbor.harnesses.base import AgentRun, Harness
from pytest_harbor.sandboxes.archives import pack_folders, unpack_files
from pytest_harbor.sandboxes.base import (
    ImageSource,
    Sandbox,
    SandboxError,
    SandboxProvider,
    SandboxSpec,
)
from pytest_harbor.tasks.task import Task, Turn

__all__ = ["Episode", "EpisodeSettings", "TurnOutput"]

TESTS_DIR = "/tests"
VERIFIER_LOGS = "/logs/verifier"
REQUIRED_TOOLS = ("bash", "timeout", "tar")

#: Made before the sandbox starts; the log folders are writable by any agent or verifier user.
SANDBOX_DIRECTORIES = {
    "/logs": 0o755,
    "/logs/agent": 0o777,
    "/logs/verifier": 0o777,
    "/logs/artifacts": 0o777,
    TESTS_DIR: 0o755,
    "/solution": 0o755,
}

_MISSING = "pytest-harbor-missing:"
_BROKEN = "pytest-harbor-error:"

# As root: check the tools, empty /tests and /logs/verifier (dotfiles too), then unpack
# the tests from stdin. Marker lines on stderr tell the engine what went wrong.
_PREPARE_VERIFIER = f"""
missing=""
for tool in {" ".join(REQUIRED_TOOLS)}; do
  command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
done
if [ -n "$missing" ]; then echo "{_MISSING}$missing" >&2; exit 0; fi
for dir in {TESTS_DIR} {VERIFIER_LOGS}; do
  rm -rf "$dir"/* "$dir"/.[!.]* "$dir"/..?* || {{ echo "{_BROKEN} cannot empty $dir" >&2; exit 1; }}
done
mkdir -p {TESTS_DIR} {VERIFIER_LOGS} && chmod 777 {VERIFIER_LOGS} \
  && tar -x -f - -C {TESTS_DIR} || {{ echo "{_BROKEN} cannot unpack the tests" >&2; exit 1; }}
"""

# Runs test.sh under `timeout`, then writes /logs/verifier as a tar to stdout.
_RUN_VERIFIER = (
    "timeout -k {grace} {budget} bash {tests}/test.sh > {logs}/test-stdout.txt 2>&1; "
    "code=$?; tar -c -f - -C {logs} .; exit $code"
)


@dataclass(frozen=True)
class EpisodeSettings:
    """Run-wide knobs of the engine."""

    #: Extra seconds a timed-out verifier gets between SIGTERM and SIGKILL.
    verifier_grace_s: float = 30.0


@dataclass(frozen=True)
class _Verification:
    reading: RewardReading
    exit_code: int | None = None
    timed_out: bool = False
    files: dict[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class TurnOutput:
    """A turn's result and the files the verifier left in /logs/verifier."""

    result: TurnResult
    verifier_files: dict[str, bytes]


class Episode:
    """Seed, turns, cleanup for one task and repeat.

    Call `prepare()` (image; not on the episode clock), `seed()`, `run_turn()` for each
    turn, then `finish()`. `cleanup()` is idempotent and safe from any state.
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
        settings: EpisodeSettings | None = None,
    ) -> None:
        self.task = task
        self.taskset = taskset
        self.repeat = repeat
        self.harness = harness
        self.provider = provider
        self.labels = dict(labels)
        #: Labels of an image this episode builds (images outlive episodes and runs).
        self.image_labels = dict(labels if image_labels is None else image_labels)
        self.settings = settings or EpisodeSettings()
        self._image: str | None = None
        self._sandbox: Sandbox | None = None
        self._turns: list[TurnResult] = []
        self._timings: dict[str, float] = {}
        self._clock_start: float | None = None
        self._clock_end: dict[str, float] = {}

    @property
    def id(self) -> str:
        return episode_id(self.task.id, self.repeat)

    @property
    def workdir(self) -> str | None:
        return self.task.config.environment.workdir

    def prepare(self) -> None:
        """Make the task's image (build once per content hash, or check the prebuilt one)."""
        started = time.monotonic()
        environment = self.task.config.environment
        dockerfile = self.task.dockerfile
        self._image = self.provider.prepare_image(
            ImageSource(
                docker_image=environment.docker_image,
                context_dir=None if dockerfile is None else dockerfile.parent,
                build_timeout_sec=environment.build_timeout_sec,
                labels=self.image_labels,
            )
        )
        self._timings["build_s"] = time.monotonic() - started

    def seed(self) -> None:
        """Start the sandbox with its log, test and solution folders in place."""
        if self._image is None:
            self.prepare()
        assert self._image is not None
        self._clock_start = started = time.monotonic()
        environment = self.task.config.environment
        self._sandbox = self.provider.start(
            SandboxSpec(
                image=self._image,
                workdir=environment.workdir,
                env=environment.env,
                cpus=environment.cpus,
                memory_mb=environment.memory_mb,
                network=environment.network_mode != "no-network",
                labels=self.labels,
                directories=SANDBOX_DIRECTORIES,
            )
        )
        self._timings["seed_s"] = time.monotonic() - started

    def run_turn(self, turn: Turn) -> TurnOutput:
        """Let the harness work on `turn`, then run the verifier and read the reward."""
        sandbox = self._require_sandbox()
        started = time.monotonic()
        agent = self.harness.run_turn(sandbox, turn, workdir=self.workdir)
        agent_s = time.monotonic() - started
        started = time.monotonic()
        try:
            verification = self._verify(sandbox, turn)
        except SandboxError as error:
            lost = RewardReading.failed(FailureKind.SANDBOX_LOST, str(error), masked=True)
            verification = _Verification(lost)
        verify_s = time.monotonic() - started
        result = _turn_result(
            turn, agent, verification, agent_s, verify_s, oracle=self.harness.validates
        )
        self._turns.append(result)
        self._clock_end["turn"] = time.monotonic()
        return TurnOutput(result, verification.files)

    def _verify(self, sandbox: Sandbox, turn: Turn) -> _Verification:
        """Empty /tests and /logs/verifier, upload the tests, run test.sh, read the reward.

        As root this is one exec; a verifier user needs a second one, since emptying the
        folders needs root.
        """
        budget = turn.verifier_timeout_sec
        grace = self.settings.verifier_grace_s
        run = _RUN_VERIFIER.format(
            grace=f"{grace:g}", budget=f"{budget:g}", tests=TESTS_DIR, logs=VERIFIER_LOGS
        )
        tests = pack_folders(turn.tests_dirs)
        as_root = turn.verifier_user in (None, "root", "0")
        started = time.monotonic()
        prepare = sandbox.exec(
            ["/bin/sh", "-c", _PREPARE_VERIFIER + (run if as_root else "")],
            user="root",
            workdir=self.workdir,
            env=turn.verifier_env if as_root else None,
            timeout=budget + grace + 10.0 if as_root else 60.0,
            stdin=tests,
        )
        problem = _marked(prepare.stderr, _BROKEN)
        if problem is not None:
            raise SandboxError(problem)
        missing = _marked(prepare.stderr, _MISSING)
        if missing is not None:
            tools = " and ".join(missing.split())
            return _Verification(
                RewardReading.failed(
                    FailureKind.VERIFIER_ERROR,
                    f"the image lacks {tools}, which the verifier needs",
                    masked=True,
                )
            )
        result = prepare
        if not as_root:
            started = time.monotonic()
            result = sandbox.exec(
                ["/bin/sh", "-c", run],
                user=turn.verifier_user,
                workdir=self.workdir,
                env=turn.verifier_env,
                timeout=budget + grace + 10.0,
            )
        elapsed = time.monotonic() - started
        # `timeout` exits 124 after SIGTERM worked, 137 when SIGKILL was needed.
        timed_out = result.timed_out or (result.exit_code in (124, 137) and elapsed >= budget)
        files = unpack_files(result.stdout_bytes) if result.stdout_bytes else {}
        if timed_out:
            reading = RewardReading.failed(
                FailureKind.VERIFIER_TIMEOUT,
                f"the verifier did not finish within [verifier].timeout_sec = {budget:g} s "
                "and was killed",
            )
        else:
            reading = read_reward(files)
        return _Verification(reading, result.exit_code, timed_out, files)

    def finish(self) -> EpisodeResult:
        """Clean up, then return the episode's result."""
        self.cleanup()
        return self.result()

    def result(self) -> EpisodeResult:
        """The result of the turns that ran (single-step: its one turn).

        `cleanup_s` is set only once cleanup() has run; `total_s` runs from the start of
        the seed to the end of cleanup, or of the last turn when cleanup is still to come.
        """
        if not self._turns:
            raise RuntimeError(f"episode {self.id} ran no turn")
        last = self._turns[-1]
        total = None
        if self._clock_start is not None:
            total = self._clock_end.get("cleanup", self._clock_end["turn"]) - self._clock_start
        return EpisodeResult(
            task_id=self.task.id,
            taskset=self.taskset,
            repeat=self.repeat,
            agent=self.harness.name,
            reward=last.reward,
            verifier_rewards=last.verifier_rewards,
            mask_sample=last.mask_sample,
            failure_kind=last.failure_kind,
            failure_reason=last.failure_reason,
            solution_exit_code=last.agent_exit_code if self.harness.validates else None,
            timings=PhaseTimings(
                build_s=self._timings.get("build_s"),
                seed_s=self._timings.get("seed_s"),
                agent_s=last.timings.agent_s,
                verify_s=last.timings.verify_s,
                cleanup_s=self._timings.get("cleanup_s"),
                total_s=total,
            ),
            turns=list(self._turns),
        )

    def cleanup(self) -> None:
        """Remove the sandbox at once, whatever happened before; idempotent."""
        if self._sandbox is None:
            return
        started = time.monotonic()
        sandbox, self._sandbox = self._sandbox, None
        sandbox.stop()
        self._clock_end["cleanup"] = time.monotonic()
        self._timings["cleanup_s"] = self._clock_end["cleanup"] - started

    def _require_sandbox(self) -> Sandbox:
        if self._sandbox is None:
            raise SandboxError(f"episode {self.id} has no sandbox: seed() it first")
        return self._sandbox


def _turn_result(
    turn: Turn,
    agent: AgentRun,
    verification: _Verification,
    agent_s: float,
    verify_s: float,
    *,
    oracle: bool,
) -> TurnResult:
    reading = verification.reading
    kind, reason = reading.failure_kind, reading.failure_reason
    who = "solve.sh" if oracle else "the agent"
    if kind is None and agent.timed_out:
        kind = FailureKind.AGENT_TIMEOUT
        reason = (
            f"{who} did not finish within [agent].timeout_sec = {turn.agent_timeout_sec:g} s "
            "and was killed"
        )
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
        reward_file=reading.source,
        agent_exit_code=agent.exit_code,
        agent_timed_out=agent.timed_out,
        verifier_exit_code=verification.exit_code,
        verifier_timed_out=verification.timed_out,
        agent_log_tail=agent.log_tail,
        timings=TurnTimings(agent_s=agent_s, verify_s=verify_s),
    )


def _marked(stderr: str, marker: str) -> str | None:
    """The text after `marker` on the first stderr line that carries it."""
    for line in stderr.splitlines():
        if line.startswith(marker):
            return line[len(marker) :].strip()
    return None
