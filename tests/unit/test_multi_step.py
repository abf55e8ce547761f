"""Multi-step logic without a sandbox: roll-up, the early-stop rule, budgets, refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_harbor.engine import Episode, EpisodeError, FailureKind, TurnResult
from pytest_harbor.engine.budget import episode_budget
from pytest_harbor.engine.rollup import roll_up, stop_reason
from pytest_harbor.harnesses import make_harness
from pytest_harbor.sandboxes import SandboxCapabilities
from pytest_harbor.settings import HarborSettings
from pytest_harbor.tasks import load_task
from tests.fixtures import BASE_IMAGE


def turn(
    step: str, reward: float, rewards: dict[str, float] | None, **fields: object
) -> TurnResult:
    return TurnResult.model_validate(
        {"step": step, "reward": reward, "verifier_rewards": rewards, **fields}
    )


def test_mean_counts_missing_keys_and_invalid_turns_as_zero() -> None:
    turns = [
        turn("a", 1.0, {"correctness": 1.0, "style": 1.0}),
        turn("b", 0.5, {"correctness": 0.5}),
        turn("c", 0.0, None, failure_kind="harbor:reward_missing", failure_reason="none"),
    ]
    rolled = roll_up(turns, "mean")
    assert rolled.reward == pytest.approx(0.5)
    assert rolled.verifier_rewards == pytest.approx({"correctness": 0.5, "style": 1 / 3})
    assert (rolled.failure_kind, rolled.failure_reason) == ("harbor:reward_missing", "none")
    assert rolled.mask_sample is False


def test_final_takes_the_last_turn_that_ran() -> None:
    turns = [turn("a", 1.0, {"reward": 1.0}), turn("b", 0.25, {"reward": 0.25, "x": 1.0})]
    rolled = roll_up(turns, "final")
    assert (rolled.reward, rolled.verifier_rewards) == (0.25, {"reward": 0.25, "x": 1.0})


def test_an_early_stop_does_not_raise_the_strict_mean() -> None:
    """Step 1 passed, step 2's verifier broke (no reward: the episode stops there), step 3
    never ran: over the steps that ran that is 0.5, above the 1/3 of failing 2 and 3
    honestly; over the declared steps it is 1/3 either way."""
    stopped = [
        turn("one", 1.0, {"reward": 1.0}),
        turn("two", 0.0, None, failure_kind="harbor:verifier_timeout", failure_reason="hung"),
    ]
    honest = [turn("one", 1.0, {"reward": 1.0}), *(turn(s, 0.0, {"reward": 0.0}) for s in "ab")]
    declared = ["one", "two", "three"]
    assert roll_up(stopped, "mean", stopped_after="two").reward == pytest.approx(0.5)
    strict = roll_up(stopped, "mean", stopped_after="two", declared=declared)
    assert strict.reward == pytest.approx(1 / 3)
    assert strict.verifier_rewards == pytest.approx({"reward": 1 / 3})
    assert strict.failure_kind == "harbor:verifier_timeout"
    assert roll_up(honest, "mean", declared=["one", "a", "b"]).reward == pytest.approx(1 / 3)
    # `final` is the last declared step's: 0 when it did not run.
    final = roll_up(stopped, "final", stopped_after="two", declared=declared)
    assert (final.reward, final.verifier_rewards) == (0.0, {"reward": 0.0})
    whole = [turn("one", 1.0, {"reward": 1.0}), turn("two", 0.5, {"reward": 0.5})]
    assert roll_up(whole, "final", declared=["one", "two"]).reward == 0.5


def test_a_masked_turn_masks_the_episode_and_modes_can_mix() -> None:
    turns = [
        turn("a", 1.0, {"reward": 1.0}, verifier_mode="shared"),
        turn(
            "b",
            0.0,
            None,
            mask_sample=True,
            failure_kind="harbor:sandbox_lost",
            verifier_mode="separate",
        ),
    ]
    rolled = roll_up(turns, "mean", stopped_after="b")
    assert rolled.mask_sample and rolled.failure_kind == "harbor:sandbox_lost"
    assert rolled.verifier_mode == "mixed"


def test_a_missed_gate_is_the_episode_failure() -> None:
    turns = [turn("a", 0.5, {"reward": 0.5})]
    rolled = roll_up(turns, "mean", stopped_after="a", stop_reason="turn a: below")
    assert (rolled.failure_kind, rolled.failure_reason) == (
        FailureKind.MIN_REWARD_MISSED,
        "turn a: below",
    )


def test_the_stopping_turns_failure_wins_over_an_earlier_one() -> None:
    turns = [
        turn("a", 0.0, None, failure_kind="harbor:reward_missing", failure_reason="first"),
        turn("b", 0.0, None, failure_kind="harbor:verifier_timeout", failure_reason="stop"),
    ]
    rolled = roll_up(turns, "mean", stopped_after="b", stop_reason="turn b has no reward")
    assert (rolled.failure_kind, rolled.failure_reason) == ("harbor:verifier_timeout", "stop")


def test_a_missed_gate_wins_over_an_earlier_turns_failure() -> None:
    turns = [
        turn("a", 0.0, None, failure_kind="harbor:reward_missing", failure_reason="first"),
        turn("b", 0.5, {"reward": 0.5}),
    ]
    rolled = roll_up(turns, "mean", stopped_after="b", stop_reason="turn b: below")
    assert (rolled.failure_kind, rolled.failure_reason) == (
        FailureKind.MIN_REWARD_MISSED,
        "turn b: below",
    )


def test_an_episode_that_never_stopped_early_and_never_failed_has_no_failure() -> None:
    turns = [turn("a", 1.0, {"reward": 1.0}), turn("b", 0.0, {"reward": 0.0})]
    rolled = roll_up(turns, "mean")
    assert (rolled.failure_kind, rolled.failure_reason) == (None, None)
    assert rolled.verifier_mode == "shared"


@pytest.mark.parametrize("strategy", ["mean", "final"])
def test_turns_without_any_verifier_rewards_roll_up_to_none(strategy: str) -> None:
    turns = [
        turn("a", 0.0, None, failure_kind="harbor:reward_missing"),
        turn("b", 0.0, None, failure_kind="harbor:reward_missing"),
    ]
    rolled = roll_up(turns, strategy)
    assert (rolled.reward, rolled.verifier_rewards) == (0.0, None)


@pytest.mark.parametrize(
    ("result", "min_reward", "stops"),
    [
        (turn("a", 0.0, {"reward": 0.0}), None, None),
        (turn("a", 1.0, {"reward": 1.0}), 1.0, None),
        (turn("a", 0.9, {"reward": 0.9}), 1.0, "turn a: reward 0.9 is below its min_reward 1"),
        (turn("a", 0.5, {"x": 0.5}), 0.5, None),  # a number gates the turn's reward
        (turn("a", 1.0, {"x": 1.0, "y": 0.2}), {"x": 1.0}, None),
        (
            turn("a", 1.0, {"x": 1.0, "y": 0.2}),
            {"y": 0.5},
            "turn a: y 0.2 is below its min_reward 0.5",
        ),
        (turn("a", 1.0, {"x": 1.0}), {"z": 0.0}, "turn a: z missing is below its min_reward 0"),
        (
            turn("a", 0.0, None, failure_kind="harbor:verifier_timeout"),
            None,
            "turn a has no valid reward (harbor:verifier_timeout)",
        ),
        (
            turn("a", 0.0, None, failure_kind="harbor:reward_invalid"),
            {"x": 0.0},
            "turn a has no valid reward (harbor:reward_invalid)",
        ),
        (
            turn("a", 1.0, {"r": 1.0}, mask_sample=True, failure_kind="harbor:entrypoint_failed"),
            None,
            "turn a was masked (harbor:entrypoint_failed)",
        ),
    ],
)
def test_stop_reason(result: TurnResult, min_reward: object, stops: str | None) -> None:
    assert stop_reason(result, min_reward) == stops  # type: ignore[arg-type]


def multi_step_task(tmp_path: Path, steps: str, extra: str = "") -> Path:
    task = tmp_path / "multi"
    (task / "tests").mkdir(parents=True)
    (task / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (task / "task.toml").write_text(
        f'{extra}\n{steps}\n[environment]\ndocker_image = "{BASE_IMAGE}"\n'
    )
    for name in ("one", "two"):
        (task / "steps" / name).mkdir(parents=True)
        (task / "steps" / name / "instruction.md").write_text(f"Step {name}.\n")
    return task


def test_turns_inherit_the_task_and_override_per_step(tmp_path: Path) -> None:
    task = load_task(
        multi_step_task(
            tmp_path,
            '[[steps]]\nname = "one"\n[steps.agent]\ntimeout_sec = 5\nuser = "nobody"\n'
            '[steps.verifier]\nenv = { B = "step" }\n'
            '[[steps]]\nname = "two"\nmin_reward = { x = 1 }\n',
            extra="[agent]\ntimeout_sec = 50\nuser = 1000\n"
            '[verifier]\ntimeout_sec = 7\nuser = "daemon"\nenv = { A = "task", B = "task" }',
        )
    )
    one, two = task.turns
    assert (one.agent_timeout_sec, one.agent_user) == (5.0, "nobody")
    assert (two.agent_timeout_sec, two.agent_user) == (50.0, "1000")
    assert one.verifier_timeout_sec == two.verifier_timeout_sec == 7.0  # inherited
    assert one.verifier_user == "daemon"
    assert one.verifier_env == {"A": "task", "B": "step"}
    assert two.min_reward == {"x": 1.0}
    assert one.instruction == "Step one.\n"
    assert one.tests_dirs == (task.path / "tests",)


def test_budget_sums_every_turn(tmp_path: Path) -> None:
    task = load_task(
        multi_step_task(
            tmp_path,
            '[[steps]]\nname = "one"\n[steps.agent]\ntimeout_sec = 100\n'
            '[[steps]]\nname = "two"\n[steps.agent]\ntimeout_sec = 200\n'
            "[steps.verifier]\ntimeout_sec = 20\n",
            extra='[verifier]\ntimeout_sec = 10\n[[verifier.collect]]\ncommand = "sync"',
        )
    )
    settings = HarborSettings(harness_setup_allowance_s=5, verifier_grace_s=1)
    budget = episode_budget(task, settings, separate_verifier=False)
    assert budget.turns_s == (5 + 100 + 30 + 10 + 1) + (5 + 200 + 30 + 20 + 1)


class _NoGroups:
    """A provider that cannot apply groups; the refusal comes before anything starts."""

    name = "nogroups"
    capabilities = SandboxCapabilities(user_groups=False)


@pytest.mark.parametrize(
    ("steps", "settings", "message"),
    [
        (
            '[[steps]]\nname = "one"\n[steps.agent]\nuser = "nobody:nogroup"\n'
            '[[steps]]\nname = "two"\n',
            HarborSettings(),
            "step 'one': the agent user 'nobody:nogroup' names a group, which the nogroups "
            "sandbox cannot apply",
        ),
        (
            '[[steps]]\nname = "one"\n[[steps]]\nname = "two"\n',
            HarborSettings(turn_sessions="continue"),
            "turn_sessions = continue needs a harness that can continue a session; oracle cannot",
        ),
    ],
)
def test_seed_refusals(tmp_path: Path, steps: str, settings: HarborSettings, message: str) -> None:
    task = load_task(multi_step_task(tmp_path, steps))
    episode = Episode(
        task,
        taskset="t",
        repeat=0,
        harness=make_harness("oracle"),
        provider=_NoGroups(),  # type: ignore[arg-type]
        labels={},
        settings=settings,
    )
    with pytest.raises(EpisodeError) as caught:
        episode.seed()
    assert caught.value.failure_kind == FailureKind.TASK_REFUSED
    assert message in str(caught.value)


def test_artifacts_cannot_send_a_multi_step_task_to_a_separate_verifier(tmp_path: Path) -> None:
    task = load_task(
        multi_step_task(
            tmp_path,
            '[[steps]]\nname = "one"\n[[steps]]\nname = "two"\n',
            extra='artifacts = ["/out"]',
        )
    )
    episode = Episode(
        task,
        taskset="t",
        repeat=0,
        harness=make_harness("oracle"),
        provider=_NoGroups(),  # type: ignore[arg-type]
        labels={},
        settings=HarborSettings(separate_verifier_for_artifacts=True),
    )
    with pytest.raises(EpisodeError, match="cannot send a multi-step task to a separate verifier"):
        episode.seed()
