"""Fixtures shared by the integration tests: sandboxes of the docker provider."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import docker
import pytest

from pytest_harbor.sandboxes import SandboxSpec
from pytest_harbor.sandboxes.docker import DockerProvider, DockerSandbox
from tests.fixtures import BASE_IMAGE, StartSandbox


@pytest.fixture
def labels() -> dict[str, str]:
    return {"pytest-harbor.run": f"test-{uuid.uuid4().hex[:8]}"}


@pytest.fixture
def start(docker_client: docker.DockerClient, labels: dict[str, str]) -> Iterator[StartSandbox]:
    """Starts sandboxes from a spec's fields (the base image and a test's labels unless
    given) and removes them when the test ends."""
    provider = DockerProvider()
    started: list[DockerSandbox] = []

    def start_sandbox(**spec: object) -> DockerSandbox:
        spec.setdefault("image", BASE_IMAGE)
        spec.setdefault("labels", labels)
        sandbox = provider.start(SandboxSpec(**spec))  # type: ignore[arg-type]
        started.append(sandbox)
        return sandbox

    yield start_sandbox
    for sandbox in started:
        sandbox.stop()
    # Its watchdog, which holds the border for its sandboxes, goes.
    provider.unwatch()
