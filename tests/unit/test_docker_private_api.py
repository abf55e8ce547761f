"""The private names of docker-py the docker provider relies on (each used in one
function only): this fails when an upgrade of docker-py takes one away."""

from __future__ import annotations

import inspect

import docker

from pytest_harbor.sandboxes.docker import archive


def test_the_archive_call_finds_what_it_uses_in_docker_py() -> None:
    used = (
        "_get",
        "_url",
        "_raise_for_status",
        "_get_raw_response_socket",
        "_disable_socket_timeout",
    )
    source = inspect.getsource(archive.open_archive)
    for name in used:
        assert f"api.{name}(" in source
        assert callable(getattr(docker.APIClient, name, None)), name
