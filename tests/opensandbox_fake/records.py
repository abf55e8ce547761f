"""What the fake keeps: its sandboxes, what execd knows of itself, its commands (with
Go's names of signals), and the state the parts of FakeOpenSandbox share."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import docker

from tests.opensandbox_fake.faults import Faults
from tests.opensandbox_fake.wire import _go_time, _now

SIGKILL = 9
SIGTERM = 15
#: What Go's syscall.Signal.String() says of each signal (ExitError: "signal: killed").
GO_SIGNALS = {
    1: "hangup",
    2: "interrupt",
    3: "quit",
    4: "illegal instruction",
    5: "trace/breakpoint trap",
    6: "aborted",
    7: "bus error",
    8: "floating point exception",
    9: "killed",
    10: "user defined signal 1",
    11: "segmentation fault",
    12: "user defined signal 2",
    13: "broken pipe",
    14: "alarm clock",
    15: "terminated",
    16: "stack fault",
    24: "CPU time limit exceeded",
    25: "file size limit exceeded",
    26: "virtual timer expired",
    27: "profiling timer expired",
    29: "I/O possible",
    30: "power failure",
    31: "bad system call",
}


@dataclass(frozen=True)
class _Probe:
    """What execd knows of its own process, found by asking the container once."""

    shell: str  # full path of bash, else of sh (execd's getShell, through PATH)
    home: str
    uid: int
    notes_signals: bool  # NOTING_WRAPPER works here (else PLAIN_WRAPPER)


@dataclass
class _Sandbox:
    id: str
    container_id: str
    env: dict[str, str]  # the container's Config.Env: what execd inherits
    workdir: str
    probe: _Probe | None = None
    #: Its egress sidecar's token, the namespace it enforces in (a process's pid), the
    #: nameservers let through and the policy (empty, 0, None: no sidecar).
    egress_token: str = ""
    egress_pid: int = 0
    nameservers: list[str] = field(default_factory=list)
    policy: dict[str, Any] | None = None


@dataclass
class _Command:
    """execd's commandKernel: the status a command id answers with."""

    id: str
    content: str
    background: bool
    started_at: datetime
    output_path: str = ""
    pid: int = 0
    pid_known: threading.Event = field(default_factory=threading.Event)
    running: bool = True
    exit_code: int | None = None
    error: str = ""
    finished_at: datetime | None = None
    #: Set when the fake signalled the group (timeout, interrupt): 128+n then means -1.
    signalled: bool = False

    def set_pid(self, pid: int) -> None:
        self.pid = pid
        self.pid_known.set()

    def finish(self, code: int, signal: int = 0, core: bool = False) -> None:
        """Records the exit as Go reports it: -1 and "signal: …" for a death by signal."""
        if not signal and self.signalled and code in (128 + SIGKILL, 128 + SIGTERM):
            signal = code - 128  # no note from the wrapper: the fake's own signal, surely
        if signal:
            self.exit_code = -1
            name = GO_SIGNALS.get(signal, f"signal {signal}")
            self.error = f"signal: {name}" + (" (core dumped)" if core else "")
        else:
            self.exit_code = code
            self.error = f"exit status {code}" if code else ""
        self.finished_at = _now()
        self.running = False

    def status(self) -> dict[str, object]:
        answer: dict[str, object] = {"id": self.id, "content": self.content}
        answer["running"] = self.running
        if self.exit_code is not None:
            answer["exit_code"] = self.exit_code
        if self.error:
            answer["error"] = self.error
        answer["started_at"] = _go_time(self.started_at)
        if self.finished_at is not None:
            answer["finished_at"] = _go_time(self.finished_at)
        return answer


class _State:
    """What FakeOpenSandbox.__init__ sets, declared for the classes it is made of."""

    domain: str
    _client: docker.DockerClient
    _grace_s: float
    _min_timeout_s: int
    _instance: str
    _lock: threading.Lock
    _sandboxes: dict[str, _Sandbox]
    _commands: dict[str, _Command]
    _expirations: dict[str, datetime]
    _timers: dict[str, threading.Timer]
    faults: Faults
    egress_mode: str | None
    max_creating: int | None
    creating: int
    most_creating: int
    refused_creates: int
