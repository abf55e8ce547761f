"""What execd does in its container, done with docker exec: scripts run to their end,
what execd knows of itself, paths as it resolves them, a command's output."""

from __future__ import annotations

import contextlib
import posixpath
import queue
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import docker.errors
import docker.utils.socket

from tests.opensandbox_fake.records import _Command, _Probe, _Sandbox, _State
from tests.opensandbox_fake.wire import _SandboxGone

#: The env file bootstrap.sh exports to execd (its KEY=VALUE lines are not read here).
EXECD_ENVS_FILE = "/opt/opensandbox/.env"
#: How often the fake asks the engine whether a command's process has ended.
EXIT_POLL_S = 0.1

#: What execd would know of itself, asked as the container's user: the shell it runs
#: commands with, its HOME, its uid; and whether NOTING_WRAPPER's setsid is there.
_PROBE_SCRIPT = """\
command -v bash || command -v sh
printf '%s\\n' "$HOME"
id -u || echo 0
command -v setsid >/dev/null && echo setsid
"""


_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def _expand(path: str, env: dict[str, str], home: str) -> str:
    """execd's ExpandPathWithEnv: $VAR and ${VAR} (an undefined one is an error), then ~."""
    missing = sorted(
        {m[1] or m[2] for m in _ENV_REFERENCE.finditer(path) if (m[1] or m[2]) not in env}
    )
    if missing:
        raise ValueError(f"path references undefined environment variables: {','.join(missing)}")
    expanded = _ENV_REFERENCE.sub(lambda m: env[m[1] or m[2]], path)
    if expanded == "~":
        return home
    if expanded.startswith("~/"):
        return posixpath.normpath(posixpath.join(home, expanded[2:]))
    return expanded


def _absolute(path: str, workdir: str) -> str:
    """filepath.Abs relative to execd's working directory, cleaned."""
    joined = posixpath.normpath(posixpath.join(workdir or "/", path))
    return "/" + joined.lstrip("/")


def _next(chunks: queue.Queue[tuple[bytes, bytes] | None], wait_s: float) -> Any:
    """The next item of a queue, or None when none comes within wait_s."""
    try:
        return chunks.get(timeout=wait_s)
    except queue.Empty:
        return None


class _Execution:
    """One command's docker exec, read through its raw socket (the engine's multiplexed
    stdout/stderr frames), which the fake closes once the process has ended."""

    def __init__(self, exec_id: str, sock: Any) -> None:
        self.exec_id = exec_id
        self._socket = sock
        # The one place that reaches under docker's socket object: exec_start(socket=True)
        # gives a SocketIO over a unix socket, or the socket itself (TLS).
        self._raw = getattr(sock, "_sock", sock)
        self._raw.settimeout(None)  # a silent command is not a dead connection

    def frames(self) -> Iterator[tuple[int, bytes]]:
        frames: Iterator[tuple[int, bytes]] = docker.utils.socket.frames_iter(
            self._socket, tty=False
        )
        return frames

    def send(self, data: bytes) -> None:
        """Writes to the process's stdin (an exec made with stdin=True); OSError once the
        fake closed the socket."""
        self._raw.sendall(data)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._raw.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._raw.close()


class _DockerExec(_State):
    """Runs things in a sandbox's container as execd would, for its routes."""

    # -- execd: running things in the container ---------------------------------------------

    def _shell(
        self, sandbox: _Sandbox, script: str, *args: str, user: str = "0"
    ) -> tuple[int, bytes, bytes]:
        """Runs a /bin/sh script in the container (as root unless told), to its end."""
        api = self._client.api
        try:
            exec_id = api.exec_create(
                sandbox.container_id, ["/bin/sh", "-c", script, "sh", *args], user=user
            )["Id"]
            stdout, stderr = api.exec_start(exec_id, demux=True)
            code = api.exec_inspect(exec_id)["ExitCode"]
        except docker.errors.NotFound:
            raise _SandboxGone() from None
        except docker.errors.APIError as error:
            if error.status_code == 409 or "is not running" in str(error):
                raise _SandboxGone() from None
            raise
        return int(code or 0), stdout or b"", stderr or b""

    def _probe(self, sandbox: _Sandbox) -> _Probe:
        if sandbox.probe is None:
            _, out, _ = self._shell(sandbox, _PROBE_SCRIPT, user="")
            lines = [*out.decode(errors="replace").splitlines(), "", "", "", ""]
            uid = int(lines[2]) if lines[2].strip().isdigit() else 0
            shell, home = lines[0] or "/bin/sh", lines[1] or "/root"
            notes = shell.endswith("/bash") and lines[3] == "setsid"
            sandbox.probe = _Probe(shell, home, uid, notes)
        return sandbox.probe

    def _execd_env(self, sandbox: _Sandbox) -> dict[str, str]:
        """execd's own environment: the container's, with the HOME its process got and
        what bootstrap.sh exports."""
        home = self._probe(sandbox).home
        return {"EXECD_ENVS": EXECD_ENVS_FILE, **sandbox.env, "HOME": home}

    def _signal_group(self, sandbox: _Sandbox, command: _Command, signal: int) -> None:
        if not command.pid_known.wait(10) or not command.running:
            return
        command.signalled = True
        with contextlib.suppress(_SandboxGone, docker.errors.DockerException):
            self._shell(sandbox, f"kill -{signal} -{command.pid} 2>/dev/null")

    def _group_alive(self, sandbox: _Sandbox, pid: int) -> bool:
        try:
            code, _, _ = self._shell(sandbox, f"kill -0 -{pid} 2>/dev/null")
        except (_SandboxGone, docker.errors.DockerException):
            return False
        return code == 0

    def _pump(self, execution: _Execution, on_chunk: Callable[[bytes, bytes], None]) -> int:
        """Passes a command's output on until its process ends; returns the engine's exit
        code.

        The engine holds the stream open up to 2 s after the exit while children keep its
        pipes; execd reads files and stops at the exit, so the fake asks the engine whether
        the process still runs and then stops reading."""
        chunks: queue.Queue[tuple[bytes, bytes] | None] = queue.Queue()

        def read() -> None:
            try:
                for stream_id, data in execution.frames():
                    chunks.put((data, b"") if stream_id == 1 else (b"", data))
            except Exception:
                pass  # the socket closed under the reader: the fake is done with it
            finally:
                chunks.put(None)

        threading.Thread(target=read, daemon=True).start()
        try:
            check_at = time.monotonic() + EXIT_POLL_S
            while True:
                try:
                    item = chunks.get(timeout=EXIT_POLL_S)
                except queue.Empty:
                    item = (b"", b"")
                if item is None:
                    break
                on_chunk(*item)
                if time.monotonic() < check_at:
                    continue
                if not self._exec_state(execution.exec_id)[0]:
                    while (item := _next(chunks, 0.05)) is not None:
                        on_chunk(*item)  # what the engine still had in flight
                    break
                check_at = time.monotonic() + EXIT_POLL_S
            while True:
                running, code = self._exec_state(execution.exec_id)
                if not running:
                    return code
                time.sleep(EXIT_POLL_S)
        finally:
            execution.close()

    def _container_running(self, sandbox: _Sandbox) -> bool:
        try:
            return bool(self._client.containers.get(sandbox.container_id).status == "running")
        except docker.errors.NotFound:
            return False

    def _exec_state(self, exec_id: str) -> tuple[bool, int]:
        try:
            state = self._client.api.exec_inspect(exec_id)
        except docker.errors.NotFound:
            raise _SandboxGone() from None
        return bool(state["Running"]), int(state["ExitCode"] or 0)

    def _resolve(self, sandbox: _Sandbox, path: str) -> str:
        """A path as execd resolves it (variables, ~), made absolute from its working dir."""
        env = self._execd_env(sandbox)
        return _absolute(_expand(path, env, env["HOME"]), sandbox.workdir)
