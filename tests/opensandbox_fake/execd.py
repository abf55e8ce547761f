"""execd's commands: /command run in the foreground or the background, with its event
stream, timeout, interrupt, status and logs."""

from __future__ import annotations

import contextlib
import json
import posixpath
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import docker.errors

from tests.opensandbox_fake.docker_exec import _absolute, _DockerExec, _Execution, _expand
from tests.opensandbox_fake.records import SIGKILL, SIGTERM, _Command, _Sandbox
from tests.opensandbox_fake.wire import (
    _error,
    _event,
    _EventStream,
    _exec_error,
    _go_json,
    _Handler,
    _invalid_body,
    _LineSplitter,
    _now,
    _PidLine,
    _SandboxGone,
)

#: execd's interrupt: SIGTERM to the group, SIGKILL if it still lives 3 s later.
INTERRUPT_GRACE_S = 3.0

#: Runs a command as execd does ($0 the command, $1 the shell, $2 a background command's
#: output file, $3 where to note a death by signal): `$1 -c $0` in a session and process
#: group of its own, stdin from null, its pid first on stderr so the fake can signal the
#: group. The engine reports a death by signal N as exit code 128+N, Go (so execd) as -1;
#: bash tells the two apart by its "Killed"-like notice, which a ( ) subshell inside $( )
#: prints (not $( ) alone), so a note says which signal. (bash prints no notice for
#: SIGINT or SIGPIPE: those stay 130 and 141.)
NOTING_WRAPPER = """\
start='echo "$$" >&2; exec "$1" -c "$0"'
[ -z "$2" ] || start='echo "$$" >&2; exec "$1" -c "$0" >"$2" 2>&1'
exec 3>&2 4>&1
notice=$( (setsid /bin/sh -c "$start" "$0" "$1" "$2" </dev/null 2>&3 >&4 3>&- 4>&-
  code=$?; exit "$code") 2>&1 )
code=$?
if [ -n "$notice" ] && [ "$code" -gt 128 ]; then
  case $notice in *"core dumped"*) core=1 ;; *) core=0 ;; esac
  echo "$((code - 128)) $core" >"$3" 2>/dev/null
fi
exit "$code"
"""
#: Without bash or setsid: the exec'd process is the command itself (docker exec makes it
#: a session leader), so a death by signal N is only known as 128+N.
PLAIN_WRAPPER = [
    "/bin/sh",
    "-c",
    'echo "$$" >&2\n[ -z "$2" ] || exec "$1" -c "$0" >"$2" 2>&1 </dev/null\n'
    'exec "$1" -c "$0" </dev/null\n',
]


@dataclass(frozen=True)
class _RunRequest:
    command: str
    cwd: str
    background: bool
    timeout_ms: int
    uid: int | None
    gid: int | None
    envs: dict[str, str]


def _parse_run(body: bytes) -> _RunRequest:
    """RunCommandRequest as Go's JSON binding and validator read it."""
    try:
        data = json.loads(body or b"null")
    except ValueError as error:
        raise _invalid_body(f"error parsing request, MAYBE invalid body format. {error}") from None
    if not isinstance(data, dict):
        raise _invalid_body("error parsing request, MAYBE invalid body format. not an object")

    def field_of(name: str, kind: type, default: Any) -> Any:
        value = data.get(name)
        if value is None:
            return default
        if (kind is int and (isinstance(value, bool) or not isinstance(value, int))) or (
            kind is not int and not isinstance(value, kind)
        ):
            value = None
        if value is None:
            raise _invalid_body(
                f"error parsing request, MAYBE invalid body format. field {name} has a wrong type"
            )
        return value

    command = field_of("command", str, "")
    cwd = field_of("cwd", str, "")
    background = field_of("background", bool, False)
    timeout_ms = field_of("timeout", int, 0)
    uid = field_of("uid", int, None)
    gid = field_of("gid", int, None)
    envs = field_of("envs", dict, {})
    for name, value in (("uid", uid), ("gid", gid)):
        if value is not None and not 0 <= value < 2**32:
            raise _invalid_body(f"error parsing request, MAYBE invalid body format. bad {name}")
    if not all(isinstance(value, str) for value in envs.values()):
        raise _invalid_body("error parsing request, MAYBE invalid body format. envs")
    if not command:
        raise _invalid_body(
            "invalid request, validation error Key: 'RunCommandRequest.Command' Error:Field "
            "validation for 'Command' failed on the 'required' tag"
        )
    if timeout_ms < 0:
        raise _invalid_body(
            "invalid request, validation error Key: 'RunCommandRequest.TimeoutMs' Error:Field "
            "validation for 'TimeoutMs' failed on the 'gte' tag"
        )
    if gid is not None and uid is None:
        raise _invalid_body(
            "invalid request, validation error uid is required when gid is provided"
        )
    return _RunRequest(command, cwd, background, timeout_ms, uid, gid, dict(envs))


class _Commands(_DockerExec):
    """execd's /command routes."""

    # -- execd: /command ---------------------------------------------------------------------

    def _run(self, handler: _Handler, sandbox: _Sandbox, body: bytes) -> None:
        request = _parse_run(body)
        probe = self._probe(sandbox)
        env = self._execd_env(sandbox)
        workdir = None
        if request.cwd:
            try:
                resolved = _expand(request.cwd, env, probe.home)
            except ValueError as error:
                message = f"cannot resolve working directory {request.cwd!r}: {error}"
                raise _invalid_body(f"invalid request, validation error {message}") from None
            workdir = _absolute(resolved, sandbox.workdir)
            _, out, _ = self._shell(
                sandbox, 'if [ -d "$1" ]; then echo d; elif [ -e "$1" ]; then echo f; fi', workdir
            )
            kind = out.strip()
            if kind != b"d":
                reason = (
                    f"working directory path is not a directory: {request.cwd}"
                    if kind
                    else f"working directory does not exist: {request.cwd}: "
                    f"stat {resolved}: no such file or directory"
                )
                raise _invalid_body(f"invalid request, validation error {reason}")
        user = ""
        if request.uid is not None:
            user = str(request.uid) if request.gid is None else f"{request.uid}:{request.gid}"
        command = _Command(uuid.uuid4().hex, request.command, request.background, _now())
        stream = _EventStream(handler, self.faults.take("command", request.command))
        if request.uid is not None and probe.uid != 0:
            # execd is not root: setting a user's credentials fails at fork.
            failure = f"fork/exec {probe.shell}: operation not permitted"
            stream.send(_event("init", text=command.id))
            if request.background:
                message = f"error running commands failed to start commands: {failure}"
                stream.write(_go_json({"code": "RUNTIME_ERROR", "message": message}))
            else:
                stream.start_pings()
                stream.send(_event("error", error=_exec_error(failure, failure)))
            time.sleep(self._grace_s)
            stream.finish()
            return
        tmp = sandbox.env.get("TMPDIR") or "/tmp"
        if request.background:
            command.output_path = posixpath.join(tmp, f"{command.id}.output")
            stream.send(_event("init", text=command.id))  # execd: before the start
            stream.start_pings()
        mark = posixpath.join(tmp, f".opensandbox-fake-{command.id}.signal")
        wrapper = [probe.shell, "-c", NOTING_WRAPPER] if probe.notes_signals else PLAIN_WRAPPER
        argv = [*wrapper, request.command, probe.shell, command.output_path, mark]
        own = {"EXECD_ENVS": env["EXECD_ENVS"], "HOME": probe.home}
        environment = [f"{k}={v}" for k, v in {**own, **request.envs}.items()]
        started = time.monotonic()
        api = self._client.api
        try:
            exec_id = api.exec_create(
                sandbox.container_id,
                argv,
                user=user,
                workdir=workdir,
                environment=environment,
            )["Id"]
            execution = _Execution(exec_id, api.exec_start(exec_id, socket=True))
        except docker.errors.DockerException as error:
            if not request.background:
                stream.send(_event("init", text=command.id))
                stream.start_pings()
            stream.send(_event("error", error=_exec_error(str(error), str(error))))
            time.sleep(self._grace_s)
            stream.finish()
            return
        self._commands[command.id] = command
        if request.background:
            threading.Thread(
                target=self._follow,
                args=(sandbox, command, execution, request.timeout_ms, mark),
                daemon=True,
            ).start()
            elapsed = int((time.monotonic() - started) * 1000)
            stream.send(_event("execution_complete", execution_time=elapsed))
        else:
            stream.send(_event("init", text=command.id))
            stream.start_pings()
            try:
                self._run_foreground(sandbox, command, execution, request, stream, started, mark)
            except _SandboxGone:
                stream.abort()
                return
        if stream.open:
            time.sleep(self._grace_s)
        stream.finish()

    def _run_foreground(
        self,
        sandbox: _Sandbox,
        command: _Command,
        execution: _Execution,
        request: _RunRequest,
        stream: _EventStream,
        started: float,
        mark: str,
    ) -> None:
        stdout, stderr = _LineSplitter(), _LineSplitter()
        pid_line = _PidLine(command.set_pid)

        def on_chunk(out: bytes, err: bytes) -> None:
            for line in stdout.feed(out):
                stream.send(_event("stdout", text=line))
            for line in stderr.feed(pid_line.strip(err)):
                stream.send(_event("stderr", text=line))

        timer = self._timeout_timer(sandbox, command, request.timeout_ms)
        try:
            code = self._pump(execution, on_chunk)
            if not self._container_running(sandbox):
                raise _SandboxGone()  # killed with its container: execd died with it
            self._finish(sandbox, command, code, mark)
        except _SandboxGone:
            command.finish(-1, SIGKILL)
            raise
        finally:
            if timer is not None:
                timer.cancel()
        for line in stdout.flush():
            stream.send(_event("stdout", text=line))
        for line in stderr.flush():
            stream.send(_event("stderr", text=line))
        if command.exit_code:
            error = _exec_error(str(command.exit_code), command.error)
            stream.send(_event("error", error=error))
        else:
            elapsed = int((time.monotonic() - started) * 1000)
            stream.send(_event("execution_complete", execution_time=elapsed))

    def _follow(
        self,
        sandbox: _Sandbox,
        command: _Command,
        execution: _Execution,
        timeout_ms: int,
        mark: str,
    ) -> None:
        """Watches a background command to its end, for its status."""
        pid_line = _PidLine(command.set_pid)

        def on_chunk(out: bytes, err: bytes) -> None:
            pid_line.strip(err)  # the output itself goes to the command's file

        timer = self._timeout_timer(sandbox, command, timeout_ms)
        try:
            self._finish(sandbox, command, self._pump(execution, on_chunk), mark)
        except (_SandboxGone, docker.errors.DockerException):
            command.finish(-1, SIGKILL)
        finally:
            if timer is not None:
                timer.cancel()

    def _finish(self, sandbox: _Sandbox, command: _Command, code: int, mark: str) -> None:
        """Records how the command ended; for 128+N, the wrapper's note (written only
        then) says that signal N ended it."""
        signal, core = 0, False
        if code > 128:
            _, note, _ = self._shell(sandbox, 'cat -- "$1" 2>/dev/null; rm -f -- "$1"', mark)
            fields = note.split()
            if len(fields) == 2 and fields[0].isdigit():
                signal, core = int(fields[0]), fields[1] != b"0"
        command.finish(code, signal, core)

    def _timeout_timer(
        self, sandbox: _Sandbox, command: _Command, timeout_ms: int
    ) -> threading.Timer | None:
        """At the timeout, SIGKILL to the whole group, as execd's context does."""
        if timeout_ms <= 0:
            return None
        timer = threading.Timer(timeout_ms / 1000, self._signal_group, (sandbox, command, SIGKILL))
        timer.daemon = True
        timer.start()
        return timer

    def _interrupt(self, sandbox: _Sandbox, query: list[tuple[str, str]]) -> None:
        command_id = dict(query).get("id", "")
        if not command_id:
            raise _error(400, "MISSING_QUERY", "missing query parameter 'id'")
        command = self._commands.get(command_id)
        prefix = "error interruptting code context. "
        if command is None:
            raise _error(500, "RUNTIME_ERROR", prefix + "no such session")
        # execd knows the pid microseconds after the start; the fake reads it off the stream.
        command.pid_known.wait(2)
        if not command.running or command.pid <= 0:
            raise _error(
                500, "RUNTIME_ERROR", prefix + f"command session {command_id} is not running"
            )
        self._signal_group(sandbox, command, SIGTERM)
        deadline = time.monotonic() + INTERRUPT_GRACE_S
        while time.monotonic() < deadline:
            if not self._group_alive(sandbox, command.pid):
                return
            time.sleep(0.05)
        with contextlib.suppress(_SandboxGone, docker.errors.DockerException):
            self._shell(sandbox, f"kill -9 -{command.pid} 2>/dev/null")

    def _logs(
        self, handler: _Handler, sandbox: _Sandbox, command_id: str, query: list[tuple[str, str]]
    ) -> None:
        command = self._commands.get(command_id)
        if command is None:
            raise _invalid_body(f"command not found: {command_id}")
        if not command.background:
            raise _invalid_body(f"command {command_id} is not running in background")
        try:
            cursor = max(0, int(dict(query).get("cursor", "0")))
        except ValueError:
            cursor = 0
        code, out, err = self._shell(
            sandbox, 'tail -c "+$2" -- "$1"', command.output_path, str(cursor + 1)
        )
        if code != 0:
            message = err.decode(errors="replace").strip()
            raise _invalid_body(
                f"error open combined output file for command {command_id}: {message}"
            )
        handler.reply(
            200,
            out,
            "text/plain; charset=utf-8",
            {"EXECD-COMMANDS-TAIL-CURSOR": str(cursor + len(out))},
        )
