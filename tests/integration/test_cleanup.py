"""No sandbox outlives its run: not after a normal run, not after Ctrl-C or SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import docker
import pytest

from tests.fixtures import Dataset, containers_of

pytestmark = pytest.mark.docker

HANGING_SOLUTION = "echo 1 > /tmp/answer\nsleep 300\n"


def start_run(dataset: Dataset, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            f"--harbor-dataset={dataset.path}",
            "-p",
            "no:cacheprovider",
            *args,
        ],
        cwd=dataset.path.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal gives a command
    )


def wait_for_sandboxes(
    client: docker.DockerClient, dataset: Dataset, tasks: list[str], run: subprocess.Popen[str]
) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if all(containers_of(client, dataset.name, task) for task in tasks):
            return
        if run.poll() is not None:
            pytest.fail(f"the run ended before its sandboxes started:\n{run.stdout.read()}")  # type: ignore[union-attr]
        time.sleep(0.2)
    run.kill()
    pytest.fail("the sandboxes did not start within 120 s")


def finish(run: subprocess.Popen[str]) -> str:
    try:
        output, _ = run.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        run.kill()
        output, _ = run.communicate()
        pytest.fail(f"the run did not end within 120 s of the signal:\n{output}")
    return output


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
