"""A command's reply on a channel: its bytes read as they arrive (`ChannelReply`), and
what the reply comes to once it is complete or its deadline has passed (`settle`), a pure
function of the reply's state, so that every case is tested without a socket."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from pytest_harbor.sandboxes import output
from pytest_harbor.sandboxes.docker.channel.protocol import NO_WORKDIR, UNSUPPORTED
from pytest_harbor.sandboxes.output import CappedOutput

__all__ = ["Carry", "ChannelReply", "ReplyState", "Verdict", "settle"]

#: Why a channel is no longer used, by what its last reply showed.
CAPPED = "a command's output went past the read cap"
OUTLIVED = "a command outlived its deadline's kill"
NOT_STARTED = "a command did not start"
RAN_PAST_END = "its reply ran past its end"
ENDED_IN_COMMAND = "it ended in a command"


@dataclass
class _Stream:
    """One output stream of a command as it arrives: its bytes up to the nonce, kept within
    the cap; the bytes after the nonce (the status, on stdout)."""

    out: CappedOutput
    pending: bytearray
    done: bool = False
    after: bytes = b""


class ChannelReply:
    """The reply to one request, fed frames as they arrive: the pid line, each stream up to
    its nonce, the status. Byte-exact: nothing is added to or taken from the command's
    output but the channel's own pid line and markers."""

    def __init__(self, nonce: str) -> None:
        self._nonce = nonce.encode()
        self._stdout = _Stream(CappedOutput(), bytearray())
        self._stderr = _Stream(CappedOutput(), bytearray())
        self.pid: int | None = None
        #: The stderr stream began with something other than a pid line.
        self.garbled = False
        self._head = bytearray()
        #: Bytes of output read (both streams).
        self.read = 0

    @property
    def complete(self) -> bool:
        """Both streams reached their nonce, and stdout its status line."""
        return self._stdout.done and self._stderr.done and self._status_line() is not None

    @property
    def capped(self) -> bool:
        return self.read > output.EXEC_READ_CAP

    def feed(self, stdout: bool, data: bytes) -> None:
        self.read += len(data)
        stream = self._stdout if stdout else self._stderr
        if stream.done:
            stream.after += data
            return
        if not stdout and self.pid is None and not self.garbled:
            data = self._take_pid(data)
            if not data:
                return
        stream.pending += data
        at = stream.pending.find(self._nonce)
        if at >= 0:
            stream.out.append(bytes(stream.pending[:at]))
            stream.after = bytes(stream.pending[at + len(self._nonce) :])
            stream.pending.clear()
            stream.done = True
            return
        keep = len(self._nonce) - 1
        if len(stream.pending) > keep:
            cut = len(stream.pending) - keep
            stream.out.append(bytes(stream.pending[:cut]))
            del stream.pending[:cut]

    def _take_pid(self, data: bytes) -> bytes:
        """The pid line at the head of stderr; what follows it."""
        self._head += data
        line, newline, rest = bytes(self._head).partition(b"\n")
        if not newline:
            if len(self._head) > 32 or self._nonce in self._head:
                self.garbled = True
                rest, self._head = bytes(self._head), bytearray()
                return rest
            return b""
        self._head.clear()
        if line.isdigit() and len(line) < 12:
            self.pid = int(line)
            return rest
        self.garbled = True
        return bytes(line + newline + rest)

    def _status_line(self) -> str | None:
        line, newline, _ = self._stdout.after.partition(b"\n")
        if not newline or not line.startswith(b":"):
            return None
        return line[1:].decode("ascii", errors="replace")

    @property
    def unsupported(self) -> bool:
        """The channel left the command to plain exec (nothing of it ran)."""
        return self._status_line() == UNSUPPORTED

    @property
    def started(self) -> bool:
        """The command's shell said its pid: from there on the command may have run."""
        return self.pid is not None

    @property
    def exit_code(self) -> int | None:
        status = self._status_line()
        if status is None or not status.isdigit():
            return None
        return int(status)

    @property
    def trailing(self) -> bool:
        """Bytes after a marker that the protocol does not have: the channel is not the
        engine's to trust any more."""
        status = self._status_line()
        expected = b"" if status is None else b":" + status.encode() + b"\n"
        return self._stdout.after != expected or self._stderr.after not in (b"", b"\n")

    def stdout(self) -> bytes:
        return self._flushed(self._stdout)

    def stderr(self) -> bytes:
        return self._flushed(self._stderr)

    @staticmethod
    def _flushed(stream: _Stream) -> bytes:
        """What the stream holds, its held-back tail included (a reply cut off before its
        nonce keeps every byte that arrived)."""
        if stream.pending:
            stream.out.append(bytes(stream.pending))
            stream.pending.clear()
        return stream.out.value()

    def state(self) -> ReplyState:
        """The reply as `settle` reads it, now."""
        complete = self.complete
        return ReplyState(
            complete=complete,
            started=self.started,
            capped=self.capped,
            left_to_exec=complete
            and not self.started
            and (self.unsupported or self.exit_code == NO_WORKDIR),
            trailing=complete and self.trailing,
        )


@dataclass(frozen=True)
class ReplyState:
    """What settles a reply: each a fact read from its bytes."""

    #: Both streams reached their nonce, and stdout its status line.
    complete: bool
    #: The command's shell said its pid: from there on the command may have run.
    started: bool
    #: Its output went past what is read (output.EXEC_READ_CAP).
    capped: bool
    #: Nothing of the command ran: the channel left it to the engine's exec (a user or a
    #: working folder it cannot give as the exec would, which says what is wrong itself).
    left_to_exec: bool
    #: Complete, with bytes after its end that the protocol does not have.
    trailing: bool


class Carry(Enum):
    """What becomes of the command."""

    #: Run it by plain exec instead (nothing of it ran).
    EXEC = "exec"
    #: It could not be started: never run again by plain exec, which might make it run
    #: twice.
    NOT_STARTED = "not started"
    #: The reply is its result (cut off where the reply was).
    RESULT = "result"


@dataclass(frozen=True)
class Verdict:
    carry: Carry
    #: Why the channel is no longer used (None: it may carry the next command).
    lost: str | None = None
    #: End the command's process group now: the channel was ended under it (only root in
    #: the sandbox can), and the command ends too, as an exec's would with its process.
    kill: bool = False


def settle(reply: ReplyState, deadline_passed: bool) -> Verdict:
    """What `reply` comes to. `deadline_passed`: the command's deadline came before its
    reply was complete (or capped, or the channel ended), so it was killed and given a
    grace to finish. A capped or killed command was already ended by the caller."""
    lost = CAPPED if reply.capped else None
    if lost is None and deadline_passed and not reply.complete:
        lost = OUTLIVED
    if reply.left_to_exec:
        return Verdict(Carry.EXEC, lost)
    if not reply.started:
        return Verdict(Carry.NOT_STARTED, lost or NOT_STARTED)
    if reply.trailing:
        return Verdict(Carry.RESULT, RAN_PAST_END)
    if not reply.complete:
        killed = deadline_passed or reply.capped
        return Verdict(Carry.RESULT, lost or ENDED_IN_COMMAND, kill=not killed)
    return Verdict(Carry.RESULT, lost)
