"""A command in an OpenSandbox sandbox with its input and output joined to this process
(OpensPipes): the relay an agent's tool connections (MCP over stdio, a URL reached with
`nc`) run through.

execd's command API gives a command no input, and its terminal API (`/pty`, a shell
over a WebSocket, in pipe mode its stdin, stdout and stderr apart) runs as execd's own
user. So a pipe is two commands that meet at three FIFOs in a folder of root's that no
one else may list or change (0711; the FIFOs are the command's user's, 0600):

- the command itself, started by the command API as its user, with its stdin, stdout and
  stderr the FIFOs;
- a terminal session as root, whose shell at once becomes the sealed busybox running
  `_JOINER`: the terminal's stdin into the input FIFO, the output FIFOs out to the
  terminal. It opens only FIFOs it made, in a folder no one else can change.

The pipe ends when the command's stdout ends (the joiner then lingers a moment, as execd
may send a session's end before the last of its output, and exits), or when it is
closed: the session is deleted (its process group killed) and the command interrupted."""

from __future__ import annotations

import contextlib
import json
import secrets
import shlex
import threading
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_harbor.sandboxes.base import SEALED_BUSYBOX, ExecResult, SandboxError
from pytest_harbor.sandboxes.opensandbox.api import ApiError, Bounds
from pytest_harbor.sandboxes.opensandbox.commands import JOINED, command_line
from pytest_harbor.sandboxes.opensandbox.execd import Execd
from pytest_harbor.sandboxes.pipes import QueuedPipe

__all__ = [
    "Joining",
    "TerminalPipe",
    "fifo_script",
    "joiner_line",
    "open_joined",
    "terminal_address",
]

#: The terminal's side ($1 the FIFOs' folder, $2 the busybox): stderr and stdin in the
#: background (stdin by a copy of the descriptor: a background job's own is /dev/null),
#: stdout in the foreground, then a linger before the end.
_JOINER = (
    'f=$1 S=$2; exec 3<&0; $S cat -- "$f/err" >&2 & $S cat <&3 >"$f/in" 3<&- & '
    '$S cat -- "$f/out" 3<&-; $S sleep 0.2; exit 0'
)
_STDIN, _STDOUT, _STDERR = 0x00, 0x01, 0x02
#: How long a close waits for execd to end the connection after the shell is killed.
_CLOSE_WAIT_S = 1.0


@dataclass(frozen=True)
class Joining:
    """What a sandbox lends a pipe: its execd, a script run as root (the trusted busybox
    as $B), and where the engine's own files go to be removed later; `folder` is where
    the FIFOs' folder is made, `what` names the sandbox in errors."""

    execd: Execd
    root: Callable[[str], ExecResult]
    finished_with: Callable[[str], None]
    folder: str
    what: str


def open_joined(
    joining: Joining,
    command: Sequence[str],
    *,
    uid: int,
    gid: int | None,
    workdir: str,
    envs: Mapping[str, str],
) -> TerminalPipe:
    """`command` run as `uid`:`gid` in `workdir`, its input and output joined (see the
    module); SandboxError when it cannot be."""
    execd = joining.execd
    folder = f"{joining.folder}/pipe-{secrets.token_hex(16)}"
    what = f"{joining.what}: {command[0]}"
    made = joining.root(fifo_script(folder, uid, gid))
    if made.exit_code != 0:
        said = made.stderr.strip()[-300:]
        raise SandboxError(f"{what}: the pipe's FIFOs could not be made: {said}")
    command_id = session = ""
    try:
        line = command_line([workdir, folder, *command], JOINED, SEALED_BUSYBOX)
        command_id = execd.spawn(line, uid=uid, gid=gid, envs=envs)
        session = execd.start_terminal()
        connection = connect_terminal(execd.url, session, execd.headers, execd.bounds)
    except ApiError as error:
        _end(joining, session, command_id, folder)
        raise SandboxError(f"{what}: {error}") from None
    pipe = TerminalPipe(connection, lambda: _end(joining, session, command_id, folder), what)
    try:
        pipe.send(joiner_line(folder))
    except SandboxError:
        pipe.close()
        raise
    return pipe


def _end(joining: Joining, session: str, command_id: str, folder: str) -> None:
    """A pipe's pieces ended and its folder left for removal."""
    if session:
        joining.execd.end_terminal(session)
    if command_id:
        joining.execd.interrupt(command_id)
    joining.finished_with(folder)


def fifo_script(folder: str, uid: int, gid: int | None) -> str:
    """Root's script (the trusted busybox as $B) that makes the FIFOs' folder: the FIFOs
    are the user's (its group's too when one is named)."""
    quoted = shlex.quote(folder)
    fifos = " ".join(f"{quoted}/{name}" for name in ("in", "out", "err"))
    owner = str(uid) if gid is None else f"{uid}:{gid}"
    return f"$B mkdir -m 0711 -- {quoted} && $B mkfifo -m 0600 {fifos} && $B chown {owner} {fifos}"


def joiner_line(folder: str) -> bytes:
    """The terminal shell's first line: it becomes the joiner."""
    script = " ".join(
        shlex.quote(part) for part in (SEALED_BUSYBOX, "sh", "-c", _JOINER, "sh", folder)
    )
    return f"exec {script} {shlex.quote(SEALED_BUSYBOX)}\n".encode()


def terminal_address(execd_url: str, session_id: str) -> str:
    """The session's WebSocket, in pipe mode."""
    parts = urllib.parse.urlsplit(execd_url)
    scheme = "wss" if parts.scheme == "https" else "ws"
    session = urllib.parse.quote(session_id, safe="")
    path = parts.path.rstrip("/") + f"/pty/{session}/ws"
    return urllib.parse.urlunsplit((scheme, parts.netloc, path, "pty=0", ""))


def connect_terminal(
    execd_url: str, session_id: str, headers: Mapping[str, str], bounds: Bounds
) -> Any:
    """The session's WebSocket, open and past execd's `connected` frame (its shell has
    started); ApiError when it cannot be."""
    from websockets.exceptions import InvalidStatus, WebSocketException
    from websockets.sync.client import connect

    doing = "joining a command's input and output"
    try:
        # Entered as a context (what websockets 17.1 and later ask), closed by the pipe.
        connection = contextlib.ExitStack().enter_context(
            connect(
                terminal_address(execd_url, session_id),
                additional_headers=dict(headers),
                open_timeout=bounds.request_s,
                close_timeout=1,
                compression=None,
                max_size=None,
            )
        )
    except InvalidStatus as error:
        status = error.response.status_code
        said = error.response.body.decode("utf-8", "replace")[:300] if error.response.body else ""
        raise ApiError(f"{doing}: HTTP {status}: {said}", status) from None
    except (WebSocketException, OSError, TimeoutError) as error:
        raise ApiError(f"{doing}: {execd_url} did not answer ({error})") from None
    try:
        first = connection.recv(timeout=bounds.request_s)
    except (WebSocketException, OSError, TimeoutError) as error:
        connection.close()
        raise ApiError(f"{doing}: the terminal did not start ({error})") from None
    frame = _json(first)
    if frame.get("type") != "connected":
        connection.close()
        said = frame.get("error") or frame.get("code") or str(first)[:300]
        raise ApiError(f"{doing}: the terminal did not start: {said}")
    return connection


def _json(message: str | bytes) -> dict[str, Any]:
    if not isinstance(message, str):
        return {}
    try:
        frame = json.loads(message)
    except ValueError:
        return {}
    return frame if isinstance(frame, dict) else {}


class TerminalPipe(QueuedPipe):
    """A joined command's stdin (`send`) and stdout (`receive`) over a terminal session's
    WebSocket (see the module); `ended` runs once when it is closed."""

    def __init__(self, connection: Any, ended: Callable[[], None], what: str) -> None:
        self._connection = connection
        self._ended_hook = ended
        super().__init__(what)
        self._close_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="harbor-terminal", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        from websockets.exceptions import WebSocketException

        try:
            for message in self._connection:
                if isinstance(message, str):
                    frame = _json(message)
                    if frame.get("type") == "exit":
                        break
                    if frame.get("type") == "error":
                        self._err.append(f"\n(execd: {frame.get('error', '')})\n".encode())
                    continue
                if not message:
                    continue
                if message[0] == _STDOUT:
                    self._put(bytes(message[1:]))
                elif message[0] == _STDERR:
                    self._err.append(bytes(message[1:]))
        except (WebSocketException, OSError):
            pass  # closed under us, or cut: the output ends here
        finally:
            self._end()

    def send(self, data: bytes) -> None:
        from websockets.exceptions import WebSocketException

        if self._closed.is_set():
            raise SandboxError(f"{self._what}: the pipe is closed")
        try:
            self._connection.send(bytes([_STDIN]) + data)
        except (WebSocketException, OSError) as error:
            raise SandboxError(f"{self._what}: the pipe broke ({error})") from None

    def close(self) -> None:
        with self._close_lock:
            if self._closed.is_set():
                return
            self._closed.set()
        from websockets.exceptions import WebSocketException

        with contextlib.suppress(WebSocketException, OSError):
            self._connection.send(json.dumps({"type": "signal", "signal": "SIGKILL"}))
        # The killed shell's end closes the socket from execd's side at once; a close of
        # ours before that would wait out its timeout (execd leaves a client-closed
        # connection open).
        if threading.current_thread() is not self._reader:
            self._reader.join(timeout=_CLOSE_WAIT_S)
        with contextlib.suppress(WebSocketException, OSError):
            self._connection.close()
        self._ended_hook()
