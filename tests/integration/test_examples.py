"""The example datasets: every task passes with the oracle and fails with nop."""

from __future__ import annotations

import shutil
import uuid

import docker
import pytest

from tests.fixtures import QUICKSTART, REPO_ROOT, Dataset, containers_of

pytestmark = pytest.mark.docker

TASKS = ["fizzbuzz-report", "greeting-workdir", "hello-world", "word-count"]


@pytest.fixture
def quickstart(pytester: pytest.Pytester, docker_client: docker.DockerClient) -> Dataset:
    # A copy under a name of its own, so runs of this file at once keep apart.
    copy = pytester.path / f"quickstart-{uuid.uuid4().hex[:8]}"
    shutil.copytree(QUICKSTART, copy)
    return Dataset(copy)


def test_oracle_passes_every_task_under_xdist(
    pytester: pytest.Pytester, quickstart: Dataset, docker_client: docker.DockerClient
) -> None:
    result = pytester.runpytest(f"--harbor-dataset={quickstart.path}", "-n", "2")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(
        [
            f"{quickstart.name}: 4 episodes, mean reward 1.000 "
            "(4 passed, 0 failed, 0 masked, 0 no result)"
        ]
    )
    rows = quickstart.rows(pytester.path / "results")
    assert sorted(row["task_id"] for row in rows) == TASKS
    assert all(row["reward"] == 1.0 and row["solution_exit_code"] == 0 for row in rows)
    # Each row names the worker that ran it.
    assert {row["worker"] for row in rows} <= {"gw0", "gw1"}
    by_task = {row["task_id"]: row for row in rows}
    assert by_task["fizzbuzz-report"]["verifier_rewards"] == {"correctness": 1.0, "style": 1.0}
    for row in rows:
        logs = (
            pytester.path / "results/harbor/validation" / quickstart.name / "latest"
        ).resolve() / "verifier"
        assert row["verifier_logs_dir"] == str(logs / f"{row['task_id']}__r0")
    assert (logs / "fizzbuzz-report__r0" / "reward.json").is_file()
    assert (logs / "hello-world__r0" / "test-stdout.txt").read_text() == "hello.txt is right\n"
    for task in TASKS:
        assert containers_of(docker_client, quickstart.name, task) == []


def test_nop_fails_every_task(
    pytester: pytest.Pytester, quickstart: Dataset, docker_client: docker.DockerClient
) -> None:
    result = pytester.runpytest(f"--harbor-dataset={quickstart.path}", "--harbor-agent=nop")
    result.assert_outcomes(failed=4)
    rows = quickstart.rows(pytester.path / "results", validation=False)
    assert sorted((row["task_id"], row["reward"]) for row in rows) == [(t, 0.0) for t in TASKS]
    assert {row["worker"] for row in rows} == {"main"}
    for task in TASKS:
        assert containers_of(docker_client, quickstart.name, task) == []


ENVIRONMENTS = REPO_ROOT / "example_datasets" / "environments"
ENVIRONMENT_TASKS = ["loose-files", "separate-verifier", "service-healthcheck"]


@pytest.mark.parametrize("agent", ["oracle", "nop"])
def test_environments_example(
    pytester: pytest.Pytester, docker_client: docker.DockerClient, agent: str
) -> None:
    copy = pytester.path / f"environments-{uuid.uuid4().hex[:8]}"
    shutil.copytree(ENVIRONMENTS, copy)
    dataset = Dataset(copy)
    result = pytester.runpytest(f"--harbor-dataset={copy}", f"--harbor-agent={agent}", "-n", "2")
    rows = {
        row["task_id"]: row for row in dataset.rows(pytester.path / "results", agent == "oracle")
    }
    assert sorted(rows) == ENVIRONMENT_TASKS
    if agent == "oracle":
        result.assert_outcomes(passed=3)
        assert rows["separate-verifier"]["verifier_mode"] == "separate"
    else:
        result.assert_outcomes(failed=3)
        assert all(row["reward"] == 0.0 for row in rows.values())
    for task in ENVIRONMENT_TASKS:
        assert containers_of(docker_client, dataset.name, task) == []
