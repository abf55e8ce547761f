"""execd's terminal sessions (/pty, execd 1.0.19), in pipe mode: POST /pty makes a
session, GET and DELETE /pty/{id} tell and end it, and its WebSocket (/pty/{id}/ws?pty=0)
starts its bash on a connection that finds none running, then joins the bash's stdin,
stdout and stderr to one client at a time, framed as execd frames them.

Not emulated, each answered as the comment at its place says: PTY mode (a TTY), the
replay of missed output on a reconnection (`since=`), the takeover of a session another
client holds (`takeover=1`)."""

from __future__ import annotations

import contextlib
import json
import posixpath
import re
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

import docker.errors
from websockets.frames import Opcode

from tests.opensandbox_fake.docker_exec import _DockerExec, _Execution
from tests.opensandbox_fake.records import _Sandbox
from tests.opensandbox_fake.websocket import ServerWebSocket
from tests.opensandbox_fake.wire import (
    GO_JSON,
    _error,
    _go_json,
    _Handler,
    _HttpError,
    _invalid_body,
    _PidLine,
    _SandboxGone,
)

#: The channel a binary frame's first byte names.
STDIN, STDOUT, STDERR = 0x00, 0x01, 0x02
#: execd pings an attached client this often (wsPingInterval).
PING_INTERVAL_S = 30.0
#: The signals a `signal` frame may name; execd ignores any other name.
SIGNALS = {"SIGHUP": 1, "SIGINT": 2, "SIGQUIT": 3, "SIGKILL": 9, "SIGTERM": 15}
#: How long execd's actions on a group wait for the fake to learn the group's id.
PID_WAIT_S = 2.0
#: What Go says when execd's PATH has no bash.
NO_BASH = 'exec: "bash": executable file not found in $PATH'
#: Said instead of starting a shell in PTY mode, which the fake does not have.
NO_PTY_MODE = "the fake execd runs shells in pipe mode only: connect with pty=0"
#: What Go says of a write to the stdin of a shell that has ended.
STDIN_CLOSED = "write |1: file already closed"

#: Runs the session's shell ("$@": bash's arguments) as execd does in pipe mode: in a
#: process group of its own, its pid first on stderr so the fake can signal the group,
#: stdin, stdout and stderr the exec's. Go reports a death by signal as exit code -1, the
#: engine as 128+N: bash's notice of it, which a ( ) subshell inside $( ) prints, is
#: noted in $0 (as NOTING_WRAPPER in execd.py does for commands).
PIPE_WRAPPER = """\
exec 3>&2 4>&1
notice=$( (setsid /bin/sh -c 'echo "$$" >&2; exec bash "$@"' sh "$@" 2>&3 >&4 3>&- 4>&-
  code=$?; exit "$code") 2>&1 )
code=$?
if [ -n "$notice" ] && [ "$code" -gt 128 ]; then
  echo "$((code - 128))" >"$0" 2>/dev/null
fi
exit "$code"
"""
#: Without setsid: the exec'd process is bash itself (docker exec makes it a session
#: leader); a death by signal is known only when the fake sent that signal.
PLAIN_PIPE_WRAPPER = ["/bin/sh", "-c", 'echo "$$" >&2; exec bash "$@"', "sh"]

#: Reads and removes the wrapper's note.
_TAKE_NOTE = 'cat -- "$1" 2>/dev/null; rm -f -- "$1"'

_SESSION = re.compile(r"^/pty/([^/]+)$")
_SOCKET = re.compile(r"^/pty/([^/]+)/ws$")


class _PtyProcess:
    """One run of a session's bash: its docker exec (stdin included) and its group."""

    def __init__(self, execution: _Execution, mark: str) -> None:
        self.execution = execution
        self.mark = mark  # where PIPE_WRAPPER notes a death by signal ("" without it)
        self.pid = 0
        self.pid_known = threading.Event()
        self.ended = threading.Event()
        #: The signals the fake sent its group: 128+N then means a death by signal N.
        self.signals: set[int] = set()

    def set_pid(self, pid: int) -> None:
        self.pid = pid
        self.pid_known.set()


class _PtyClient:
    """One client's WebSocket on a session, joined to one run of its bash."""

    def __init__(self, socket: ServerWebSocket) -> None:
        self.socket = socket
        self.process: _PtyProcess | None = None
        #: Set once `connected` was sent: output may follow.
        self.ready = threading.Event()
        #: Set when the conversation ended (execd's cancel): nothing more is sent.
        self.over = threading.Event()

    def send_json(self, frame: Mapping[str, object]) -> None:
        """A text frame as gorilla's WriteJSON writes it (Go's JSON and a newline)."""
        if not self.socket.send_text(_go_json(frame) + b"\n"):
            self.over.set()

    def output(self, channel: int, data: bytes) -> None:
        self.ready.wait()
        if not self.over.is_set() and not self.socket.send_binary(bytes([channel]) + data):
            self.over.set()

    def exited(self, code: int | None) -> None:
        """The end of its bash: `exit` and a close (None: execd died with its sandbox)."""
        self.ready.wait()
        if self.over.is_set():
            return
        if code is None:
            self.socket.cut()
        else:
            self.send_json({"type": "exit", "exit_code": code})
            self.socket.finish(1000, "process exited")
        self.over.set()

    def keep_alive(self) -> None:
        while not self.over.wait(PING_INTERVAL_S):
            if not self.socket.ping():
                self.over.set()


@dataclass
class _PtySession:
    """execd's ptySession, kept from POST /pty until DELETE."""

    id: str
    sandbox_id: str
    cwd: str  # absolute and made at creation; "" for execd's own working directory
    command: str  # bash's -c when not empty
    lock: threading.Lock = field(default_factory=threading.Lock)
    attached: bool = False  # a client holds its WebSocket (execd's LockWS)
    closing: bool = False  # deleted: its output goes nowhere any more
    #: Bytes of output so far, stdout's and stderr's (execd's replay buffer's total).
    output_offset: int = 0
    process: _PtyProcess | None = None  # its bash, while it runs
    client: _PtyClient | None = None  # where its output goes

    def status(self) -> dict[str, object]:
        running = self.process is not None
        return {"session_id": self.id, "running": running, "output_offset": self.output_offset}


def _go_kind(value: object) -> str:
    """The JSON kind Go names in an unmarshalling error."""
    kinds = ((bool, "bool"), ((int, float), "number"), (str, "string"), (list, "array"))
    return next((name for kind, name in kinds if isinstance(value, kind)), "object")


def _parse_create(body: bytes) -> tuple[str, str]:
    """CreatePTYSessionRequest (cwd, command) as Go's json.Decoder reads it: the first
    value only, an empty body allowed."""
    text = body.decode("utf-8", "replace").lstrip(" \t\r\n")
    if not text:
        return "", ""
    try:
        data, _ = json.JSONDecoder().raw_decode(text)
    except ValueError as error:
        raise _invalid_body(f"error parsing request: {error}") from None
    if data is None:
        return "", ""
    if not isinstance(data, dict):
        raise _invalid_body(
            f"error parsing request: json: cannot unmarshal {_go_kind(data)} "
            "into Go value of type model.CreatePTYSessionRequest"
        )
    for name in ("cwd", "command"):
        value = data.get(name)
        if value is not None and not isinstance(value, str):
            raise _invalid_body(
                f"error parsing request: json: cannot unmarshal {_go_kind(value)} into Go "
                f"struct field CreatePTYSessionRequest.{name} of type string"
            )
    return data.get("cwd") or "", data.get("command") or ""


def _client_frame(data: bytes) -> dict[str, object] | None:
    """A client's text frame as execd's ClientFrame; None when Go would fail to read it
    (execd then ignores the frame)."""
    try:
        frame = json.loads(data)
    except ValueError:
        return None
    if not isinstance(frame, dict):
        return None
    for name, kind in (("type", str), ("data", str), ("signal", str), ("cols", int), ("rows", int)):
        value = frame.get(name)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            return None
    return frame


def _not_found(session_id: str) -> _HttpError:
    return _error(404, "CONTEXT_NOT_FOUND", f"pty session {session_id} not found")


class _Ptys(_DockerExec):
    """execd's /pty routes."""

    _ptys: dict[str, _PtySession]
    _websockets: set[ServerWebSocket]

    def _serve_pty(
        self,
        handler: _Handler,
        sandbox: _Sandbox,
        method: str,
        path: str,
        query: list[tuple[str, str]],
        body: bytes,
    ) -> None:
        session = _SESSION.match(path)
        socket = _SOCKET.match(path)
        if (method, path) == ("POST", "/pty"):
            self._create_pty(handler, sandbox, body)
        elif session and method == "GET":
            handler.reply(200, _go_json(self._pty(sandbox, session[1]).status()), GO_JSON)
        elif session and method == "DELETE":
            self._delete_pty(sandbox, session[1])
            handler.reply(200, b"", None)
        elif socket and method == "GET":
            self._join_pty(handler, sandbox, socket[1], dict(query))
        else:
            handler.reply(404, b"404 page not found", "text/plain")

    def _pty(self, sandbox: _Sandbox, session_id: str) -> _PtySession:
        with self._lock:
            session = self._ptys.get(session_id)
        if session is None or session.sandbox_id != sandbox.id:
            raise _not_found(session_id)
        return session

    def _create_pty(self, handler: _Handler, sandbox: _Sandbox, body: bytes) -> None:
        """201 and the new session's id; its working directory is made now, as execd's
        user (execd 1.0.19: expanded as other paths, then MkdirAll)."""
        cwd, command = _parse_create(body)
        session_id = str(uuid.uuid4())
        resolved, failure = self._pty_workdir(sandbox, cwd) if cwd else ("", "")
        if failure:
            # execd answers the error and then, missing a return, the session too: two
            # JSON values under the error's status; no session is kept.
            message = f"error creating pty session: {failure}"
            refusal = _go_json({"code": "RUNTIME_ERROR", "message": message})
            handler.reply(500, refusal + _go_json({"session_id": session_id}), GO_JSON)
            return
        with self._lock:
            self._ptys[session_id] = _PtySession(session_id, sandbox.id, resolved, command)
        handler.reply(201, _go_json({"session_id": session_id}), GO_JSON)

    def _pty_workdir(self, sandbox: _Sandbox, cwd: str) -> tuple[str, str]:
        """The session's working directory, made; and what failed ("" when nothing did),
        in Go's words, nearly."""
        try:
            resolved = self._resolve(sandbox, cwd)
        except ValueError as error:
            return "", f"error resolving PTY session work directory: {error}"
        code, _, err = self._shell(sandbox, 'mkdir -p -- "$1"', resolved, user="")
        if code == 0:
            return resolved, ""
        reason = err.decode(errors="replace").strip().rpartition(": ")[2]
        reason = reason[:1].lower() + reason[1:]
        return "", f"error creating PTY session work directory: mkdir {resolved}: {reason}"

    def _delete_pty(self, sandbox: _Sandbox, session_id: str) -> None:
        """Forgets the session and kills its bash's group (an attached client still gets
        the `exit`, but no more output)."""
        session = self._pty(sandbox, session_id)
        with self._lock:
            self._ptys.pop(session_id, None)
        with session.lock:
            session.closing = True
            process = session.process
        if process is not None:
            self._signal_pty(sandbox, process, "SIGKILL")

    # -- the WebSocket --------------------------------------------------------------------

    def _join_pty(
        self, handler: _Handler, sandbox: _Sandbox, session_id: str, query: dict[str, str]
    ) -> None:
        session = self._pty(sandbox, session_id)
        with session.lock:
            if session.attached:
                # takeover=1 (execd evicts the attached client for the new one) is not
                # emulated: it is refused alike.
                message = f"another client is already connected to pty session {session_id}"
                raise _error(409, "ALREADY_CONNECTED", message)
            session.attached = True
        socket = ServerWebSocket.accept(handler)
        client = _PtyClient(socket) if socket is not None else None
        try:
            if socket is None or client is None:
                return
            with self._lock:
                self._websockets.add(socket)
            if self._attach_pty(sandbox, session, client, query.get("pty") == "0"):
                self._converse(sandbox, client)
        except Exception:
            if socket is not None:
                socket.cut()
            raise
        finally:
            # The session is free again before its connection ends (execd's UnlockWS).
            with session.lock:
                session.attached = False
                if client is not None and session.client is client:
                    session.client = None
            if client is not None:
                client.over.set()
                client.ready.set()
            if socket is not None:
                socket.settle()
                with self._lock:
                    self._websockets.discard(socket)

    def _attach_pty(
        self, sandbox: _Sandbox, session: _PtySession, client: _PtyClient, pipe: bool
    ) -> bool:
        """`client` joined to the running bash, or to one started now; False when it
        cannot start (the client is told, and the connection ended without a close)."""
        with session.lock:
            process = session.process
            if process is not None:
                session.client, client.process = client, process
        if process is None:
            # PTY mode (no pty=0) is not emulated: its start fails, as a start can.
            failure = self._start_pty(sandbox, session, client) if pipe else NO_PTY_MODE
            if failure:
                client.send_json({"type": "error", "error": failure, "code": "START_FAILED"})
                client.socket.finish()
                return False
        # Output waits for this frame; a session that runs (started by an earlier
        # client) is in pipe mode, whatever this client asked for.
        client.send_json({"type": "connected", "session_id": session.id, "mode": "pipe"})
        client.ready.set()
        threading.Thread(target=client.keep_alive, daemon=True).start()
        return True

    def _start_pty(self, sandbox: _Sandbox, session: _PtySession, client: _PtyClient) -> str:
        """Starts the session's bash as execd does (its own environment and user, the
        session's working directory) with `client` attached; what failed, or ""."""
        probe = self._probe(sandbox)
        if not probe.shell.endswith("/bash"):
            return NO_BASH
        arguments = ["--norc", "--noprofile", *(["-c", session.command] if session.command else [])]
        mark = ""
        if probe.notes_signals:
            tmp = sandbox.env.get("TMPDIR") or "/tmp"
            mark = posixpath.join(tmp, f".opensandbox-fake-pty-{uuid.uuid4().hex}.signal")
            argv = [probe.shell, "-c", PIPE_WRAPPER, mark, *arguments]
        else:
            argv = [*PLAIN_PIPE_WRAPPER, *arguments]
        environment = {"EXECD_ENVS": self._execd_env(sandbox)["EXECD_ENVS"], "HOME": probe.home}
        api = self._client.api
        try:
            exec_id = api.exec_create(
                sandbox.container_id,
                argv,
                stdin=True,
                workdir=session.cwd or None,
                environment=[f"{name}={value}" for name, value in environment.items()],
            )["Id"]
            execution = _Execution(exec_id, api.exec_start(exec_id, socket=True))
        except docker.errors.DockerException as error:
            return str(error)
        process = _PtyProcess(execution, mark)
        with session.lock:
            session.process = client.process = process
            session.client = client
        follow = threading.Thread(
            target=self._follow_pty, args=(sandbox, session, process), daemon=True
        )
        follow.start()
        return ""

    def _converse(self, sandbox: _Sandbox, client: _PtyClient) -> None:
        """The client's frames, until it leaves or the conversation ends."""
        for opcode, data in client.socket.messages(client.over):
            if opcode is Opcode.BINARY:
                # Only stdin goes from a client to execd; other channels are ignored.
                if data[:1] == bytes([STDIN]) and not self._write_stdin(client, data[1:]):
                    break
            elif not self._on_text(sandbox, client, data):
                break
        client.over.set()

    def _on_text(self, sandbox: _Sandbox, client: _PtyClient, data: bytes) -> bool:
        """A client's JSON frame; False when the conversation ends."""
        frame = _client_frame(data)
        if frame is None:
            return True
        kind = frame.get("type") or ""
        if kind == "stdin":
            return self._write_stdin(client, str(frame.get("data") or "").encode())
        if kind == "signal":
            if client.process is not None:
                self._signal_pty(sandbox, client.process, str(frame.get("signal") or ""))
        elif kind == "ping":
            client.send_json({"type": "pong"})
        elif kind != "resize":  # a size means nothing in pipe mode: accepted, ignored
            error = f"unknown frame type {json.dumps(kind)}"
            client.send_json({"type": "error", "error": error, "code": "INVALID_FRAME"})
        return True

    def _write_stdin(self, client: _PtyClient, data: bytes) -> bool:
        assert client.process is not None
        try:
            client.process.execution.send(data)
        except OSError:
            client.send_json({"type": "error", "error": STDIN_CLOSED, "code": "STDIN_WRITE_FAILED"})
            return False
        return True

    def _signal_pty(self, sandbox: _Sandbox, process: _PtyProcess, name: str) -> None:
        """`name` to the bash's process group, as execd's SendSignal does (at once: the
        next frame is read once it was sent)."""
        number = SIGNALS.get(name)
        if number is None or process.ended.is_set() or not process.pid_known.wait(PID_WAIT_S):
            return
        process.signals.add(number)
        with contextlib.suppress(_SandboxGone, docker.errors.DockerException):
            self._shell(sandbox, f"kill -{number} -{process.pid} 2>/dev/null")

    # -- the shell's run ------------------------------------------------------------------

    def _follow_pty(self, sandbox: _Sandbox, session: _PtySession, process: _PtyProcess) -> None:
        """Passes the bash's output to the attached client until it ends, then tells it."""
        pid_line = _PidLine(process.set_pid)

        def on_chunk(out: bytes, err: bytes) -> None:
            for channel, data in ((STDOUT, out), (STDERR, pid_line.strip(err))):
                if not data:
                    continue
                with session.lock:
                    session.output_offset += len(data)
                    client = None if session.closing else session.client
                if client is not None and client.process is process:
                    client.output(channel, data)

        code: int | None
        try:
            ended = self._pump(process.execution, on_chunk)
            running = self._container_running(sandbox)
            code = self._pty_exit_code(sandbox, process, ended) if running else None
        except (_SandboxGone, docker.errors.DockerException):
            code = None  # execd died with its sandbox
        process.ended.set()
        with session.lock:
            if session.process is process:
                session.process = None
            client = session.client
        if client is not None and client.process is process:
            client.exited(code)

    def _pty_exit_code(self, sandbox: _Sandbox, process: _PtyProcess, code: int) -> int:
        """Go's ExitCode(): -1 for a death by signal (noted by the wrapper, or sent by the
        fake), else the exit status."""
        if code <= 128:
            return code
        noted = False
        if process.mark:
            _, note, _ = self._shell(sandbox, _TAKE_NOTE, process.mark)
            noted = note.strip().isdigit()
        return -1 if noted or code - 128 in process.signals else code

    def _end_ptys(self) -> None:
        """The fake's stop: every client's connection cut, every bash's exec let go (the
        removal of its container ends the bash)."""
        with self._lock:
            sessions = list(self._ptys.values())
            sockets = list(self._websockets)
            self._ptys.clear()
            self._websockets.clear()
        for socket in sockets:
            socket.cut()
        for session in sessions:
            if session.process is not None:
                session.process.execution.close()
