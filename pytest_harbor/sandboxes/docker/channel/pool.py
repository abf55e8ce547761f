"""The command channels of a sandbox: one exec the engine holds open per channel, its
input the requests (protocol.py), its output the replies (reply.py), read by a thread
of its own. A pool per sandbox carries commands at once, one per channel; whatever a
channel cannot carry, or a channel that stops answering, leaves the command to plain
exec, which the caller runs instead."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping, Sequence

from pytest_harbor.display import harbor_logger
from pytest_harbor.sandboxes import output
from pytest_harbor.sandboxes.base import ROOT_USER, SEALED_BUSYBOX, ExecResult
from pytest_harbor.sandboxes.docker.channel.protocol import (
    CHANNEL_SCRIPT,
    READY,
    channel_arguments,
    channel_request,
    new_nonce,
)
from pytest_harbor.sandboxes.docker.channel.reply import Carry, ChannelReply, settle
from pytest_harbor.sandboxes.docker.engine import (
    ENGINE_ERRORS,
    KILL_GRACE_S,
    Endpoint,
    engine_for,
    explain,
)
from pytest_harbor.sandboxes.docker.stream import start_exec

__all__ = ["CHANNELS_PER_SANDBOX", "ChannelPool"]

log = harbor_logger()

#: Commands a sandbox's channels carry at once; more run by plain exec meanwhile.
CHANNELS_PER_SANDBOX = 4
#: How long a new channel may take to say it is ready.
_OPEN_TIMEOUT_S = 10.0
#: Channels of a sandbox that may be lost (killed, stopped, garbled) before the sandbox's
#: commands all go by plain exec.
_LOSSES_CAP = 3
#: `kill(signal, pid)`: send a signal to a process group by plain exec (never through a
#: channel, which may be the one that stopped answering).
Killer = Callable[[int], None]


class _Lost(Exception):
    """The channel is gone or no longer the engine's to trust."""


class DockerChannel:
    """One channel: an exec of the channel script, one command at a time."""

    def __init__(self, container_id: str, endpoint: Endpoint | None, arguments: list[str]):
        try:
            self._connection = start_exec(
                engine_for(endpoint).api,
                container_id,
                [SEALED_BUSYBOX, "sh", "-c", CHANNEL_SCRIPT, "sh", *arguments],
                user=ROOT_USER,
                stdin=True,
            ).connection
        except ENGINE_ERRORS as error:
            raise _Lost(f"cannot open: {explain(error)}") from None
        self._condition = threading.Condition()
        self._reply: ChannelReply | None = None
        self._greeting = bytearray()
        self.pid: int | None = None
        self.ended = False
        #: Why the channel is no longer used (None: it may carry the next command).
        self.lost: str | None = None
        self._thread = threading.Thread(target=self._read, name="harbor-channel", daemon=True)
        self._thread.start()
        with self._condition:
            self._condition.wait_for(
                lambda: self.pid is not None or self.ended, timeout=_OPEN_TIMEOUT_S
            )
        if self.pid is None:
            self.close()
            raise _Lost("it did not say it was ready")

    def _read(self) -> None:
        try:
            for stream, data in self._connection.frames():
                with self._condition:
                    self._take(stream == 1, data)
                    self._condition.notify_all()
        except Exception:  # a torn frame or a closed socket: the channel ends either way
            pass
        finally:
            with self._condition:
                self.ended = True
                self._condition.notify_all()

    def _take(self, stdout: bool, data: bytes) -> None:
        if self.pid is None:
            self._greeting += data if stdout else b""
            line, newline, _ = bytes(self._greeting).partition(b"\n")
            if newline:
                word, _, pid = line.decode("ascii", errors="replace").partition(" ")
                if word == READY and pid.isdigit():
                    self.pid = int(pid)
                else:
                    self.lost = "its greeting was not the channel's"
            return
        if self._reply is None:
            self.lost = "it wrote between commands"
            return
        self._reply.feed(stdout, data)

    def run(
        self,
        command: Sequence[str],
        *,
        user: str,
        workdir: str | None,
        env: Mapping[str, str] | None,
        timeout: float,
        stdin: bytes | None,
        kill: Killer,
    ) -> ExecResult | None:
        """Run one command; None when it did not start (plain exec is to run it). Raises
        _Lost only before the command could have started."""
        nonce = new_nonce()
        request = channel_request(nonce, command, user=user, workdir=workdir, env=env, stdin=stdin)
        if request is None:
            return None
        reply = ChannelReply(nonce)
        with self._condition:
            if self.ended or self.lost is not None:
                raise _Lost(self.lost or "it ended")
            self._reply = reply
        try:
            self._connection.send(request)
        except OSError as error:
            self.lost = f"its input broke: {error}"
            raise _Lost(self.lost) from None
        deadline_passed = not self._wait(
            lambda: reply.complete or reply.capped or self.ended, max(timeout, 0.0)
        )
        if reply.capped or deadline_passed:
            # Past its deadline, or its output past what is read: the command ends.
            if reply.pid is not None:
                kill(reply.pid)
            if deadline_passed:
                self._wait(lambda: reply.complete or self.ended, KILL_GRACE_S)
        with self._condition:
            self._reply = None
            verdict = settle(reply.state(), deadline_passed)
        self.lost = verdict.lost or self.lost
        if verdict.kill and reply.pid is not None:
            kill(reply.pid)
        if verdict.carry is Carry.EXEC:
            return None
        if verdict.carry is Carry.NOT_STARTED:
            # Its shell could not start it (no process to be had at the sandbox's cap), or
            # the channel ended first.
            return ExecResult(
                exit_code=-1 if deadline_passed else 126,
                stderr_bytes=b"the command could not be started in the sandbox\n",
                timed_out=deadline_passed,
            )
        return _result(reply, deadline_passed)

    def _wait(self, done: Callable[[], bool], seconds: float) -> bool:
        """Wait up to `seconds` for `done`; whether it came."""
        with self._condition:
            return self._condition.wait_for(done, timeout=seconds)

    @property
    def usable(self) -> bool:
        return self.lost is None and not self.ended

    def close(self) -> None:
        self.ended = True
        self._connection.close()


def _result(reply: ChannelReply, timed_out: bool) -> ExecResult:
    """The command's result as its reply carried it (cut off where the reply was)."""
    stdout = reply.stdout()
    if reply.capped:
        stdout += (
            f"\n[... output not read past {output.EXEC_READ_CAP} bytes: "
            "the command was ended ...]\n"
        ).encode()
    code = reply.exit_code if reply.complete else None
    return ExecResult(
        exit_code=-1 if code is None else code,
        stdout_bytes=stdout,
        stderr_bytes=reply.stderr(),
        timed_out=timed_out,
    )


class ChannelPool:
    """The channels of one sandbox: an idle one carries the next command, a new one opens
    while fewer than CHANNELS_PER_SANDBOX are busy; a lost one is closed (and its processes
    ended); after _LOSSES_CAP losses the sandbox's commands all go by plain exec."""

    def __init__(self, container_id: str, endpoint: Endpoint | None, kill: Killer) -> None:
        self._container = container_id
        self._endpoint = endpoint
        self._kill = kill
        self._lock = threading.Lock()
        self._idle: list[DockerChannel] = []
        self._busy = 0
        self._losses = 0
        self._closed = False
        self._arguments: list[str] | None = None

    @property
    def disabled(self) -> bool:
        return self._closed or self._losses >= _LOSSES_CAP

    def run(
        self,
        command: Sequence[str],
        *,
        user: str,
        workdir: str | None,
        env: Mapping[str, str] | None,
        timeout: float,
        stdin: bytes | None,
    ) -> ExecResult | None:
        """The command's result through a channel, or None: plain exec is to run it."""
        channel = self._take()
        if channel is None:
            return None
        try:
            result = channel.run(
                command,
                user=user,
                workdir=workdir,
                env=env,
                timeout=timeout,
                stdin=stdin,
                kill=self._kill_group,
            )
        except _Lost as lost:
            channel.lost = str(lost)
            result = None
        finally:
            self._give_back(channel)
        return result

    def _take(self) -> DockerChannel | None:
        with self._lock:
            if self.disabled:
                return None
            while self._idle:
                channel = self._idle.pop()
                if channel.usable:
                    self._busy += 1
                    return channel
                self._lose(channel)
            if self._busy >= CHANNELS_PER_SANDBOX:
                return None
            self._busy += 1
        try:
            channel = DockerChannel(self._container, self._endpoint, self._channel_arguments())
        except _Lost as lost:
            log.debug("sandbox %s: no command channel (%s)", self._container[:12], lost)
            with self._lock:
                self._busy -= 1
                self._losses += 1
            return None
        return channel

    def _channel_arguments(self) -> list[str]:
        if self._arguments is None:
            try:
                config = engine_for(self._endpoint).api.inspect_container(self._container)
            except ENGINE_ERRORS as error:
                raise _Lost(f"cannot read the sandbox's environment: {explain(error)}") from None
            self._arguments = channel_arguments((config.get("Config") or {}).get("Env") or [])
        return self._arguments

    def _give_back(self, channel: DockerChannel) -> None:
        with self._lock:
            self._busy -= 1
            if channel.usable and not self._closed:
                self._idle.append(channel)
                return
            self._lose(channel)

    def _lose(self, channel: DockerChannel) -> None:
        """Close a channel that is no longer used; end its processes when it may still
        run (its group: the shell and its relays)."""
        if channel.lost is not None:
            self._losses += 1
            log.debug("sandbox %s: command channel lost: %s", self._container[:12], channel.lost)
        alive = not channel.ended
        channel.close()
        if alive and channel.pid is not None and not self._closed:
            self._kill_group(channel.pid)

    def _kill_group(self, pid: int) -> None:
        with contextlib.suppress(Exception):
            self._kill(pid)

    def close(self) -> None:
        """Close every channel (the sandbox is going)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for channel in idle:
            channel.close()
