"""A worker killed mid-episode, --harbor-resume, and the backstop timer, on the real engine."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import textwrap
import time
from typing import Any

import docker
import docker.errors
import pytest

from tests.fixtures import (
    BASE_IMAGE,
    RESULTS_DIR,
    Dataset,
    containers_of,
    finish,
    run_harbor,
    start_run,
    wait_for_sandboxes,
)

pytestmark = pytest.mark.docker

#: Long enough to kill its worker in the middle, short enough to finish when resumed.
SLOW_SOLUTION = "sleep 6\necho 1 > /tmp/answer\n"


@pytest.fixture
def dataset(harbor_dataset: Dataset) -> Dataset:
    return harbor_dataset


def wait_for_process(container: Any, command: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(docker.errors.APIError):
            if any(row[-1] == command for row in container.top()["Processes"] or []):
                return
        time.sleep(0.1)
    pytest.fail(f"{command!r} did not start in the sandbox within 60 s")


def test_a_worker_killed_mid_episode_leaves_a_failure_row_and_resume_completes_it(
    pytester: pytest.Pytester, dataset: Dataset, docker_client: docker.DockerClient
) -> None:
    dataset.task("slow", solve_sh=SLOW_SOLUTION)
    for name in ("quick-a", "quick-b", "quick-c"):
        dataset.task(name)
    run = start_run(dataset, "-n", "2", f"--harbor-results-dir={RESULTS_DIR}")
    wait_for_sandboxes(docker_client, dataset, ["slow"], run)
    (container,) = containers_of(docker_client, dataset.name, "slow")
    # A sandbox may start while its worker still runs the trial before: wait for solve.sh.
    wait_for_process(container, "sleep 6")
    owner = container.labels["pytest-harbor.owner"]  # type: ignore[attr-defined]
    worker = int(owner.split(":")[1])
    assert worker != run.pid  # a worker's sandbox, not the controller's
    os.kill(worker, signal.SIGKILL)
    output = finish(run)
    assert run.returncode == 1, output
    results = pytester.path / RESULTS_DIR

    (failure,) = dataset.failures(results)
    assert (failure["task_id"], failure["failure_kind"], failure["stage"], failure["retry"]) == (
        "slow",
        "harbor:worker_died",
        "turn",
        True,
    )
    assert "reward" not in failure
    rows = dataset.rows(results)
    assert sorted(row["task_id"] for row in rows) == ["quick-a", "quick-b", "quick-c"]
    run_id = json.loads((dataset.results_folder(results) / "rollouts_manifest.json").read_text())[
        "run_id"
    ]
    assert (
        docker_client.containers.list(all=True, filters={"label": f"pytest-harbor.run={run_id}"})
        == []
    )
    assert dataset.summary(results)["counts"]["no_result"] == 1

    resumed = run_harbor(pytester, dataset, "--harbor-resume")
    resumed.assert_outcomes(passed=1, deselected=3)
    resumed.stdout.fnmatch_lines(["resumed: 3 episode(s) kept from the earlier run*"])
    after = dataset.rows(results)
    assert sorted(row["task_id"] for row in after) == ["quick-a", "quick-b", "quick-c", "slow"]
    assert after[:3] == rows  # kept as they were
    assert dataset.failures(results) == []
    summary = dataset.summary(results)
    assert summary["counts"]["passed"] == 4
    assert sorted(
        (episode["task_id"], episode["from_earlier_run"]) for episode in summary["episodes"]
    ) == [("quick-a", True), ("quick-b", True), ("quick-c", True), ("slow", False)]


def test_resume_keeps_scored_and_terminal_episodes_and_retries_the_rest(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task("hello")
    dataset.task("zero", test_sh="echo 0 > /logs/verifier/reward.txt\n")
    dataset.task(
        "refused",
        toml=f'[agent]\ntimeout_sec = 30000\n[environment]\ndocker_image = "{BASE_IMAGE}"\n',
    )
    dataset.task(
        "no-image",
        toml='[environment]\ndocker_image = "pytest-harbor-test/no-such-image:1"\n',
    )
    settings = ("--harbor-set=enforce_task_timeouts=false", "--harbor-set=image_pull_retries=0")
    first = run_harbor(pytester, dataset, *settings, "-k", "not hello")
    first.assert_outcomes(failed=1, errors=2, deselected=1)
    results = pytester.path / RESULTS_DIR
    (zero_row,) = dataset.rows(results)
    failures = {row["task_id"]: row for row in dataset.failures(results)}
    assert {task: (row["failure_kind"], row["retry"]) for task, row in failures.items()} == {
        "refused": ("harbor:budget_refused", False),
        "no-image": ("harbor:sandbox_start_failed", True),
    }

    second = run_harbor(pytester, dataset, *settings, "--harbor-resume")
    # hello (never run) and no-image (a failure worth retrying) run; the others do not.
    second.assert_outcomes(passed=1, errors=1, deselected=2)
    rows = dataset.rows(results)
    assert sorted(row["task_id"] for row in rows) == ["hello", "zero"]
    assert rows[0] == zero_row  # a reward of 0 is a result: kept, not rerun
    after = {row["task_id"]: row for row in dataset.failures(results)}
    assert sorted(after) == ["no-image", "refused"]  # each episode once
    assert after["refused"] == failures["refused"]
    assert after["no-image"]["run_id"] != failures["no-image"]["run_id"]
    counts = dataset.summary(results)["counts"]
    assert (counts["passed"], counts["failed"], counts["no_result"]) == (1, 1, 2)

    # Every path of the summary resolves from its own folder, wherever the results go.
    moved = pytester.path / "elsewhere" / "moved"
    shutil.move(results, moved)
    folder = dataset.results_folder(moved)
    summary = json.loads((folder / "rollouts_run_summary.json").read_text())
    paths = [*summary["files"].values(), *summary["all_files"]]
    for episode in summary["episodes"]:
        for logs in episode.get("logs", []):
            paths += [path for key, path in logs.items() if key != "step" and path]
    assert "verifier/hello__r0/test-stdout.txt" in paths
    assert "verifier/zero__r0/reward.txt" in paths
    for path in paths:
        assert not os.path.isabs(path) and (folder / path).exists(), path


def test_resume_refuses_a_run_with_other_settings_or_changed_tasks(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    task = dataset.task("hello")
    run_harbor(pytester, dataset).assert_outcomes(passed=1)
    results = pytester.path / RESULTS_DIR
    rows = dataset.rows(results)

    other = run_harbor(pytester, dataset, "--harbor-resume", "--harbor-set=verifier_grace_s=5")
    assert other.ret == pytest.ExitCode.USAGE_ERROR
    other.stderr.fnmatch_lines(
        [
            f"ERROR: --harbor-resume: no run of {dataset.name} in * matches this one; the "
            "latest, *-oracle, differs:",
            "  setting verifier_grace_s: 30.0 then, 5.0 now",
            "run with the same targets, agent and settings, or without --harbor-resume*",
        ]
    )
    (task / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    changed = run_harbor(pytester, dataset, "--harbor-resume", "--harbor-repeats=2")
    assert changed.ret == pytest.ExitCode.USAGE_ERROR
    changed.stderr.fnmatch_lines(["  repeats: 1 then, 2 now", "  task folder hello changed *"])
    assert dataset.rows(results) == rows  # a refused resume touches nothing


def test_resume_refuses_a_changed_dataset_toml(pytester: pytest.Pytester, dataset: Dataset) -> None:
    dataset.task("hello")
    run_harbor(pytester, dataset).assert_outcomes(passed=1)
    manifest = json.loads(
        (dataset.results_folder(pytester.path / RESULTS_DIR) / "rollouts_manifest.json").read_text()
    )
    assert manifest["dataset_config_digest"] is None
    assert manifest["pytest_harbor_version"]
    (dataset.path / "dataset.toml").write_text("[gym.defaults]\ntimeout_multiplier = 2.0\n")
    refused = run_harbor(pytester, dataset, "--harbor-resume")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["  dataset.toml: none then, * now"])


def test_resume_refuses_results_without_a_manifest(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task("hello")
    run_harbor(pytester, dataset).assert_outcomes(passed=1)
    (dataset.results_folder(pytester.path / RESULTS_DIR) / "rollouts_manifest.json").unlink()
    result = run_harbor(pytester, dataset, "--harbor-resume")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*the latest, *, differs:", "  it has no rollouts_manifest.json, so nothing says which*"]
    )


def test_the_backstop_removes_the_sandbox_and_reports_the_item(
    pytester: pytest.Pytester, dataset: Dataset, docker_client: docker.DockerClient
) -> None:
    dataset.task("stuck", solve_sh="sleep 120\n")
    dataset.task("fine")
    # A tighter backstop than the budget's, as a conftest.py can set one.
    pytester.makeconftest(
        textwrap.dedent(
            """
            import pytest

            def pytest_collection_modifyitems(items):
                for item in items:
                    if "stuck" in item.nodeid:
                        item.add_marker(pytest.mark.timeout(3), append=False)
            """
        )
    )
    result = pytester.runpytest_subprocess(
        f"--harbor-dataset={dataset.path}", f"--harbor-results-dir={RESULTS_DIR}"
    )
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*the item ran past its backstop of 3 s (pytest-timeout)*"])
    assert result.duration < 60
    (failure,) = dataset.failures(pytester.path / RESULTS_DIR)
    assert (failure["task_id"], failure["failure_kind"]) == ("stuck", "harbor:episode_timeout")
    assert containers_of(docker_client, dataset.name, "stuck") == []


def test_every_item_carries_a_backstop_from_its_budget(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task(
        "budgeted",
        toml=(
            "[agent]\ntimeout_sec = 100\n[verifier]\ntimeout_sec = 50\n"
            f'[environment]\ndocker_image = "{BASE_IMAGE}"\nbuild_timeout_sec = 200\n'
        ),
    )
    items, _ = pytester.inline_genitems(f"--harbor-dataset={dataset.path}")
    (item,) = items
    marker = item.get_closest_marker("timeout")
    assert marker is not None
    # build 200 + (worst case (300 + 100 + 50 + 30 + (900 + 180) x 3) + the copies out at
    # their caps (reward files 10 + 10, the verifier's folder 60, the artifacts 120) +
    # cleanup 180) for the attempt and each of the 2 retries agent_outcome_policy may make
    # by default, the pauses before them (30 s, 60 s), and 60
    assert marker.args == (200 + (480 + 3240 + 200 + 180) * 3 + 30 + 60 + 60,)


def test_the_summary_gives_each_episode_a_status(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task("good")
    dataset.task("bad", test_sh="echo 0 > /logs/verifier/reward.txt\n")
    dataset.task("unvalidated", solve_sh=None)
    dataset.task("skipped-by-user")
    pytester.makeconftest(
        textwrap.dedent(
            """
            import pytest

            def pytest_collection_modifyitems(items):
                for item in items:
                    if "skipped-by-user" in item.nodeid:
                        item.add_marker(pytest.mark.skip(reason="not today"))
            """
        )
    )
    result = run_harbor(pytester, dataset, "-k", "not never-selected")
    result.assert_outcomes(passed=1, failed=1, skipped=2)
    result.stdout.fnmatch_lines(
        [
            f"{dataset.name}: 4 episodes, mean reward 0.500 (1 passed, 1 failed, 0 masked, "
            "0 no result); 2 skipped"
        ]
    )
    episodes = {
        episode["task_id"]: episode
        for episode in dataset.summary(pytester.path / RESULTS_DIR)["episodes"]
    }
    assert {task: episode["status"] for task, episode in episodes.items()} == {
        "good": "passed",
        "bad": "failed",
        "unvalidated": "skipped",
        "skipped-by-user": "skipped",
    }
    assert episodes["skipped-by-user"]["skip_reason"] == "not today"
    assert episodes["bad"]["reward"] == 0.0
