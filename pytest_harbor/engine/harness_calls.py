"""Calls into a harness under the engine's clock: each in a thread of its own, with a view
of the sandbox that works only while the call may, cancelled and left behind when it runs
past its deadline."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from pytest_harbor.display import harbor_logger
from pytest_harbor.engine.masked_names import mask_folder
from pytest_harbor.harnesses.base import Deadline, ModelGateSlot
from pytest_harbor.redaction import Redactor
from pytest_harbor.sandboxes.base import (
    ArchiveStream,
    ExecResult,
    Sandbox,
    SandboxError,
    SandboxStatus,
    Spawned,
)
from pytest_harbor.sandboxes.copies import HARNESS_COPY, bounded
from pytest_harbor.sandboxes.pipes import OpensPipes, Pipe
from pytest_harbor.threads import join

__all__ = ["HARNESS_GRACE_S", "CallOutcome", "InProcessGate", "SandboxWindow", "call_harness"]

log = harbor_logger()

#: How long a call that ran past its deadline has to return after `cancel` is set, before
#: the episode goes on without it.
HARNESS_GRACE_S = 10.0

T = TypeVar("T")


class SandboxWindow:
    """The sandbox as one harness call sees it. Once the call's deadline passes, nothing
    that changes the sandbox goes through (reads still do, while the call winds down); once
    the call is over, nothing does. Every command is cut off at the deadline."""

    def __init__(self, sandbox: Sandbox, deadline: Deadline, what: str) -> None:
        self._sandbox = sandbox
        self._deadline = deadline
        self._what = what
        self._closed_event = threading.Event()
        #: The pipes the call opened: closed with the window, so none outlives the call.
        self._pipes: list[Pipe] = []
        self._pipes_lock = threading.Lock()

    @property
    def id(self) -> str:
        return self._sandbox.id

    def close(self) -> None:
        self._closed_event.set()
        with self._pipes_lock:
            pipes, self._pipes = self._pipes, []
        for pipe in pipes:
            pipe.close()

    @property
    def is_closed(self) -> bool:
        return self._closed_event.is_set()

    def _may_read(self) -> None:
        if self.is_closed:
            raise SandboxError(f"{self._what} is over: the harness no longer has the sandbox")

    def _may_change(self) -> float:
        self._may_read()
        remaining = self._deadline.remaining()
        if remaining <= 0:
            raise SandboxError(f"{self._what} ran past its deadline: the sandbox is closed to it")
        return remaining

    def exec(
        self,
        command: Sequence[str],
        *,
        user: str | None = None,
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        remaining = self._may_change()
        bounded = remaining if timeout is None else min(timeout, remaining)
        return self._sandbox.exec(
            command, user=user, workdir=workdir, env=env, timeout=bounded, stdin=stdin
        )

    def upload(self, source: Path | Mapping[str, bytes], target: str) -> None:
        self._may_change()
        self._sandbox.upload(source, target)

    def write_archive(self, data: bytes | Iterable[bytes], into: str) -> None:
        self._may_change()
        self._sandbox.write_archive(data, into)

    def read_archive(self, source: str) -> bytes | None:
        self._may_read()
        return self._sandbox.read_archive(source)

    def download(self, source: str) -> dict[str, bytes]:
        self._may_read()
        return self._sandbox.download(source)

    def iter_archive(self, source: str) -> ArchiveStream | None:
        self._may_read()
        chunks = self._sandbox.iter_archive(source)
        return None if chunks is None else bounded(chunks, HARNESS_COPY, f"reading {source}")

    def status(self) -> SandboxStatus:
        self._may_read()
        return self._sandbox.status()

    def snapshot(self, labels: Mapping[str, str]) -> str:
        raise SandboxError("a harness cannot snapshot the sandbox")

    def set_network(self, enabled: bool) -> None:
        raise SandboxError("a harness cannot change the sandbox's network")

    def open_pipe(
        self,
        command: Sequence[str],
        *,
        user: str | None = None,
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Pipe:
        """A command with its input and output joined to the harness (OpensPipes), ended
        when the call ends; SandboxError when the sandbox's provider cannot do that."""
        self._may_change()
        if not isinstance(self._sandbox, OpensPipes):
            raise SandboxError("this sandbox's provider cannot join a command's input and output")
        pipe = self._sandbox.open_pipe(command, user=user, workdir=workdir, env=env)
        with self._pipes_lock:
            if not self.is_closed:
                self._pipes.append(pipe)
                return pipe
        pipe.close()
        raise SandboxError(f"{self._what} is over: the harness no longer has the sandbox")

    def spawn(
        self, command: Sequence[str], *, user: str | None = None, workdir: str | None = None
    ) -> Spawned:
        # What a harness starts must end with its call: exec, whose commands the deadline
        # cuts off, is the way.
        raise SandboxError("a harness cannot leave processes running: use exec")

    def stop(self) -> None:
        raise SandboxError("a harness leaves the sandbox to the episode; it cannot stop it")


@dataclass(frozen=True)
class CallOutcome(Generic[T]):
    """How a harness call ended: its value or exception, and whether it ran past its
    deadline (`overran`) or was still running when the episode went on (`abandoned`)."""

    value: T | None
    error: BaseException | None
    overran: bool
    abandoned: bool
    seconds: float
    #: The exception came from the sandbox after the call lost it (a consequence of the
    #: deadline, not a fault of its own).
    error_after_close: bool = False


def call_harness(
    what: str,
    sandbox: Sandbox,
    seconds: float,
    work: Callable[[SandboxWindow, Deadline, threading.Event], T],
    *,
    grace_s: float = HARNESS_GRACE_S,
    host_dir: Path | None = None,
    redactor: Redactor,
) -> CallOutcome[T]:
    """Run `work(window, deadline, cancel)` in a thread; at the deadline set `cancel` and
    close the window, give it `grace_s` to return, then go on without it. An interrupt
    (Ctrl-C, the backstop) in the waiting thread cancels the call too. Files the call left
    in `host_dir` have secret values masked afterwards, in their content and their names."""
    deadline = Deadline.after(max(seconds, 0.0))
    cancel = threading.Event()
    window = SandboxWindow(sandbox, deadline, what)
    box: dict[str, object] = {}
    closed_at_error = threading.Event()

    def run() -> None:
        try:
            box["value"] = work(window, deadline, cancel)
        except BaseException as error:
            box["error"] = error
            if window.is_closed or deadline.expired:
                closed_at_error.set()
        finally:
            box["ended"] = time.monotonic()

    started = time.monotonic()
    thread = threading.Thread(target=run, name=f"harbor-{what.replace(' ', '-')}", daemon=True)
    thread.start()
    try:
        join(thread, deadline.remaining())
        if thread.is_alive():
            cancel.set()
            join(thread, grace_s)
    except BaseException:
        cancel.set()
        window.close()
        raise
    finally:
        if host_dir is not None:
            mask_folder(host_dir, redactor)
    window.close()
    abandoned = thread.is_alive()
    if abandoned:
        log.warning(
            "%s did not return within %g s of its deadline; going on without it", what, grace_s
        )
    error = box.get("error")
    ended = box.get("ended")
    return CallOutcome(
        value=box.get("value"),  # type: ignore[arg-type]
        error=error if isinstance(error, BaseException) else None,
        overran=not isinstance(ended, float) or ended >= deadline.at,
        abandoned=abandoned,
        seconds=time.monotonic() - started,
        error_after_close=closed_at_error.is_set(),
    )


class _GateSlot:
    def __init__(self, semaphore: threading.BoundedSemaphore) -> None:
        self._semaphore: threading.BoundedSemaphore | None = semaphore

    def release(self) -> None:
        if self._semaphore is not None:
            self._semaphore.release()
            self._semaphore = None


class InProcessGate:
    """A model gate for one process (the engine used from plain Python)."""

    def __init__(self, count: int) -> None:
        self._semaphore = threading.BoundedSemaphore(count)

    def acquire(self, timeout: float) -> ModelGateSlot | None:
        if not self._semaphore.acquire(timeout=max(timeout, 0.0)):
            return None
        return _GateSlot(self._semaphore)
