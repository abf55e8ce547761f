"""Crash safety on the real engine. A run killed outright (SIGKILL to the controller and
every worker at once) leaves nothing on the engine, with no later run to clean up: each
process's watchdog removes its containers, networks and volumes within seconds, and a live
run beside it loses nothing. An engine killed and started again mid-run costs only the
episodes it was running; one that stays down stops the run with one message."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from pytest_harbor.labels import RUN_LABEL, TASK_LABEL
from pytest_harbor.sandboxes.docker.watchdog import WATCHDOG_LABEL, prepare_helper_image
from tests.fixtures import (
    BASE_IMAGE,
    RESULTS_DIR,
    Dataset,
    containers_of,
    finish,
    start_run,
    wait_for_sandboxes,
)
from tests.second_engine import SecondEngine, image_archive

pytestmark = pytest.mark.docker

#: The guarantee is 60 s; the watchdogs take a few. The check ends well before the live
#: run beside it does (its end-of-run sweep would remove a dead run's leftovers too).
WITHIN_S = 20.0
HOLD = "sleep 300\n"
COMPOSE = """\
services:
  main:
    depends_on: [helper]
  helper:
    image: busybox:musl
    command: ["/bin/busybox", "sleep", "300"]
    volumes: [data:/data]
volumes:
  data:
"""


def left_of(client: docker.DockerClient, run_id: str) -> list[str]:
    """Everything on the engine labelled with the run: containers (stopped too), networks,
    volumes, and its processes' watchdogs."""
    label = {"label": f"{RUN_LABEL}={run_id}"}
    found = [
        f"container {c.name}"
        for c in client.containers.list(all=True, filters=label, ignore_removed=True)
    ]
    found += [f"network {n.name}" for n in client.networks.list(filters=label)]
    found += [f"volume {v.name}" for v in client.volumes.list(filters=label)]
    watchdogs = client.containers.list(
        all=True, filters={"label": WATCHDOG_LABEL}, ignore_removed=True
    )
    found += [f"watchdog {w.name}" for w in watchdogs if run_id in w.labels.get(WATCHDOG_LABEL, "")]
    return found


@pytest.fixture
def second(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dataset]:
    folder = tmp_path_factory.mktemp("alive") / "alive"
    folder.mkdir()
    yield Dataset(folder)


def test_a_run_killed_outright_leaves_nothing_and_a_live_run_beside_it_loses_nothing(
    dataset: Dataset, second: Dataset, docker_client: docker.DockerClient
) -> None:
    dataset.task("plain-a", solve_sh=HOLD)
    composed = dataset.task("composed", solve_sh=HOLD, dockerfile=f"FROM {BASE_IMAGE}\n")
    (composed / "environment" / "docker-compose.yaml").write_text(COMPOSE)
    dataset.task(
        "listed",
        solve_sh=HOLD,
        toml=f'[environment]\ndocker_image = "{BASE_IMAGE}"\n'
        'network_mode = "allowlist"\nallowed_hosts = ["example.test"]\n',
    )
    second.task("survivor", solve_sh="sleep 40\necho 1 > /tmp/answer\n")
    alive = start_run(second, f"--harbor-results-dir={RESULTS_DIR}")
    doomed = start_run(dataset, "-n", "3", f"--harbor-results-dir={RESULTS_DIR}")
    try:
        wait_for_sandboxes(docker_client, dataset, ["plain-a", "composed", "listed"], doomed)
        wait_for_sandboxes(docker_client, second, ["survivor"], alive)
        (sandbox,) = containers_of(docker_client, dataset.name, "plain-a")
        run_id = sandbox.labels[RUN_LABEL]
        assert left_of(docker_client, run_id)
        os.killpg(doomed.pid, signal.SIGKILL)
        doomed.wait()
        started = time.monotonic()
        while left_of(docker_client, run_id) and time.monotonic() - started < WITHIN_S:
            time.sleep(0.5)
        assert left_of(docker_client, run_id) == [], f"left after {WITHIN_S:g} s"
        assert alive.poll() is None, "the live run ended before the check did"
    finally:
        if doomed.poll() is None:
            os.killpg(doomed.pid, signal.SIGKILL)
    output = finish(alive)
    assert alive.returncode == 0, output[-3000:]
    assert "1 passed" in output


# ---------------------------------------------------------------- the engine restarted


@pytest.fixture
def lone_engine(docker_client: docker.DockerClient) -> Iterator[SecondEngine]:
    """An engine of the test's own, with the images a run needs (the run reaches only it,
    through DOCKER_HOST, so nothing comes from another engine)."""
    engine = SecondEngine().start()
    try:
        client = engine.client()
        for image in (BASE_IMAGE, "busybox:musl", prepare_helper_image()):
            client.images.load(b"".join(image_archive(docker_client, image)))
        yield engine
    finally:
        engine.stop()


def holding_dataset(dataset: Dataset, count: int) -> list[str]:
    names = [f"t{number}" for number in range(count)]
    for name in names:
        dataset.task(name, solve_sh="sleep 3; echo 1 > /tmp/answer\n")
    return names


def run_on(engine: SecondEngine, dataset: Dataset, *args: str) -> subprocess.Popen[str]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DOCKER_HOST", engine.url)
        return start_run(dataset, "-n", "2", f"--harbor-results-dir={RESULTS_DIR}", *args)


def wait_for_a_sandbox(engine: SecondEngine, run: subprocess.Popen[str], count: int = 1) -> None:
    """Until `count` sandboxes of the run are up (then a second, for a solve.sh to run)."""
    client = engine.client()
    deadline = time.monotonic() + 120
    while len(client.containers.list(filters={"label": TASK_LABEL}, ignore_removed=True)) < count:
        assert run.poll() is None, run.stdout.read()  # type: ignore[union-attr]
        assert time.monotonic() < deadline, f"not {count} sandboxes within 120 s"
        time.sleep(0.1)
    time.sleep(1.0)  # its solve.sh is running


def test_an_engine_restarted_mid_run_costs_only_the_episodes_it_was_running(
    dataset: Dataset, lone_engine: SecondEngine
) -> None:
    tasks = holding_dataset(dataset, 6)
    run = run_on(lone_engine, dataset)
    # The engine dies when it holds, besides the two sandboxes agents work in, one or
    # two started ahead of their episodes (how many a loaded machine leaves there at
    # any moment): those episodes had not begun, and must not be lost with them.
    wait_for_a_sandbox(lone_engine, run, count=3)
    lone_engine.kill()
    time.sleep(4)
    lone_engine.restart()
    output = finish(run)
    folder = dataset.results_folder(dataset.path.parent / RESULTS_DIR)
    rows = [json.loads(line) for line in (folder / "rollouts.jsonl").read_text().splitlines()]
    failures = [
        json.loads(line) for line in (folder / "rollouts_failures.jsonl").read_text().splitlines()
    ]
    # What the engine was running then has no result (it is run again on resume): the
    # two episodes agents worked in, no more; the rest waited for the engine and ran
    # once it answered again.
    assert 1 <= len(failures) <= 2, output
    assert {row["failure_kind"] for row in failures} == {"harbor:sandbox_lost"}, output
    assert all(row["retry"] for row in failures)
    assert rows and all(row["reward"] == 1.0 for row in rows), output
    assert {row["task_id"] for row in rows} | {row["task_id"] for row in failures} == set(tasks)
    # Nothing of the run is left on the engine, and nothing crashed on the way out.
    left = lone_engine.client().containers.list(
        all=True, filters={"label": TASK_LABEL}, ignore_removed=True
    )
    assert left == [], output
    assert "Traceback" not in output and "INTERNALERROR" not in output, output
    # The resume runs what was lost, and only that.
    resumed = finish(run_on(lone_engine, dataset, "--harbor-resume"))
    rows = [json.loads(line) for line in (folder / "rollouts.jsonl").read_text().splitlines()]
    assert sorted(row["task_id"] for row in rows) == sorted(tasks), resumed


def test_an_engine_that_does_not_come_back_stops_the_run_with_one_message(
    dataset: Dataset, lone_engine: SecondEngine
) -> None:
    holding_dataset(dataset, 6)
    run = run_on(lone_engine, dataset, "--harbor-set=engine_recovery_timeout_s=5")
    wait_for_a_sandbox(lone_engine, run)
    lone_engine.kill()
    started = time.monotonic()
    output = finish(run)
    assert time.monotonic() - started < 60, output
    assert run.returncode == 2, output
    assert "Interrupted: " in output and "has not answered for 5 s" in output, output
    assert "--harbor-resume goes on from here" in output
    assert "Traceback" not in output and "INTERNALERROR" not in output, output


# ---------------------------------------------------------------- a full disk


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A results folder on a file system of 512 KiB of its own."""
    folder = tmp_path / "small"
    folder.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(folder)],
        check=True,
        capture_output=True,
    )
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=False, capture_output=True)


def test_a_full_results_disk_ends_the_episodes_it_cannot_hold_and_keeps_what_was_written(
    dataset: Dataset, small_disk: Path
) -> None:
    # Each verifier prints 150 KB, which its folder in the results keeps.
    for number in range(6):
        dataset.task(
            f"t{number}",
            test_sh="head -c 150000 /dev/zero | tr '\\0' x; echo\n"
            "echo 1 > /logs/verifier/reward.txt\n",
        )
    run = start_run(dataset, f"--harbor-results-dir={small_disk}", "--harbor-report=none")
    output = finish(run)
    assert run.returncode == 1, output
    assert "INTERNALERROR" not in output and "Traceback" not in output, output
    assert "harbor:disk_full" in output, output
    assert f"no space left on the device of {small_disk}" in output, output
    assert "not written: " in output
    # The rows written before the disk filled are whole, each once, each a pass.
    folder = dataset.results_folder(small_disk)
    lines = (folder / "rollouts.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert 1 <= len(rows) < 6, output
    assert len({row["task_id"] for row in rows}) == len(rows)
    assert all(row["reward"] == 1.0 for row in rows)


def test_a_full_engine_disk_ends_the_episodes_it_cannot_start(
    dataset: Dataset, docker_client: docker.DockerClient
) -> None:
    engine = SecondEngine(data_size="700m").start()
    try:
        client = engine.client()
        for image in (BASE_IMAGE, "busybox:musl", prepare_helper_image()):
            client.images.load(b"".join(image_archive(docker_client, image)))
        # What is left of the engine's disk is filled from this machine.
        with (engine.root / "data" / "fill").open("wb") as fill, contextlib.suppress(OSError):
            while True:
                fill.write(bytes(1 << 20))
                fill.flush()
        holding_dataset(dataset, 2)
        output = finish(run_on(engine, dataset, "--harbor-set=engine_recovery_timeout_s=5"))
        assert "harbor:disk_full" in output, output
        assert "the engine's disk is full" in output and "no space left on device" in output
        assert "INTERNALERROR" not in output and "Traceback" not in output, output
        folder = dataset.results_folder(dataset.path.parent / RESULTS_DIR)
        failures = [
            json.loads(line)
            for line in (folder / "rollouts_failures.jsonl").read_text().splitlines()
        ]
        assert {row["failure_kind"] for row in failures} == {"harbor:disk_full"}, output
        assert all(row["retry"] for row in failures)
    finally:
        engine.stop()
