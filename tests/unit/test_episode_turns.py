"""Episode's turn logic against a scripted provider and harness (tests/fake_provider.py):
rewards, retries, a lost sandbox, masking, and the steps of a multi-step task, with no
sandbox engine at all."""

from __future__ import annotations

import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pytest_harbor.agent_outcomes import AgentOutcomePolicy
from pytest_harbor.engine import Episode, EpisodeError, EpisodeResult
from pytest_harbor.engine import episode as episode_module
from pytest_harbor.engine.afresh import FRESH_STARTS, engine_lost
from pytest_harbor.engine.progress import EpisodeProgress
from pytest_harbor.engine.records import TurnOutput
from pytest_harbor.engine.scripts import TAMPERED
from pytest_harbor.harnesses.base import (
    AgentFailure,
    AgentRun,
    Harness,
    HarnessSession,
    SessionContext,
    TurnContext,
    Usage,
)
from pytest_harbor.sandboxes.base import (
    EngineUnreachable,
    ExecResult,
    ImageConfig,
    SandboxError,
    SandboxStatus,
)
from pytest_harbor.settings import HarborSettings
from pytest_harbor.tasks import Task, load_task
from tests.fake_provider import Call, FakeProvider, SandboxScript, Verdict
from tests.fixtures import BASE_IMAGE

#: What a harness's turn does: the run it reports, or work in the sandbox that gives one.
Act = AgentRun | Callable[[TurnContext], AgentRun]

SECRET = "tok-5f3a9c0e7b21d84"


class ScriptedHarness(Harness):
    """A harness whose turns report what the test scripted, in order (the last one
    answers every later turn); it records each instruction it was given."""

    name = "scripted"

    def __init__(self, *acts: Act) -> None:
        self.acts = acts or (AgentRun(exit_code=0),)
        self.instructions: list[str] = []
        self.sessions = 0

    def open_session(self, context: SessionContext) -> HarnessSession:
        self.sessions += 1
        return _Session(self)


class _Session:
    def __init__(self, harness: ScriptedHarness) -> None:
        self._harness = harness

    def run_turn(self, context: TurnContext) -> AgentRun:
        harness = self._harness
        act = harness.acts[min(len(harness.instructions), len(harness.acts) - 1)]
        harness.instructions.append(context.instruction)
        return act(context) if callable(act) else act

    def close(self, context: SessionContext) -> None:
        return None


def single_step_task(tmp_path: Path) -> Task:
    folder = tmp_path / "task"
    (folder / "tests").mkdir(parents=True)
    (folder / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (folder / "instruction.md").write_text("Write hello.txt.\n")
    (folder / "task.toml").write_text(f'[environment]\ndocker_image = "{BASE_IMAGE}"\n')
    return load_task(folder)


def multi_step_task(tmp_path: Path, steps: str) -> Task:
    folder = tmp_path / "multi"
    (folder / "tests").mkdir(parents=True)
    (folder / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (folder / "task.toml").write_text(f'{steps}\n[environment]\ndocker_image = "{BASE_IMAGE}"\n')
    for name in ("one", "two", "three"):
        (folder / "steps" / name).mkdir(parents=True)
        (folder / "steps" / name / "instruction.md").write_text(f"Step {name}.\n")
    return load_task(folder)


THREE_STEPS = '[[steps]]\nname = "one"\n[[steps]]\nname = "two"\n[[steps]]\nname = "three"\n'


def episode_of(
    task: Task,
    tmp_path: Path,
    provider: FakeProvider,
    harness: ScriptedHarness,
    settings: HarborSettings | None = None,
) -> Episode:
    return Episode(
        task,
        taskset="fake",
        repeat=0,
        harness=harness,
        provider=provider,
        labels={"pytest-harbor.run": "fake-run"},
        settings=settings,
        agent_logs_dir=tmp_path / "agent",
        verifier_logs_dir=tmp_path / "verifier",
        artifacts_dir=tmp_path / "artifacts",
    )


def run_all(episode: Episode) -> tuple[list[TurnOutput], EpisodeResult]:
    """Seed, each turn (until one stops the episode), the result, cleanup."""
    outputs = []
    try:
        episode.seed()
        for turn in episode.task.turns:
            if episode.stopped_after is not None:
                break
            outputs.append(episode.run_turn(turn))
        return outputs, episode.result()
    finally:
        episode.cleanup()


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """The pauses the episode takes before a retry (taken at once here)."""
    taken: list[float] = []
    fake_time = types.SimpleNamespace(monotonic=time.monotonic, sleep=taken.append)
    monkeypatch.setattr(episode_module, "time", fake_time)
    yield taken


# ---------------------------------------------------------------------------- rewards


def test_a_passing_turn_is_scored_with_its_reward(tmp_path: Path) -> None:
    provider = FakeProvider(SandboxScript(verdicts=[Verdict.reward("1")]))
    harness = ScriptedHarness(AgentRun(exit_code=0, response="done"))
    task = single_step_task(tmp_path)
    (output,), result = run_all(episode_of(task, tmp_path, provider, harness))
    turn = output.result
    assert (turn.reward, turn.verifier_rewards, turn.reward_file) == (
        1.0,
        {"reward": 1.0},
        "reward.txt",
    )
    assert (turn.failure_kind, turn.mask_sample, turn.response) == (None, False, "done")
    assert (result.reward, result.failure_kind, result.attempts) == (1.0, None, 1)
    assert harness.instructions == ["Write hello.txt.\n"]
    (sandbox,) = provider.sandboxes
    # The task's tests and the transcript went in with the verifier's one root exec.
    assert sandbox.uploaded["tests/test.sh"] == b"echo 1 > /logs/verifier/reward.txt\n"
    assert "logs/agent/trajectory.json" in sandbox.uploaded
    assert [call.user for call in provider.calls_of("verify")] == ["0:0"]
    assert output.verifier_files["reward.txt"] == b"1"
    assert sandbox.stopped


def test_reward_json_scores_its_reward_key_else_the_mean(tmp_path: Path) -> None:
    verdict = Verdict({"reward.json": b'{"correctness": 1, "style": 0.5}', "reward.txt": b"0"})
    provider = FakeProvider(SandboxScript(verdicts=[verdict]))
    task = single_step_task(tmp_path)
    (output,), result = run_all(episode_of(task, tmp_path, provider, ScriptedHarness()))
    assert output.result.reward_file == "reward.json"
    assert output.result.verifier_rewards == {"correctness": 1.0, "style": 0.5}
    assert result.reward == pytest.approx(0.75)


@pytest.mark.parametrize(
    ("files", "kind"),
    [
        ({"test-stdout.txt": b"test.sh wrote nothing\n"}, "harbor:reward_missing"),
        ({"reward.txt": b"nan"}, "harbor:reward_invalid"),
        ({"reward.json": b"[1]", "reward.txt": b"1"}, "harbor:reward_invalid"),
    ],
)
def test_a_verifier_without_a_usable_reward_scores_0(
    tmp_path: Path, files: dict[str, bytes], kind: str
) -> None:
    provider = FakeProvider(SandboxScript(verdicts=[Verdict(files)]))
    task = single_step_task(tmp_path)
    (output,), result = run_all(episode_of(task, tmp_path, provider, ScriptedHarness()))
    # Once the verifier has run the attempt counts: scored 0, not masked, a row.
    assert (output.result.reward, output.result.failure_kind) == (0.0, kind)
    assert not output.result.mask_sample
    assert (result.reward, result.failure_kind, result.mask_sample) == (0.0, kind, False)


# ---------------------------------------------------------------------------- retries


def _policy(backoff_s: float) -> HarborSettings:
    rule = {"action": "retry", "retries": 2, "backoff_s": backoff_s}
    return HarborSettings(agent_outcome_policy=AgentOutcomePolicy(rate_limited=rule))  # type: ignore[arg-type]


def test_a_rate_limited_agent_runs_again_in_a_fresh_sandbox(
    tmp_path: Path, pauses: list[float]
) -> None:
    limited = AgentRun(
        failure=AgentFailure("rate_limited", "429 from the endpoint"), usage=Usage(requests=3)
    )
    harness = ScriptedHarness(limited, AgentRun(exit_code=0, usage=Usage(requests=1)))
    provider = FakeProvider()
    task = single_step_task(tmp_path)
    (output,), result = run_all(episode_of(task, tmp_path, provider, harness, _policy(4.0)))
    assert pauses == [4.0]
    assert (result.attempts, harness.sessions, len(provider.sandboxes)) == (2, 2, 2)
    first, second = provider.sandboxes
    assert first.stopped
    # The given-up attempt was never verified; its model usage still counts, apart.
    assert [call.sandbox for call in provider.calls_of("verify")] == [second.id]
    assert result.usage is not None and result.usage.requests == 1
    assert result.retried_usage is not None and result.retried_usage.requests == 3
    assert (result.reward, result.failure_kind, output.result.failure_cause) == (1.0, None, None)


def test_retries_double_their_pause_and_then_leave_no_result(
    tmp_path: Path, pauses: list[float]
) -> None:
    harness = ScriptedHarness(AgentRun(failure=AgentFailure("rate_limited", "429 again")))
    provider = FakeProvider()
    episode = episode_of(single_step_task(tmp_path), tmp_path, provider, harness, _policy(4.0))
    with pytest.raises(EpisodeError) as caught:
        run_all(episode)
    assert caught.value.failure_kind == "agent_rate_limited"
    assert "still after 2 retries" in str(caught.value)
    assert pauses == [4.0, 8.0]
    assert len(provider.sandboxes) == 3 and all(box.stopped for box in provider.sandboxes)
    assert provider.calls_of("verify") == []


def test_a_cause_the_policy_verifies_is_scored_without_a_retry(
    tmp_path: Path, pauses: list[float]
) -> None:
    harness = ScriptedHarness(AgentRun(failure=AgentFailure("agent_crashed", "the CLI died")))
    provider = FakeProvider(SandboxScript(verdicts=[Verdict.reward("0")]))
    task = single_step_task(tmp_path)
    (output,), result = run_all(episode_of(task, tmp_path, provider, harness))
    assert pauses == []
    assert (result.attempts, len(provider.sandboxes)) == (1, 1)
    assert (output.result.reward, output.result.failure_kind) == (0.0, "agent_crashed")
    assert output.result.failure_cause == "agent_crashed"


# ---------------------------------------------------------------------------- lost sandbox


def _works(context: TurnContext) -> AgentRun:
    done = context.sandbox.exec(["bash", "-c", "make build"])
    return AgentRun(exit_code=done.exit_code)


class ValidatingHarness(ScriptedHarness):
    """A harness under the validation contract, as the oracle is."""

    validates = True


@pytest.mark.parametrize("harness_kind", [ScriptedHarness, ValidatingHarness])
def test_only_an_agents_commands_take_the_providers_own_route(
    tmp_path: Path, harness_kind: type[ScriptedHarness]
) -> None:
    """A harness's commands reach the sandbox through its provider's view for agents
    (the docker provider's command channels); the engine's own steps never do, nor do a
    validating harness's (solve.sh's exit status is part of the result)."""
    provider = FakeProvider()
    task = single_step_task(tmp_path)
    (output,), _ = run_all(episode_of(task, tmp_path, provider, harness_kind(_works)))
    assert output.result.reward == 1.0
    agents = [call.command for call in provider.calls if call.kind == "command"]
    assert agents == [("bash", "-c", "make build")]
    by_agent = [call.command for call in provider.calls if call.by_agent]
    assert by_agent == (agents if harness_kind is ScriptedHarness else [])


def test_a_sandbox_lost_during_the_agents_turn_leaves_no_result(tmp_path: Path) -> None:
    provider = FakeProvider(SandboxScript(lose_on=lambda call: call.kind == "command"))
    episode = episode_of(single_step_task(tmp_path), tmp_path, provider, ScriptedHarness(_works))
    try:
        episode.seed()
        with pytest.raises(EpisodeError) as caught:
            episode.run_turn(episode.task.turns[0])
        assert caught.value.failure_kind == "harbor:sandbox_lost"
        assert "lost during turn" in str(caught.value)
        with pytest.raises(RuntimeError, match="ran no turn"):
            episode.result()
    finally:
        episode.cleanup()
    assert provider.calls_of("verify") == []


def test_a_sandbox_the_engine_lost_before_any_agent_is_started_afresh(tmp_path: Path) -> None:
    """Lost at the seed's survey: no agent has had it, so a fresh sandbox is the same
    episode; it scores as the verifier says."""
    provider = FakeProvider(
        SandboxScript(lose_on=lambda call: call.kind == "survey" and call.sandbox == "fake-1")
    )
    task = single_step_task(tmp_path)
    _, result = run_all(episode_of(task, tmp_path, provider, ScriptedHarness(_works)))
    assert (result.reward, result.failure_kind) == (1.0, None)
    assert [sandbox.id for sandbox in provider.sandboxes] == ["fake-1", "fake-2"]
    assert provider.sandboxes[0].stopped


def test_fresh_starts_are_bounded(tmp_path: Path) -> None:
    provider = FakeProvider(SandboxScript(lose_on=lambda call: call.kind == "survey"))
    episode = episode_of(single_step_task(tmp_path), tmp_path, provider, ScriptedHarness(_works))
    try:
        with pytest.raises(EpisodeError) as caught:
            episode.seed()
    finally:
        episode.cleanup()
    assert caught.value.failure_kind == "harbor:sandbox_start_failed"
    assert len(provider.sandboxes) == 1 + FRESH_STARTS


def test_only_a_sandbox_the_engine_lost_counts_as_lost() -> None:
    class Seen:
        def __init__(self, status: SandboxStatus | None) -> None:
            self._status = status

        def status(self) -> SandboxStatus:
            if self._status is None:
                raise SandboxError("the engine does not answer")
            return self._status

    running = SandboxStatus(present=True, running=True)
    failed = SandboxError("exec failed: no such file")
    assert not engine_lost(Seen(running), failed)  # type: ignore[arg-type]
    assert engine_lost(Seen(running), EngineUnreachable("refused"))  # type: ignore[arg-type]
    assert engine_lost(Seen(SandboxStatus(present=False)), failed)  # type: ignore[arg-type]
    assert engine_lost(Seen(SandboxStatus(present=True)), failed)  # type: ignore[arg-type]
    assert engine_lost(Seen(None), failed)  # type: ignore[arg-type]
    assert not engine_lost(None, failed)


# ---------------------------------------------------------------------------- masking


def test_a_sandbox_lost_while_verifying_masks_the_sample(tmp_path: Path) -> None:
    provider = FakeProvider(SandboxScript(lose_on=lambda call: call.kind == "verify"))
    task = single_step_task(tmp_path)
    (output,), result = run_all(episode_of(task, tmp_path, provider, ScriptedHarness(_works)))
    assert (output.result.failure_kind, output.result.mask_sample) == ("harbor:sandbox_lost", True)
    assert (result.mask_sample, result.reward) == (True, 0.0)


def test_an_image_without_bash_masks_the_sample(tmp_path: Path) -> None:
    provider = FakeProvider(SandboxScript(bash=None))
    task = single_step_task(tmp_path)
    (output,), result = run_all(episode_of(task, tmp_path, provider, ScriptedHarness()))
    assert (output.result.failure_kind, output.result.mask_sample) == (
        "harbor:verifier_error",
        True,
    )
    assert provider.calls_of("verify") == []  # test.sh never ran
    assert result.mask_sample


def test_a_sandbox_the_agent_changed_scores_0_rather_than_masking(tmp_path: Path) -> None:
    def tampered(call: Call) -> ExecResult | None:
        if call.kind != "verify":
            return None
        return ExecResult(97, stderr_bytes=f"{TAMPERED} /tests is no longer a folder\n".encode())

    provider = FakeProvider(SandboxScript(commands=tampered))
    task = single_step_task(tmp_path)
    (output,), _ = run_all(episode_of(task, tmp_path, provider, ScriptedHarness()))
    assert (output.result.failure_kind, output.result.mask_sample) == (
        "harbor:verifier_tampered",
        False,
    )
    assert output.result.reward == 0.0
    assert "/tests is no longer a folder" in (output.result.failure_reason or "")


def test_a_secret_in_what_the_sandbox_wrote_is_masked_in_the_result(tmp_path: Path) -> None:
    stdout = f"checked with token {SECRET}\n".encode()
    provider = FakeProvider(SandboxScript(verdicts=[Verdict.reward("1", stdout=stdout)]))
    crashed = AgentRun(failure=AgentFailure("agent_crashed", f"the CLI printed {SECRET}"))
    settings = HarborSettings(secrets={"API_TOKEN": SECRET})
    task = single_step_task(tmp_path)
    (output,), result = run_all(
        episode_of(task, tmp_path, provider, ScriptedHarness(crashed), settings)
    )
    assert output.result.failure_reason == "the CLI printed ***"
    assert output.verifier_files["test-stdout.txt"] == b"checked with token ***\n"
    assert SECRET not in result.model_dump_json()
    assert all(SECRET.encode() not in data for data in output.verifier_files.values())


# ---------------------------------------------------------------------------- multi-step


def test_the_steps_run_in_order_in_one_sandbox(tmp_path: Path) -> None:
    provider = FakeProvider()
    harness = ScriptedHarness()
    task = multi_step_task(tmp_path, THREE_STEPS)
    outputs, result = run_all(episode_of(task, tmp_path, provider, harness))
    assert harness.instructions == ["Step one.\n", "Step two.\n", "Step three.\n"]
    assert [turn.step for turn in result.turns] == ["one", "two", "three"]
    assert (result.stopped_after_turn, result.reward, harness.sessions) == (None, 1.0, 3)
    # One sandbox; each later turn begins by clearing the previous turn's files.
    assert len(provider.sandboxes) == 1
    kinds = [call.kind for call in provider.calls if call.kind in ("verify", "clear")]
    assert kinds == ["verify", "clear", "verify", "clear", "verify"]
    assert [output.verifier_dir.name for output in outputs] == ["one", "two", "three"]


def test_the_episode_tells_its_progress_each_phase_and_turn(tmp_path: Path) -> None:
    told: list[tuple[str, str | None]] = []
    task = multi_step_task(tmp_path, THREE_STEPS)
    episode = episode_of(task, tmp_path, FakeProvider(), ScriptedHarness())
    episode.progress = EpisodeProgress(lambda phase, step: told.append((phase, step)))
    run_all(episode)
    assert told == [
        ("seeding", None),
        *((phase, step) for step in ("one", "two", "three") for phase in ("agent", "verifying")),
    ]


def test_a_listener_that_fails_costs_the_episode_nothing(tmp_path: Path) -> None:
    episode = episode_of(single_step_task(tmp_path), tmp_path, FakeProvider(), ScriptedHarness())
    episode.progress = EpisodeProgress(lambda phase, step: 1 / 0)
    _, result = run_all(episode)
    assert result.reward == 1.0


def test_a_step_without_a_valid_reward_stops_the_episode(tmp_path: Path) -> None:
    verdicts = [
        Verdict.reward("1"),
        Verdict({"test-stdout.txt": b"crashed\n"}),
        Verdict.reward("1"),
    ]
    provider = FakeProvider(SandboxScript(verdicts=verdicts))
    harness = ScriptedHarness()
    episode = episode_of(multi_step_task(tmp_path, THREE_STEPS), tmp_path, provider, harness)
    _, result = run_all(episode)
    assert harness.instructions == ["Step one.\n", "Step two.\n"]
    assert episode.stopped_after == "two"
    assert result.stopped_after_turn == "two"
    # `mean` over the turns that ran, the one without a reward counting 0.
    assert (result.reward, result.failure_kind) == (0.5, "harbor:reward_missing")
    with pytest.raises(RuntimeError, match="stopped after turn two"):
        episode.run_turn(episode.task.turns[2])


def test_a_step_below_its_min_reward_stops_the_episode(tmp_path: Path) -> None:
    steps = THREE_STEPS.replace('name = "two"\n', 'name = "two"\nmin_reward = 1.0\n')
    verdicts = [Verdict.reward("1"), Verdict.reward("0.5"), Verdict.reward("1")]
    provider = FakeProvider(SandboxScript(verdicts=verdicts))
    harness = ScriptedHarness()
    episode = episode_of(multi_step_task(tmp_path, steps), tmp_path, provider, harness)
    outputs, result = run_all(episode)
    assert [output.result.step for output in outputs] == ["one", "two"]
    assert result.failure_kind == "harbor:min_reward_missed"
    assert result.stopped_after_turn == "two"
    assert result.reward == pytest.approx(0.75)
    assert "below its min_reward 1" in (result.failure_reason or "")


def test_the_overlays_mcp_servers_reach_the_harness_and_the_task_file(tmp_path: Path) -> None:
    """compose_overlay.mcp_servers join the task's own: the harness is handed the task with
    them, and the task description file is written for a task that has none of its own."""
    seen: list[list[str]] = []

    class Recording(ScriptedHarness):
        def open_session(self, context: SessionContext) -> HarnessSession:
            seen.append([server.name for server in context.task.config.environment.mcp_servers])
            return super().open_session(context)

    settings = HarborSettings.model_validate(
        {
            "compose_overlay": {
                "mcp_servers": [
                    {"name": "notes", "transport": "streamable-http", "url": "http://notes/mcp"}
                ]
            }
        }
    )
    provider = FakeProvider(SandboxScript(verdicts=[Verdict.reward("1")]))
    task = single_step_task(tmp_path)
    assert task.config.environment.mcp_servers == []
    (output,), _ = run_all(episode_of(task, tmp_path, provider, Recording(), settings))
    assert output.result.reward == 1.0
    assert seen == [["notes"]]
    written = [
        call for call in provider.calls if "/tmp/.pytest-harbor/task.json" in " ".join(call.command)
    ]
    assert written, [call.command for call in provider.calls]
    assert b"notes" in (written[0].stdin or b"")


def test_the_harness_is_told_what_the_image_declares(tmp_path: Path) -> None:
    declared = ImageConfig(
        cmd=("bash",), env=("LANG=C.UTF-8",), labels={"title": "t"}, healthcheck=("NONE",)
    )
    provider = FakeProvider(SandboxScript(verdicts=[Verdict.reward("1")], image_config=declared))
    seen: list[ImageConfig] = []

    def look(context: TurnContext) -> AgentRun:
        seen.append(context.image)
        return AgentRun(exit_code=0)

    run_all(episode_of(single_step_task(tmp_path), tmp_path, provider, ScriptedHarness(look)))
    assert seen == [declared]
