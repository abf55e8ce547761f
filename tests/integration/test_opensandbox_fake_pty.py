"""The fake's terminal sessions (tests/opensandbox_fake/pty.py), driven as a client of
execd's /pty drives them: httpx for the session, the websockets library's sync client
for its WebSocket in pipe mode. What it must show is what execd 1.0.19 does."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import docker
import httpx
import pytest
from websockets.exceptions import ConnectionClosed, ConnectionClosedOK, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.integration.test_opensandbox_fake import create_body, execd_client, processes
from tests.opensandbox_fake import FakeOpenSandbox, pty, websocket

pytestmark = pytest.mark.docker

KEY = "test-key"
TOKEN = "pty-s3cret"
AUTH = {"X-EXECD-ACCESS-TOKEN": TOKEN}
STDIN, STDOUT, STDERR = b"\x00", 0x01, 0x02


@pytest.fixture(scope="module")
def fake(docker_client: docker.DockerClient) -> Iterator[FakeOpenSandbox]:
    server = FakeOpenSandbox(docker_client, api_key=KEY)
    server.start()
    yield server
    server.stop()
    assert server.sandbox_containers() == []


@pytest.fixture(scope="module")
def api(fake: FakeOpenSandbox) -> Iterator[httpx.Client]:
    headers = {"OPEN-SANDBOX-API-KEY": KEY}
    with httpx.Client(base_url=f"http://{fake.domain}/v1", headers=headers, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def execd(api: httpx.Client) -> Iterator[httpx.Client]:
    """execd of a sandbox whose access token is on (every route asks for it)."""
    created = api.post("/sandboxes", json=create_body(env={"EXECD_ACCESS_TOKEN": TOKEN}))
    assert created.status_code == 202, created.text
    with execd_client(api, created.json()["id"], **AUTH) as client:
        yield client


# -- helpers a test of a client of /pty may use -----------------------------------------------


def open_session(execd: httpx.Client, **body: str) -> str:
    """A new session's id (POST /pty with `body`: cwd, command)."""
    made = execd.post("/pty", json=body)
    assert made.status_code == 201, made.text
    session_id: str = made.json()["session_id"]
    return session_id


def join(execd: httpx.Client, session_id: str, **query: str) -> ClientConnection:
    """The session's WebSocket (pipe mode unless `query` says otherwise), open; its
    close waits at most half a second for execd to end the connection (execd leaves it
    open after a close the client starts)."""
    url = httpx.URL(str(execd.base_url).replace("http://", "ws://", 1))
    address = url.join(f"pty/{session_id}/ws").copy_merge_params({"pty": "0", **query})
    return connect(
        str(address), additional_headers=AUTH, close_timeout=0.5, open_timeout=10, legacy=True
    )


def joined(execd: httpx.Client, session_id: str) -> ClientConnection:
    """join(), past execd's `connected` frame."""
    connection = join(execd, session_id)
    assert frame(connection) == {"type": "connected", "session_id": session_id, "mode": "pipe"}
    return connection


def frame(connection: ClientConnection, timeout: float = 10) -> dict[str, Any]:
    """The next message, a JSON frame."""
    message = connection.recv(timeout=timeout)
    assert isinstance(message, str) and message.endswith("\n"), message  # gorilla's WriteJSON
    decoded: dict[str, Any] = json.loads(message)
    return decoded


def until_exit(connection: ClientConnection, timeout: float = 20) -> tuple[bytes, bytes, int]:
    """stdout and stderr up to the `exit` frame, and its code; the connection then ends
    with a normal close."""
    out = err = b""
    deadline = time.monotonic() + timeout
    while True:
        message = connection.recv(timeout=max(0.1, deadline - time.monotonic()))
        if isinstance(message, str):
            ended = json.loads(message)
            assert ended["type"] == "exit", ended
            break
        assert message[0] in (STDOUT, STDERR), message
        if message[0] == STDOUT:
            out += message[1:]
        else:
            err += message[1:]
    with pytest.raises(ConnectionClosedOK) as closed:
        connection.recv(timeout=5)
    received = closed.value.rcvd
    assert received is not None and (received.code, received.reason) == (1000, "process exited")
    return out, err, ended["exit_code"]


def status(execd: httpx.Client, session_id: str) -> dict[str, Any]:
    answer = execd.get(f"/pty/{session_id}")
    assert answer.status_code == 200, answer.text
    decoded: dict[str, Any] = answer.json()
    return decoded


# -- tests ------------------------------------------------------------------------------------


def test_a_shell_in_pipe_mode_its_output_apart_and_its_exit(execd: httpx.Client) -> None:
    session_id = open_session(execd)
    assert str(uuid.UUID(session_id)) == session_id
    assert status(execd, session_id) == {
        "session_id": session_id,
        "running": False,  # nothing starts before the first connection
        "output_offset": 0,
    }
    with joined(execd, session_id) as connection:
        assert status(execd, session_id)["running"] is True
        connection.send(STDIN + b"echo hi; echo err >&2; exit 3\n")
        assert until_exit(connection) == (b"hi\n", b"err\n", 3)
    assert status(execd, session_id) == {
        "session_id": session_id,
        "running": False,
        "output_offset": len(b"hi\nerr\n"),
    }
    # A connection that finds the shell ended starts another.
    with joined(execd, session_id) as again:
        again.send(json.dumps({"type": "stdin", "data": "exit 0\n"}))
        assert until_exit(again) == (b"", b"", 0)


def test_a_round_trip_through_cat_and_the_frames_a_client_may_send(
    execd: httpx.Client,
) -> None:
    session_id = open_session(execd, command="cat")
    with joined(execd, session_id) as connection:
        payload = bytes(range(256)) * 64  # any bytes, more than one read's worth
        connection.send(STDIN + payload)
        echoed = b""
        while len(echoed) < len(payload):
            message = connection.recv(timeout=10)
            assert isinstance(message, bytes) and message[0] == STDOUT
            echoed += message[1:]
        assert echoed == payload
        connection.send(json.dumps({"type": "stdin", "data": "text\n"}))
        assert connection.recv(timeout=10) == b"\x01text\n"
        connection.send(json.dumps({"type": "ping"}))
        assert frame(connection) == {"type": "pong"}
        connection.send(json.dumps({"type": "resize", "cols": 100, "rows": 30}))  # ignored
        connection.send(json.dumps({"type": "dance"}))
        assert frame(connection) == {
            "type": "error",
            "error": 'unknown frame type "dance"',
            "code": "INVALID_FRAME",
        }
        connection.send(b"\x07ignored")  # only stdin goes from a client to execd
        connection.send("not json")  # execd ignores what it cannot read
        assert connection.ping().wait(5)  # RFC 6455 pings are answered
        connection.send(json.dumps({"type": "signal", "signal": "SIGKILL"}))
        assert until_exit(connection) == (b"", b"", -1)  # Go's code for a death by signal


def test_one_client_at_a_time_and_the_shell_outlives_it(execd: httpx.Client) -> None:
    session_id = open_session(execd, command="echo $$ && exec sleep 300")
    first = joined(execd, session_id)
    pid = first.recv(timeout=10)
    assert isinstance(pid, bytes) and pid[0] == STDOUT and pid[1:].strip().isdigit()
    with pytest.raises(InvalidStatus) as refused:
        join(execd, session_id)
    assert refused.value.response.status_code == 409
    body = json.loads(refused.value.response.body or b"")
    assert body["code"] == "ALREADY_CONNECTED"
    with pytest.raises(InvalidStatus) as still_refused:
        join(execd, session_id, takeover="1")  # takeover is not emulated
    assert still_refused.value.response.status_code == 409
    started = time.monotonic()
    first.close()
    # execd answers the close but leaves the connection open: the client ends it after
    # its close timeout.
    assert 0.4 < time.monotonic() - started < 5
    assert status(execd, session_id)["running"] is True
    assert "sleep 300" in processes(execd)
    with joined(execd, session_id) as second:  # free again, the same shell
        assert status(execd, session_id)["running"] is True
        deleted = execd.delete(f"/pty/{session_id}")
        assert (deleted.status_code, deleted.content) == (200, b"")
        # The attached client is told of the end of the group execd killed.
        assert until_exit(second) == (b"", b"", -1)
    assert "sleep 300" not in processes(execd)
    gone = execd.get(f"/pty/{session_id}")
    assert (gone.status_code, gone.json()["code"]) == (404, "CONTEXT_NOT_FOUND")


def test_a_command_runs_with_bash_c_in_its_folder_in_a_group_of_its_own(
    execd: httpx.Client,
) -> None:
    folder = f"/tmp/pty-{uuid.uuid4().hex[:6]}/deep"
    script = 'echo "$0 $PWD $(id -u) $EXECD_ACCESS_TOKEN"; cut -d" " -f1,5 /proc/$$/stat'
    session_id = open_session(execd, command=script, cwd=folder)
    with joined(execd, session_id) as connection:
        out, err, code = until_exit(connection)
    first, second = out.decode().splitlines()
    assert first == f"bash {folder} 0 {TOKEN}"  # execd's environment, as root, in cwd
    pid, group = second.split()
    assert pid == group  # its own process group
    assert (err, code) == (b"", 0)


@pytest.mark.parametrize(
    ("command", "code"),
    [("exit 137", 137), ("kill -TERM $$", -1), ("kill -KILL $$", -1), ("true", 0)],
)
def test_exit_codes_as_go_reports_them(execd: httpx.Client, command: str, code: int) -> None:
    with joined(execd, open_session(execd, command=command)) as connection:
        assert until_exit(connection)[2] == code


def test_pings_keep_a_silent_client_joined_and_a_deaf_one_is_dropped(
    execd: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(websocket, "READ_DEADLINE_S", 1.0)
    monkeypatch.setattr(pty, "PING_INTERVAL_S", 0.3)
    session_id = open_session(execd, command="cat")
    with joined(execd, session_id) as silent:
        time.sleep(1.6)  # past the deadline, the client's answers to the pings in between
        silent.send(STDIN + b"alive\n")
        assert silent.recv(timeout=10) == b"\x01alive\n"
        monkeypatch.setattr(pty, "PING_INTERVAL_S", 60.0)  # from the next wait on
        time.sleep(1.6)  # nothing comes from the client: execd stops reading it
        with joined(execd, session_id) as successor:  # the session is free
            silent.send(STDIN + b"lost\n")  # no longer read
            successor.send(STDIN + b"found\n")
            assert successor.recv(timeout=10) == b"\x01found\n"
    execd.delete(f"/pty/{session_id}")


def test_what_execd_refuses(execd: httpx.Client) -> None:
    for method in ("GET", "DELETE"):
        unknown = execd.request(method, "/pty/nope")
        assert unknown.status_code == 404
        assert unknown.json() == {
            "code": "CONTEXT_NOT_FOUND",
            "message": "pty session nope not found",
        }
    with pytest.raises(InvalidStatus) as missing:
        join(execd, "nope")
    assert missing.value.response.status_code == 404
    assert execd.post("/pty", content=b"{").json()["code"] == "INVALID_REQUEST_BODY"
    wrong = execd.post("/pty", json={"cwd": 3})
    assert (wrong.status_code, wrong.json()["code"]) == (400, "INVALID_REQUEST_BODY")
    assert execd.post("/pty").status_code == 201  # no body at all is fine
    undefined = execd.post("/pty", json={"cwd": "$NOT_SET/x"})
    assert undefined.status_code == 500
    assert undefined.text.startswith('{"code":"RUNTIME_ERROR"')
    assert '}{"session_id":' in undefined.text  # execd's missing return
    session_id = open_session(execd)
    plain = execd.get(f"/pty/{session_id}/ws")  # not a WebSocket handshake
    assert (plain.status_code, plain.text) == (400, "Bad Request\n")
    with join(execd, session_id, pty="1") as terminal:  # PTY mode: not emulated
        failed = frame(terminal)
        assert (failed["type"], failed["code"]) == ("error", "START_FAILED")
        with pytest.raises(ConnectionClosed):
            terminal.recv(timeout=5)
    assert status(execd, session_id)["running"] is False
    with httpx.Client(base_url=execd.base_url) as stranger:
        assert stranger.post("/pty").status_code == 401
    with pytest.raises(InvalidStatus) as unauthorized:
        address = str(execd.base_url).replace("http://", "ws://").rstrip("/")
        connect(f"{address}/pty/{session_id}/ws?pty=0", legacy=True)
    assert unauthorized.value.response.status_code == 401
    assert execd.get("/pty/a/b/c").status_code == 404


def test_the_fakes_stop_ends_its_sessions(docker_client: docker.DockerClient) -> None:
    server = FakeOpenSandbox(docker_client, api_key=KEY)
    server.start()
    try:
        headers = {"OPEN-SANDBOX-API-KEY": KEY}
        with httpx.Client(base_url=f"http://{server.domain}/v1", headers=headers) as api:
            created = api.post("/sandboxes", json=create_body(env={"EXECD_ACCESS_TOKEN": TOKEN}))
            with execd_client(api, created.json()["id"], **AUTH) as client:
                connection = joined(client, open_session(client, command="sleep 300"))
    finally:
        server.stop()
    with pytest.raises(ConnectionClosed):
        connection.recv(timeout=10)
    assert server.sandbox_containers() == []
