"""Crash safety under chaos, bounded: a few rounds of a run killed (SIGKILL to the
controller or a worker) at a random moment, each followed by the checks and a resume that
completes the set (tests/chaos.py). The seed is printed on failure and can be set with
HARBOR_CHAOS_SEED; bench/chaos.py runs many more rounds."""

from __future__ import annotations

import os
import random
import secrets

import docker
import pytest

from tests.chaos import ChaosTally, chaos_dataset, chaos_round
from tests.fixtures import BASE_IMAGE, Dataset

pytestmark = pytest.mark.docker

ROUNDS = 3
TASKS = 8


def test_kills_at_random_moments_leak_nothing_lose_nothing_and_write_nothing_twice(
    dataset: Dataset, docker_client: docker.DockerClient
) -> None:
    seed = int(os.environ.get("HARBOR_CHAOS_SEED") or secrets.randbelow(2**32))
    rng = random.Random(seed)
    tasks = chaos_dataset(dataset.path, TASKS, seed, BASE_IMAGE)
    results = dataset.path.parent / "results"
    tally = ChaosTally()
    for _ in range(ROUNDS):
        chaos_round(docker_client, dataset.path, results, tasks, rng, tally)
    assert tally.clean, f"seed {seed}: {tally.line()}\n" + "\n".join(tally.notes)
