"""A run killed outright (SIGKILL to the controller and every worker at once) leaves
nothing on the engine, with no later run to clean up: each process's watchdog removes its
containers, networks and volumes within seconds, and a live run beside it loses nothing."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import docker
import docker.errors
import pytest

from pytest_harbor.labels import RUN_LABEL
from pytest_harbor.sandboxes.docker.watchdog import WATCHDOG_LABEL
from tests.fixtures import (
    BASE_IMAGE,
    RESULTS_DIR,
    Dataset,
    containers_of,
    finish,
    start_run,
    wait_for_sandboxes,
)

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
