"""No sandbox outlives its run: not after a normal run, not after Ctrl-C or SIGTERM."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import docker
import docker.errors
import pytest

from pytest_harbor.labels import OWNER_LABEL, RUN_LABEL
from pytest_harbor.run.reaper import (
    owner_of_this_process,
    reap_orphans,
)
from pytest_harbor.sandboxes import make_provider
from tests.fixtures import (
    BASE_IMAGE,
    Dataset,
    containers_of,
    finish,
    start_run,
    wait_for_sandboxes,
)

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
    # The HTML report is written beside it, as for a run that ended.
    report = (dataset.results_folder(results) / "report.html").read_text()
    assert "The run was interrupted" in report and "harbor:interrupted</strong>" in report
    # Both say how to go on.
    assert "--harbor-resume runs only those" in report
    assert "the same command with --harbor-resume runs only those" in output


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
    # Nor a network of its own (sandboxes share the engine's isolated one, kept).
    results = dataset.results_folder(dataset.path.parent / "results")
    run_id = json.loads((results / "rollouts_manifest.json").read_text())["run_id"]
    assert docker_client.networks.list(filters={"label": f"pytest-harbor.run={run_id}"}) == []


def test_results_land_next_to_where_pytest_ran(dataset: Dataset, docker_client: object) -> None:
    dataset.task("here")
    run = start_run(dataset)
    output = finish(run)
    assert run.returncode == 0, output
    assert (
        Path(dataset.path.parent)
        / "results/harbor/validation"
        / dataset.name
        / "latest"
        / "rollouts.jsonl"
    ).is_file()


def test_the_reaper_removes_what_a_gone_process_left_on_the_engine(
    docker_client: docker.DockerClient,
) -> None:
    """The docker provider's side of the reaper: a container whose owner ended goes, one
    whose owner lives stays."""
    ended = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=-1)
    stat = Path(f"/proc/{ended.pid}/stat").read_text()
    start = stat[stat.rindex(")") + 2 :].split()[19]
    ended.communicate(b"")
    run_id = f"reaper-test-{uuid.uuid4().hex[:8]}"
    owners = {
        "gone": ":".join(
            [socket.gethostname(), str(ended.pid), start, *owner_of_this_process().split(":")[3:]]
        ),
        "live": owner_of_this_process(),
    }
    # Created, not started: a reaper lists stopped containers too, and another run's
    # reaper may take the dead owner's container at any moment.
    containers = {
        name: docker_client.containers.create(
            BASE_IMAGE, ["sleep", "300"], labels={RUN_LABEL: run_id, OWNER_LABEL: owner}
        )
        for name, owner in owners.items()
    }
    try:
        reap_orphans(make_provider("docker"))
        # Another run's reaper may be removing it at the same time: the engine then
        # reports the removal as in progress, and it ends a moment later.
        deadline = time.monotonic() + 30
        while True:
            left = {
                container.labels[OWNER_LABEL]
                for container in docker_client.containers.list(
                    all=True, filters={"label": f"{RUN_LABEL}={run_id}"}, ignore_removed=True
                )
            }
            if left == {owners["live"]} or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert left == {owners["live"]}
    finally:
        for container in containers.values():
            with contextlib.suppress(docker.errors.APIError):  # gone, or going
                container.remove(force=True)


def test_an_interrupt_is_recorded_even_when_pytest_fails_to_report_it(
    dataset: Dataset, docker_client: docker.DockerClient
) -> None:
    """pytest turns an interrupt into an internal error when printing its traceback fails
    (as it does for a frame without a line number); the episode still gets its row."""
    dataset.task("hang-a", solve_sh=HANGING_SOLUTION)
    (dataset.path.parent / "conftest.py").write_text(
        "def pytest_keyboard_interrupt(excinfo):\n"
        "    raise TypeError('the traceback could not be printed')\n"
    )
    run = start_run(dataset)
    wait_for_sandboxes(docker_client, dataset, ["hang-a"], run)
    run.send_signal(signal.SIGINT)
    output = finish(run)
    assert run.returncode != 0, output
    (failure,) = dataset.failures(dataset.path.parent / "results")
    assert failure["failure_kind"] == "harbor:interrupted", output
    assert dataset.summary(dataset.path.parent / "results")["interrupted"] is True
    assert containers_of(docker_client, dataset.name, "hang-a") == []


def test_the_reaper_leaves_the_sandboxes_of_another_pid_namespace(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    """A run in its own PID namespace on this host (a CI container on the host network)
    labels its sandbox with a pid that means nothing here: the reaper leaves it alone."""
    run_id = f"other-ns-{uuid.uuid4().hex[:8]}"
    script = tmp_path / "other.py"
    script.write_text(
        "import docker\n"
        "from pytest_harbor.run.reaper import owner_of_this_process\n"
        "from pytest_harbor.labels import OWNER_LABEL, RUN_LABEL\n"
        "client = docker.from_env()\n"
        f"client.containers.create({BASE_IMAGE!r}, ['sleep', '300'],\n"
        f"    labels={{RUN_LABEL: {run_id!r}, OWNER_LABEL: owner_of_this_process()}})\n"
        "print(owner_of_this_process())\n"
    )
    made = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(script)],
        capture_output=True,
        text=True,
        check=True,
    )
    other_owner = made.stdout.strip()
    assert other_owner.split(":")[1] == "1"  # pid 1 of its namespace: here, init
    try:
        reap_orphans(make_provider("docker"))
        left = docker_client.containers.list(
            all=True, filters={"label": f"{RUN_LABEL}={run_id}"}, ignore_removed=True
        )
        assert [container.labels[OWNER_LABEL] for container in left] == [other_owner]
    finally:
        for container in docker_client.containers.list(
            all=True, filters={"label": f"{RUN_LABEL}={run_id}"}, ignore_removed=True
        ):
            container.remove(force=True)


def test_a_second_run_on_the_same_results_folder_stops_at_once(
    dataset: Dataset, docker_client: docker.DockerClient
) -> None:
    dataset.task("long", solve_sh=HANGING_SOLUTION)
    first = start_run(dataset)
    try:
        wait_for_sandboxes(docker_client, dataset, ["long"], first)
        second = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                f"--harbor-dataset={dataset.path}",
                "-p",
                "no:cacheprovider",
            ],
            cwd=dataset.path.parent,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == pytest.ExitCode.USAGE_ERROR, second.stdout + second.stderr
        folder = dataset.path.parent / "results" / "harbor" / "validation" / dataset.name
        assert f"{folder} is being written by another run (run " in second.stderr
        assert f"pid {first.pid} on {socket.gethostname()}" in second.stderr
        # The second run touched nothing of the first's.
        assert containers_of(docker_client, dataset.name, "long")
    finally:
        first.send_signal(signal.SIGINT)
        finish(first)
