"""Multi-step episodes on the real engine: one sandbox for all turns, what a turn starts
with, per-step budgets and users, roll-up, early stop, and selection."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import docker
import pytest

from tests.fixtures import BASE_IMAGE, Dataset, SandboxWatcher, multi_step, run_harbor

pytestmark = pytest.mark.docker


@pytest.fixture
def dataset(harbor_dataset: Dataset) -> Dataset:
    return harbor_dataset


PASS = "echo 1 > /logs/verifier/reward.txt\n"
LOG_STEP = "echo {step} >> /work/log\n"


def test_turns_share_one_sandbox_and_run_in_order_on_one_worker(
    pytester: pytest.Pytester, dataset: Dataset, docker_client: docker.DockerClient
) -> None:
    check = (
        '[ "$(cat /work/log | tr "\\n" " ")" = "{expected} " ] '
        "&& echo 1 > /logs/verifier/reward.txt\n"
    )
    steps = ["s1", "s2", "s3"]
    for name in ("alpha", "beta"):
        multi_step(
            dataset,
            name,
            {
                step: (LOG_STEP.format(step=step), check.format(expected=" ".join(steps[: i + 1])))
                for i, step in enumerate(steps)
            },
        )
    with SandboxWatcher(docker_client, f"pytest-harbor.task={dataset.name}/alpha") as watcher:
        result = run_harbor(pytester, dataset, "-n", "2", "-v", "--harbor-repeats=2")
    result.assert_outcomes(passed=12)
    assert len(watcher.seen) == 2  # one sandbox per trial of alpha, not one per turn
    runs = re.findall(r"\[(gw\d)\] \[ *\d+%\] PASSED (\S+)::(r\d)::(s\d)", result.stdout.str())
    by_trial: dict[str, list[tuple[str, str]]] = {}
    for worker, task, repeat, step in runs:
        by_trial.setdefault(f"{task}::{repeat}", []).append((worker, step))
    assert len(by_trial) == 4
    for trial in by_trial.values():
        assert [step for _, step in trial] == steps
        assert len({worker for worker, _ in trial}) == 1
    rows = dataset.rows(pytester.path / "out")
    assert len(rows) == 4
    for row in rows:
        assert row["verifier_logs_dir"] is None
        assert [turn["step"] for turn in row["turns"]] == steps
        for turn in row["turns"]:
            folder = Path(turn["verifier_logs_dir"])
            assert folder.name == turn["step"] and (folder / "reward.txt").is_file()


def test_a_later_turn_starts_clean_but_keeps_the_agents_own_files(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    plant = (
        "echo mine > /logs/agent/notes.txt; echo '{}' > /logs/agent/trajectory.json; "
        "echo planted > /tests/planted; echo 1 > /logs/verifier/reward.txt\n"
    )
    second_solve = (
        "[ -e /solution/leftover.txt ] && echo stale > /work/solution-state "
        "|| echo clean > /work/solution-state\n"
    )
    second_test = (
        "ls -A /tests /logs/verifier; cat /work/solution-state\n"
        # The transcript is this turn's, written for the verifier, not what step 1 planted.
        "[ -f /logs/agent/notes.txt ] && grep -q 'Do second.' /logs/agent/trajectory.json "
        "&& [ ! -e /tests/planted ] && [ ! -e /tests/first-only.sh ] "
        '&& [ "$(cat /work/solution-state)" = clean ] && echo 1 > /logs/verifier/reward.txt\n'
    )
    multi_step(
        dataset,
        "clean",
        {"first": (plant, PASS), "second": (second_solve, second_test)},
        extra_files={
            "steps/first/solution/leftover.txt": "from the first step\n",
            "steps/first/tests/first-only.sh": "true\n",
        },
    )
    run_harbor(pytester, dataset).assert_outcomes(passed=2)
    (row,) = dataset.rows(pytester.path / "out")
    second = Path(row["turns"][1]["verifier_logs_dir"]) / "test-stdout.txt"
    assert second.read_text() == "/logs/verifier:\ntest-stdout.txt\n\n/tests:\ntest.sh\nclean\n"


def test_step_budgets_and_an_inherited_verifier_timeout(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    multi_step(
        dataset,
        "timed",
        {
            "slow-agent": (
                "echo 1 > /tmp/answer; sleep 60\n",
                "cat /tmp/answer > /logs/verifier/reward.txt\n",
            ),
            "slow-verifier": ("true\n", "sleep 60; echo 1 > /logs/verifier/reward.txt\n"),
        },
        toml="[agent]\ntimeout_sec = 120\n[verifier]\ntimeout_sec = 2\n",
        step_toml={"slow-agent": "[steps.agent]\ntimeout_sec = 1\n"},
    )
    result = run_harbor(pytester, dataset, "--harbor-set=verifier_grace_s=1")
    result.assert_outcomes(failed=2)
    (row,) = dataset.rows(pytester.path / "out")
    first, second = row["turns"]
    assert (first["reward"], first["failure_kind"], first["agent_timed_out"]) == (
        1.0,
        "agent_timeout",
        True,
    )
    assert first["timings"]["agent_s"] < 30
    # No [steps.verifier].timeout_sec: the task's 2 s applies, not Harbor's 600.
    assert (second["reward"], second["failure_kind"]) == (0.0, "harbor:verifier_timeout")
    assert second["timings"]["verify_s"] < 30
    assert row["reward"] == 0.5
    assert row["stopped_after_turn"] is None  # the last turn: nothing left to stop


def test_collect_hooks_run_for_every_step(pytester: pytest.Pytester, dataset: Dataset) -> None:
    count = '[ "$(wc -l < /tmp/hooks)" = {n} ] && echo 1 > /logs/verifier/reward.txt\n'
    multi_step(
        dataset,
        "hooked",
        {"a": ("true\n", count.format(n=1)), "b": ("true\n", count.format(n=2))},
        toml='[[verifier.collect]]\ncommand = "echo hook >> /tmp/hooks"\n',
    )
    run_harbor(pytester, dataset).assert_outcomes(passed=2)


def test_per_step_users_own_the_workdir_in_turn(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    record = 'echo "$(id -un):$(id -gn)" > /work/{step}.who\n'
    check = (
        'echo "agent $(cat /work/{step}.who), dir $(stat -c %U /work), verifier $(id -un)"\n'
        '[ "$(cat /work/{step}.who)" = "{expected}" ] && [ "$(stat -c %U /work)" = "{owner}" ] '
        "&& echo 1 > /logs/verifier/reward.txt\n"
    )
    multi_step(
        dataset,
        "users",
        {
            "by-uid": (
                record.format(step="by-uid"),
                check.format(step="by-uid", expected="nobody:nogroup", owner="nobody"),
            ),
            "root-again": (
                record.format(step="root-again"),
                check.format(step="root-again", expected="root:root", owner="root"),
            ),
            "with-group": (
                record.format(step="with-group"),
                check.format(step="with-group", expected="daemon:nogroup", owner="daemon"),
            ),
        },
        step_toml={
            "by-uid": "[steps.agent]\nuser = 65534\n",
            "root-again": '[steps.agent]\nuser = "root"\n',
            "with-group": '[steps.agent]\nuser = "daemon:nogroup"\n',
        },
    )
    run_harbor(pytester, dataset).assert_outcomes(passed=3)
    (row,) = dataset.rows(pytester.path / "out")
    logs = (Path(row["turns"][0]["verifier_logs_dir"]) / "test-stdout.txt").read_text()
    assert logs == "agent nobody:nogroup, dir nobody, verifier root\n"


def test_a_missed_gate_stops_the_episode(pytester: pytest.Pytester, dataset: Dataset) -> None:
    multi_step(
        dataset,
        "gated",
        {
            "first": ("true\n", 'echo \'{"x": 1, "y": 0.2}\' > /logs/verifier/reward.json\n'),
            "second": ("true\n", PASS),
            "third": ("true\n", PASS),
        },
        step_toml={"first": "min_reward = { y = 0.5 }\n"},
    )
    result = run_harbor(pytester, dataset, "-rs")
    result.assert_outcomes(failed=1, skipped=2)
    result.stdout.fnmatch_lines(
        [
            "*SKIPPED [[]2[]] *gated/task.toml:1: stopped after turn first: "
            "turn first: y 0.2 is below its min_reward 0.5"
        ]
    )
    (row,) = dataset.rows(pytester.path / "out")
    assert row["stopped_after_turn"] == "first"
    assert row["failure_kind"] == "harbor:min_reward_missed"
    assert [turn["step"] for turn in row["turns"]] == ["first"]
    assert row["reward"] == pytest.approx(0.6)
    assert row["verifier_rewards"] == {"x": 1.0, "y": 0.2}


def test_a_turn_without_a_valid_reward_stops_the_episode(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    multi_step(
        dataset, "silent", {"first": ("true\n", "echo no reward\n"), "second": ("true\n", PASS)}
    )
    run_harbor(pytester, dataset).assert_outcomes(failed=1, skipped=1)
    (row,) = dataset.rows(pytester.path / "out")
    assert (row["stopped_after_turn"], row["failure_kind"]) == ("first", "harbor:reward_missing")


def test_a_masked_turn_masks_the_episode(
    pytester: pytest.Pytester, dataset: Dataset, built_images: list[Path]
) -> None:
    task = multi_step(dataset, "masked", {"first": ("true\n", PASS), "second": ("true\n", PASS)})
    toml = (task / "task.toml").read_text().replace(f'docker_image = "{BASE_IMAGE}"\n', "")
    (task / "task.toml").write_text(toml)
    (task / "environment").mkdir()
    (task / "environment" / "Dockerfile").write_text(
        # The test's own image (another test removes the image it builds).
        f"# {dataset.name}\nFROM {BASE_IMAGE}\nRUN rm /usr/bin/timeout\n"
    )
    built_images.append(task / "environment")
    result = run_harbor(pytester, dataset)
    result.assert_outcomes(errors=1, skipped=1)
    (row,) = dataset.rows(pytester.path / "out")
    assert (row["mask_sample"], row["failure_kind"], row["stopped_after_turn"]) == (
        True,
        "harbor:verifier_error",
        "first",
    )


@pytest.mark.parametrize(
    ("strategy", "reward", "rewards"),
    [("mean", 1.0, {"a": 0.5, "b": 0.5}), ("final", 1.0, {"b": 1.0})],
)
def test_roll_up_by_strategy(
    pytester: pytest.Pytester,
    dataset: Dataset,
    strategy: str,
    reward: float,
    rewards: dict[str, float],
) -> None:
    multi_step(
        dataset,
        "rolled",
        {
            "first": ("true\n", "echo '{\"a\": 1}' > /logs/verifier/reward.json\n"),
            "second": ("true\n", "echo '{\"b\": 1}' > /logs/verifier/reward.json\n"),
        },
        toml=f'multi_step_reward_strategy = "{strategy}"\n',
    )
    run_harbor(pytester, dataset).assert_outcomes(passed=2)
    (row,) = dataset.rows(pytester.path / "out")
    assert (row["reward"], row["verifier_rewards"]) == (reward, rewards)


def test_last_failed_reruns_a_failed_step_with_the_steps_before_it(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    multi_step(
        dataset,
        "flaky",
        {
            "first": (LOG_STEP.format(step="first"), PASS),
            "second": (LOG_STEP.format(step="second"), "echo 0 > /logs/verifier/reward.txt\n"),
            "third": (LOG_STEP.format(step="third"), PASS),
        },
    )
    run_harbor(pytester, dataset).assert_outcomes(passed=2, failed=1)
    rerun = run_harbor(pytester, dataset, "--lf", "-v")
    rerun.assert_outcomes(passed=1, failed=1)
    rerun.stdout.fnmatch_lines(["*flaky::r0::first PASSED*", "*flaky::r0::second FAILED*"])
    rerun.stdout.no_fnmatch_line("*::third*")


def test_the_example_dataset_passes_with_the_oracle(pytester: pytest.Pytester) -> None:
    import shutil

    from tests.fixtures import REPO_ROOT

    copy = pytester.path / "multistep"
    shutil.copytree(REPO_ROOT / "example_datasets" / "multistep", copy)
    result = pytester.runpytest(f"--harbor-dataset={copy}", "-n", "2")
    result.assert_outcomes(passed=10)
    rows = Dataset(copy).rows(pytester.path / "results")
    assert sorted((row["task_id"], row["reward"]) for row in rows) == [
        ("build-a-poem", 1.0),
        ("greeter", 1.0),
        ("hand-over", 1.0),
        ("layered-checks", 1.0),
    ]


def test_a_turn_without_a_result_skips_the_rest_and_leaves_one_failure_row(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    multi_step(dataset, "lost", {"s1": ("sleep 60\n", None), "s2": ("true\n", None)})
    # The backstop, tightened by a conftest.py, ends turn s1 with no result.
    pytester.makeconftest(
        textwrap.dedent(
            """
            import pytest

            def pytest_collection_modifyitems(items):
                for item in items:
                    if item.nodeid.endswith("::s1"):
                        item.add_marker(pytest.mark.timeout(3), append=False)
            """
        )
    )
    result = pytester.runpytest_subprocess(
        f"--harbor-dataset={dataset.path}", "--harbor-results-dir=out", "-rs"
    )
    result.assert_outcomes(errors=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*the episode has no result: turn s1 broke down"])
    (failure,) = dataset.failures(pytester.path / "out")
    assert (failure["stage"], failure["step"], failure["failure_kind"]) == (
        "turn",
        "s1",
        "harbor:episode_timeout",
    )
    assert dataset.rows(pytester.path / "out") == []


def test_any_exception_in_a_turn_ends_the_episode(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    """Not only the engine's own errors: anything a turn raises leaves the episode without
    a result, skips the later turns and removes the sandbox at once."""
    multi_step(dataset, "breaks", {"01-a": ("true\n", PASS), "02-b": ("true\n", PASS)})
    seen = pytester.path / "containers-at-02-b.txt"
    pytester.makeconftest(
        f"""
        import docker
        from pytest_harbor.engine import episode

        original = episode.run_collect_hooks

        def broken(*args, **kwargs):
            raise KeyError("a bug in the engine")

        def pytest_configure(config):
            episode.run_collect_hooks = broken

        def pytest_unconfigure(config):
            episode.run_collect_hooks = original

        def pytest_runtest_setup(item):
            if item.name == "02-b":
                found = docker.from_env().containers.list(
                    all=True, filters={{"label": "pytest-harbor.task={dataset.name}/breaks"}}
                )
                open({str(seen)!r}, "w").write(str(len(found)))
        """
    )
    result = run_harbor(pytester, dataset, "-rA")
    result.assert_outcomes(errors=1, skipped=1)
    result.stdout.fnmatch_lines(["*SKIPPED*the episode has no result: turn 01-a broke down*"])
    assert seen.read_text() == "0"
    assert dataset.rows(pytester.path / "out") == []
    (failure,) = dataset.failures(pytester.path / "out")
    assert (failure["failure_kind"], failure["step"], failure["stage"]) == (
        "harbor:internal_error",
        "01-a",
        "turn",
    )
    assert "KeyError" in failure["failure_reason"]


def test_a_partly_selected_episode_writes_a_partial_row_that_resume_runs_in_full(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    multi_step(
        dataset, "two", {"01-a": (LOG_STEP.format(step="a"), PASS), "02-b": ("true\n", PASS)}
    )
    result = run_harbor(pytester, dataset, "-k", "01-a")
    result.assert_outcomes(passed=1, deselected=1)
    result.stdout.fnmatch_lines(
        [
            f"{dataset.name}: 1 episode, mean reward n/a (0 passed, 0 failed, 0 masked, "
            "0 no result); 1 partial",
            "*1 episode(s) ran only some of their steps*marked partial*",
        ]
    )
    (row,) = dataset.rows(pytester.path / "out")
    assert (row["partial"], row["unselected_steps"]) == (True, ["02-b"])
    assert [turn["step"] for turn in row["turns"]] == ["01-a"]
    summary = dataset.summary(pytester.path / "out")
    assert summary["counts"]["partial"] == 1
    assert summary["episodes"][0]["status"] == "partial"

    resumed = run_harbor(pytester, dataset, "--harbor-resume")
    resumed.assert_outcomes(passed=2)
    (row,) = dataset.rows(pytester.path / "out")
    assert row["partial"] is False
    assert [turn["step"] for turn in row["turns"]] == ["01-a", "02-b"]


def test_the_strict_rollup_counts_the_steps_an_early_stop_left_out(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    """Step one passes, step two's verifier writes no reward (the episode stops there),
    step three never runs: over the steps that ran the mean is 0.5, above failing two
    and three honestly (1/3); counted over the declared steps it is 1/3."""
    multi_step(
        dataset,
        "stops-early",
        {"one": ("true\n", PASS), "two": ("true\n", "true\n"), "three": ("true\n", PASS)},
    )
    run_harbor(pytester, dataset, "--harbor-results-dir=ran")
    (row,) = dataset.rows(pytester.path / "ran")
    assert (row["reward"], row["stopped_after_turn"]) == (0.5, "two")
    run_harbor(pytester, dataset, "--harbor-set=multi_step_rollup=declared")
    (row,) = dataset.rows(pytester.path / "out")
    assert row["reward"] == pytest.approx(1 / 3)
    assert row["stopped_after_turn"] == "two"
