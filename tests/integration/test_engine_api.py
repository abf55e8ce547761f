"""The episode engine from plain Python, without pytest's collection."""

from __future__ import annotations

import uuid
from pathlib import Path

import docker
import pytest

from pytest_harbor import Episode, load_task, make_harness, make_provider
from tests.fixtures import QUICKSTART

pytestmark = pytest.mark.docker


def test_an_episode_runs_from_plain_python(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    task = load_task(QUICKSTART / "greeting-workdir")
    labels = {"pytest-harbor.run": f"api-{uuid.uuid4().hex[:8]}"}
    episode = Episode(
        task,
        taskset="quickstart",
        repeat=0,
        harness=make_harness("oracle"),
        provider=make_provider("docker"),
        labels=labels,
        verifier_logs_dir=tmp_path / "verifier",
    )
    try:
        episode.seed()
        output = episode.run_turn(task.turns[0])
    finally:
        episode.cleanup()
    result = episode.result()
    assert output.result.reward == 1.0
    assert output.verifier_dir == tmp_path / "verifier"
    assert output.verifier_files["reward.txt"] == b"1\n"
    assert output.result.verifier_logs_dir == str(tmp_path / "verifier")
    assert (result.task_id, result.reward, result.solution_exit_code) == (
        "greeting-workdir",
        1.0,
        0,
    )
    timings = result.timings
    assert timings.seed_s is not None and timings.cleanup_s is not None
    assert timings.total_s is not None and timings.total_s >= timings.seed_s + timings.cleanup_s
    assert not docker_client.containers.list(
        all=True, filters={"label": "pytest-harbor.run=" + labels["pytest-harbor.run"]}
    )
