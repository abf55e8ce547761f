"""No sandbox outlives its run: not after a normal run, not after Ctrl-C or SIGTERM."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import docker
import pytest

from tests.fixtures import Dataset, containers_of, finish, start_run, wait_for_sandboxes

pytestmark = pytest.mark.docker

HANGING_SOLUTION = "echo 1 > /tmp/answer\nsleep 300\n"


@pytest.mark.parametrize(
    ("signum", "workers", "whole_group"),
    [
        pytest.param(signal.SIGINT, 0, False, id="ctrl-c"),
        pytest.param(signal.SIGTERM, 0, False, id="sigterm"),
        pytest.param(signal.SIGINT, 2, True, id="ctrl-c-xdist"),
        pytest.param(signal.SIGINT, 2, False, id="sigint-controller-only-xdist"),
        pytest.param(signal.SIGTERM, 2, False, id="sigterm-controller-only-xdist"),
    ],
)
def test_interrupted_run_leaves_no_sandbox(
    dataset: Dataset,
    docker_client: docker.DockerClient,
    signum: signal.Signals,
    workers: int,
    whole_group: bool,
) -> None:
    tasks = ["hang-a", "hang-b"] if workers else ["hang-a"]
    for task in tasks:
        dataset.task(task, solve_sh=HANGING_SOLUTION)
    run = start_run(dataset, *(["-n", str(workers)] if workers else []))
    wait_for_sandboxes(docker_client, dataset, tasks, run)
    if whole_group:
        os.killpg(run.pid, signum)
    else:
        run.send_signal(signum)
    output = finish(run)
    assert run.returncode != 0, output
    left = {task: containers_of(docker_client, dataset.name, task) for task in tasks}
    assert left == {task: [] for task in tasks}, output
    # The episodes that were under way are in the failures file, for a resume to retry.
    results = dataset.path.parent / "results"
    failures = dataset.failures(results)
    assert sorted(row["task_id"] for row in failures) == tasks, output
    assert {(row["failure_kind"], row["retry"]) for row in failures} == {
        ("harbor:interrupted", True)
    }
    assert dataset.rows(results) == []
    summary = dataset.summary(results)
    assert summary["interrupted"] is True
    assert summary["counts"]["no_result"] == len(tasks)


def test_finished_run_leaves_no_sandbox(
    dataset: Dataset, docker_client: docker.DockerClient
) -> None:
    for task in ("one", "two", "three"):
        dataset.task(task)
    run = start_run(dataset, "-n", "2")
    output = finish(run)
    assert run.returncode == 0, output
    for task in ("one", "two", "three"):
        assert containers_of(docker_client, dataset.name, task) == []


def test_results_land_next_to_where_pytest_ran(dataset: Dataset, docker_client: object) -> None:
    dataset.task("here")
    run = start_run(dataset)
    output = finish(run)
    assert run.returncode == 0, output
    assert (
        Path(dataset.path.parent) / "results/harbor/validation" / dataset.name / "rollouts.jsonl"
    ).is_file()
