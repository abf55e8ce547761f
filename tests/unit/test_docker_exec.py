"""An exec started on the engine (stream.start_exec): created and started in one place,
its connection hijacked, its exit code read."""

from __future__ import annotations

import socket
from typing import Any, cast

import docker
import pytest

from pytest_harbor.sandboxes.docker.stream import start_exec


class _Api:
    """The two exec calls of an engine, recorded; `inspected` is what exec_inspect says."""

    def __init__(self, inspected: dict[str, Any] | None = None) -> None:
        self.created: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.inspected = inspected or {}
        self.ends = socket.socketpair()

    def exec_create(self, *args: Any, **kwargs: Any) -> dict[str, str]:
        self.created.append((args, kwargs))
        return {"Id": "e1"}

    def exec_start(self, exec_id: str, socket: bool) -> Any:
        assert exec_id == "e1" and socket
        return self.ends[0]

    def exec_inspect(self, exec_id: str) -> dict[str, Any]:
        assert exec_id == "e1"
        return self.inspected


def test_an_exec_is_created_with_its_streams_user_folder_and_environment() -> None:
    api = _Api()
    started = start_exec(
        cast(docker.APIClient, api),
        "c1",
        ("cat", "-"),
        user="1000",
        stdin=True,
        workdir="/app",
        env={"A": "1", "B": "two"},
    )
    assert started.id == "e1"
    assert api.created == [
        (
            ("c1", ["cat", "-"]),
            {
                "stdout": True,
                "stderr": True,
                "stdin": True,
                "user": "1000",
                "workdir": "/app",
                "environment": ["A=1", "B=two"],
            },
        )
    ]
    started.connection.send(b"hi")
    assert api.ends[1].recv(2) == b"hi"
    started.connection.close()
    api.ends[1].close()


@pytest.mark.parametrize(
    ("inspected", "code"),
    [
        ({"Running": False, "ExitCode": 3}, 3),
        ({"Running": False, "ExitCode": 0}, 0),
        ({"Running": True, "ExitCode": 0}, None),
        ({"Running": False, "ExitCode": None}, None),
        ({}, None),
    ],
)
def test_the_exit_code_is_known_only_once_the_command_ended(
    inspected: dict[str, Any], code: int | None
) -> None:
    api = _Api(inspected)
    started = start_exec(cast(docker.APIClient, api), "c1", ["true"], user="")
    assert api.created[0][1]["stdin"] is False and api.created[0][1]["environment"] == []
    assert started.exit_code() == code
    started.connection.close()
    api.ends[1].close()
