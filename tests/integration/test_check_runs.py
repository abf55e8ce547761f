"""`--harbor-check` on the real engine: the check-demo dataset's broken tasks are each
found, the run fails, check.json is written, and `--lf` runs exactly the tasks with
problems again."""

from __future__ import annotations

import json
import shutil
import uuid
from typing import Any

import docker
import pytest

from tests.fixtures import BASE_IMAGE, REPO_ROOT, RESULTS_DIR, Dataset, run_harbor

pytestmark = pytest.mark.docker

CHECK_DEMO = REPO_ROOT / "example_datasets" / "check-demo"


@pytest.fixture
def demo(pytester: pytest.Pytester, docker_client: docker.DockerClient) -> Dataset:
    copy = pytester.path / f"check-demo-{uuid.uuid4().hex[:8]}"
    shutil.copytree(CHECK_DEMO, copy)
    return Dataset(copy)


def _check(pytester: pytest.Pytester, dataset: Dataset) -> dict[str, Any]:
    folder = dataset.results_folder(pytester.path / RESULTS_DIR)
    data: dict[str, Any] = json.loads((folder / "check.json").read_text())
    return data


def test_the_check_finds_each_broken_task_and_lf_runs_them_again(
    pytester: pytest.Pytester, demo: Dataset
) -> None:
    result = run_harbor(pytester, demo, "--harbor-check", "--harbor-check-repeats=2", "-n", "2")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    tasks = _check(pytester, demo)["tasks"]
    kinds = {task: [p["kind"] for p in entry["problems"]] for task, entry in tasks.items()}
    assert kinds["sound"] == []
    assert kinds["accepts-anything"] == ["nop-passes"]
    assert kinds["no-solution"] == ["no-solution"]
    assert kinds["wrong-solution"] == ["oracle-failed"]
    assert kinds["slow-solution"] == ["slow-oracle"]
    assert kinds["unknown-key"] == ["load-warning"]
    # The probe: a verifier that checks only that a file exists, or only that it holds
    # something of the right form; the answer in a file of the image, or in its
    # configuration; a git history in the working directory, a `gitdir:` file, a `.git`
    # far from the working directory.
    assert kinds["exists-only"] == ["probe-scores"]
    assert kinds["filled-only"] == ["probe-scores"]
    assert kinds["answer-in-image"] == ["answer-in-image"]
    assert kinds["answer-in-label"] == ["answer-in-image"]
    assert kinds["short-answer"] == ["answer-in-image"]
    assert kinds["git-history"] == ["git-history"]
    assert kinds["git-submodule"] == ["git-history"]
    assert kinds["git-elsewhere"] == ["git-history"]
    # A mean roll-up with an ungated middle step.
    assert kinds["early-quit"] == ["early-stop-pays"]
    # An image with an ordinary configuration and ordinary git files.
    assert kinds["plain-image"] == []
    # A coin flip: it may score alike twice; what it found is still a problem.
    assert set(kinds["coin-flip"]) <= {"oracle-failed", "flaky-verifier"}
    assert tasks["sound"]["oracle_rewards"] == [1.0, 1.0]
    assert tasks["sound"]["nop_reward"] == 0.0
    assert tasks["accepts-anything"]["nop_reward"] == 1.0
    assert tasks["sound"]["probe_reward"] == 0.0
    assert tasks["exists-only"]["probe_reward"] == 1.0
    assert tasks["filled-only"]["probe_reward"] == 1.0
    assert tasks["plain-image"]["probe_reward"] == 0.0
    result.stdout.fnmatch_lines(
        [
            f"{demo.name}: task check (oracle x2, nop and probe per task): 17 task(s), "
            f"{sum(bool(found) for found in kinds.values())} with problems",
            "  task *  problem *  detail",
            "  accepts-anything  nop-passes * an agent that does nothing scores 1: the verifier "
            "accepts the sandbox as the task leaves it",
            "  answer-in-image * answer-in-image * the image holds text of the task's solution/ "
            "or tests/: /opt/vault/.expected holds `correct-horse-battery-staple-7731`",
            "  answer-in-label * answer-in-image * the image holds text of the task's "
            "solution/ or tests/: the image's LABEL org.example.release-note holds "
            "`QX5-harbor-2291-delta`",
            "  early-quit * early-stop-pays * step prices of 3 has no min_reward under the "
            "mean roll-up: breaking the verifier of prices after passing the steps before "
            "scores 0.5, failing it honestly 0.33",
            "  exists-only * probe-scores * an agent creating only /app/report.txt scores 1: "
            "the verifier checks that files exist, not what they hold",
            "  filled-only * probe-scores * an agent creating only /app/out/release.json "
            "scores 1: *",
            "  git-elsewhere * git-history * /usr/local/src/ledger-tools/.git: a git history *",
            "  git-history * git-history * /app/.git: a git history an agent can read *",
            "  git-submodule * git-history * /srv/site/vendor/theme/.git: a git history *",
            "  no-solution * no-solution * unvalidated: the task has no solution/solve.sh",
            "  short-answer * answer-in-image * the image holds text of the task's solution/ "
            "or tests/: /app/.tally holds `9`",
            "  slow-solution * slow-oracle * solve.sh took 3.* s of its 5 s timeout",
            "  unknown-key * load-warning * task.toml: unknown key ignored: environment.cpu "
            "(line 14): did you mean environment.cpus?",
            "  wrong-solution * oracle-failed * 2 of 2 runs (r0, r1): reward 0, solve.sh exit 0",
            "  check: *check.json",
        ]
    )
    # The empty agent's verifier folder is kept beside the oracle's; its row is not a row.
    folder = demo.results_folder(pytester.path / RESULTS_DIR)
    assert (folder / "verifier" / "accepts-anything__nop" / "test-stdout.txt").is_file()
    # The run's report shows the same findings, first.
    page = (folder / "report.html").read_text()
    assert page.index("Task check") < page.index("Reward")
    assert "nop-passes" in page and "accepts-anything" in page
    rows = demo.rows(pytester.path / RESULTS_DIR)
    assert {row["agent"] for row in rows} == {"oracle"}
    assert len(rows) == 16 * 2  # no-solution's trials are skipped
    # --lf: every item of each task with a problem (its passing items too), nothing else.
    again = run_harbor(
        pytester, demo, "--harbor-check", "--harbor-check-repeats=2", "-n", "2", "--lf"
    )
    with_problems = [task for task, found in kinds.items() if found]
    # Four items a task (r0, r1, nop, probe), each of them per step in early-quit's three.
    items = sum(12 if task == "early-quit" else 4 for task in with_problems)
    again.stdout.fnmatch_lines([f"*2 workers [[]{items} items[]]*"])
    assert set(_check(pytester, demo)["tasks"]) == set(with_problems)


def test_problems_that_fail_no_item_still_fail_the_run(
    pytester: pytest.Pytester, demo: Dataset
) -> None:
    result = run_harbor(pytester, demo, "--harbor-check", "-k", "unknown-key")
    result.assert_outcomes(passed=3)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        ["*: task check (oracle x1, nop and probe per task): 1 task(s), 1 with problems"]
    )
    sound = run_harbor(pytester, demo, "--harbor-check", "-k", "sound")
    sound.assert_outcomes(passed=3)
    assert sound.ret == pytest.ExitCode.OK
    sound.stdout.fnmatch_lines(
        ["*: task check (oracle x1, nop and probe per task): 1 task(s), 0 with problems"]
    )


def test_a_verifier_that_flips_a_coin_is_found_flaky(
    pytester: pytest.Pytester, demo: Dataset
) -> None:
    # Twelve fair flips all alike: a 1 in 2048 chance.
    result = run_harbor(
        pytester, demo, "--harbor-check", "--harbor-check-repeats=12", "-n", "2", "-k", "coin-flip"
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    (flaky,) = [
        p
        for p in _check(pytester, demo)["tasks"]["coin-flip"]["problems"]
        if p["kind"] == "flaky-verifier"
    ]
    assert flaky["detail"].startswith("rewards differ across 12 oracle runs: ")


def test_an_empty_agent_passing_one_step_of_a_multi_step_task(
    pytester: pytest.Pytester, docker_client: docker.DockerClient
) -> None:
    task = pytester.path / f"ms-{uuid.uuid4().hex[:8]}" / "two-steps"
    (task / "tests").mkdir(parents=True)
    (task / "task.toml").write_text(
        f'[environment]\ndocker_image = "{BASE_IMAGE}"\nworkdir = "/work"\n\n'
        '[[steps]]\nname = "one"\n\n[[steps]]\nname = "two"\n'
    )
    for step, solve, test in (
        ("one", "echo one > /work/log\n", None),
        # Broken on purpose: step two's own verifier checks nothing.
        ("two", "echo two >> /work/log\n", "echo 1 > /logs/verifier/reward.txt\n"),
    ):
        folder = task / "steps" / step
        (folder / "solution").mkdir(parents=True)
        (folder / "instruction.md").write_text(f"Do {step}.\n")
        (folder / "solution" / "solve.sh").write_text(solve)
        if test:
            (folder / "tests").mkdir()
            (folder / "tests" / "test.sh").write_text(test)
    (task / "tests" / "test.sh").write_text(
        '[ "$(cat /work/log 2>/dev/null)" = one ] && echo 1 > /logs/verifier/reward.txt '
        "|| echo 0 > /logs/verifier/reward.txt\n"
    )
    result = pytester.runpytest(
        f"--harbor-dataset={task.parent}", f"--harbor-results-dir={RESULTS_DIR}", "--harbor-check"
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    data = json.loads(
        (
            pytester.path
            / RESULTS_DIR
            / "harbor"
            / "validation"
            / task.parent.name
            / "latest"
            / "check.json"
        ).read_text()
    )
    assert data["tasks"]["two-steps"]["problems"] == [
        {
            "kind": "nop-passes",
            "detail": "an agent that does nothing scores 1 in step two: the verifier accepts "
            "the sandbox as the task leaves it",
        }
    ]
    result.stdout.fnmatch_lines(["FAILED *two-steps::nop::two - *an agent that does nothing*"])


def test_task_folders_left_out_are_problems_of_the_check(
    pytester: pytest.Pytester, harbor_dataset: Dataset
) -> None:
    harbor_dataset.task("fine")
    harbor_dataset.task("broken", toml="[environment\n")
    result = run_harbor(pytester, harbor_dataset, "--harbor-check", "--harbor-skip-unloadable")
    result.assert_outcomes(passed=3)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["  broken  refused  *task.toml*"])
    tasks = _check(pytester, harbor_dataset)["tasks"]
    assert [p["kind"] for p in tasks["broken"]["problems"]] == ["refused"]
    assert tasks["fine"]["problems"] == []
