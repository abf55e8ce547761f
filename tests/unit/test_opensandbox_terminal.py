"""A joined command's pipe over execd's terminal WebSocket (opensandbox/terminal.py): the
frames read and written, the address, the scripts of both sides."""

from __future__ import annotations

import json
import queue
import shlex
import threading
from collections.abc import Iterator

import pytest

from pytest_harbor.sandboxes.base import SEALED_BUSYBOX, SandboxError
from pytest_harbor.sandboxes.opensandbox.terminal import (
    TerminalPipe,
    fifo_script,
    joiner_line,
    terminal_address,
)


class Connection:
    """What the pipe uses of a websockets connection: iteration, send, close."""

    def __init__(self) -> None:
        self.incoming: queue.Queue[str | bytes | None] = queue.Queue()
        self.sent: list[str | bytes] = []
        self.closed = threading.Event()

    def __iter__(self) -> Iterator[str | bytes]:
        while True:
            message = self.incoming.get()
            if message is None:
                return
            yield message

    def send(self, message: str | bytes) -> None:
        if self.closed.is_set():
            raise OSError("closed")
        self.sent.append(message)

    def close(self) -> None:
        self.closed.set()
        self.incoming.put(None)


def test_output_comes_by_channel_and_the_exit_ends_it() -> None:
    connection = Connection()
    ended: list[bool] = []
    pipe = TerminalPipe(connection, lambda: ended.append(True), "sandbox s: cat")
    for message in (b"\x01hello ", b"\x02oops", b"", b"\x03ignored", b"\x01world"):
        connection.incoming.put(message)
    connection.incoming.put(json.dumps({"type": "error", "error": "stdin write failed"}))
    connection.incoming.put(json.dumps({"type": "exit", "exit_code": 0}))
    got = b""
    while chunk := pipe.receive(timeout=5):
        got += chunk
    assert got == b"hello world"
    assert pipe.receive(timeout=0.1) == b""  # ended stays ended
    assert "oops" in pipe.stderr_tail() and "stdin write failed" in pipe.stderr_tail()
    pipe.send(b"more")
    assert connection.sent == [b"\x00more"]
    pipe.close()
    pipe.close()
    assert ended == [True]
    assert json.loads(connection.sent[-1]) == {"type": "signal", "signal": "SIGKILL"}
    with pytest.raises(SandboxError, match="closed"):
        pipe.send(b"late")


def test_nothing_yet_is_a_timeout_and_a_cut_is_the_end() -> None:
    connection = Connection()
    pipe = TerminalPipe(connection, lambda: None, "sandbox s: cat")
    with pytest.raises(TimeoutError, match="no output within"):
        pipe.receive(timeout=0.2)
    connection.incoming.put(None)  # the socket went away
    assert pipe.receive(timeout=5) == b""
    connection.closed.set()
    with pytest.raises(SandboxError, match="broke"):
        pipe.send(b"x")


@pytest.mark.parametrize(
    ("execd", "address"),
    [
        ("http://10.0.0.5:44772", "ws://10.0.0.5:44772/pty/a%2Fb/ws?pty=0"),
        ("https://host/proxy/44772/", "wss://host/proxy/44772/pty/a%2Fb/ws?pty=0"),
    ],
)
def test_the_session_is_joined_in_pipe_mode(execd: str, address: str) -> None:
    assert terminal_address(execd, "a/b") == address


def test_the_scripts_of_both_sides() -> None:
    folder = "/.pytest-harbor-in/pipe-0123"
    script = fifo_script(folder, 1000, None)
    assert "mkdir -m 0711" in script and "mkfifo -m 0600" in script
    assert f"chown 1000 {folder}/in {folder}/out {folder}/err" in script
    assert f"chown 1000:1001 {folder}/in" in fifo_script(folder, 1000, 1001)
    line = joiner_line(folder).decode()
    assert line.endswith("\n") and line.count("\n") == 1  # the shell reads one line
    argv = shlex.split(line)
    assert argv[:4] == ["exec", SEALED_BUSYBOX, "sh", "-c"]
    assert argv[5:] == ["sh", folder, SEALED_BUSYBOX]
