"""Sandboxes started ahead of their episodes: while one episode works, the next one's
images are made and its sandbox started (and surveyed) in the background, so that its
seed finds it up. A sandbox started ahead waits for its episode at most
`started_ahead_idle_s`, then is removed; one the engine has lost by the time its episode
takes it is not used. Either way the seed starts a fresh one."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from pytest_harbor.display import harbor_logger
from pytest_harbor.engine.failures import EpisodeError, start_failure
from pytest_harbor.engine.launcher import SandboxLauncher
from pytest_harbor.engine.processes import SandboxSurvey
from pytest_harbor.sandboxes.base import Sandbox, SandboxError, TellsLiveness
from pytest_harbor.threads import join

__all__ = ["Background", "EarlyStart"]

log = harbor_logger()

T = TypeVar("T")


class Background(Generic[T]):
    """Two steps run in a thread of their own: `prepare()`, then `start()` (which gives
    the result). What each raised is kept for the caller to raise in its own thread."""

    def __init__(self, prepare: Callable[[], object], start: Callable[[], T]) -> None:
        self.result: T | None = None
        self.prepare_error: EpisodeError | None = None
        self.start_error: EpisodeError | None = None
        self._prepare = prepare
        self._start = start
        self._thread = threading.Thread(target=self._run, name="harbor-early", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._prepare()
        except EpisodeError as error:
            self.prepare_error = error
            return
        try:
            self.result = self._start()
        except EpisodeError as error:
            self.start_error = error
        except SandboxError as error:
            self.start_error = start_failure(error)

    def join(self) -> None:
        join(self._thread)


class EarlyStart:
    """An episode's images made and sandbox started in the background, ahead of its
    seed (Episode.start_early): with its survey too when nothing else starts in it at
    the seed (taken while the episode before it still works)."""

    def __init__(self, launcher: SandboxLauncher) -> None:
        self._launcher = launcher
        self._background: Background[tuple[Sandbox, SandboxSurvey | None]] | None = None
        #: Removes the sandbox once it has waited `started_ahead_idle_s` (armed when it
        #: is up); `expired` says it did.
        self._idle: threading.Timer | None = None
        self._lock = threading.Lock()
        self._claimed = False
        self.expired = False

    @property
    def begun(self) -> bool:
        return self._background is not None

    def begin(self) -> None:
        if self._background is None:
            self._background = Background(self._launcher.prepare, self._start)

    def _start(self) -> tuple[Sandbox, SandboxSurvey | None]:
        sandbox = self._launcher.start_agent_sandbox()
        survey = self._launcher.survey(sandbox) if self._launcher.nothing_starts_at_seed else None
        with self._lock:
            if not self._claimed:
                self._idle = threading.Timer(
                    self._launcher.settings.started_ahead_idle_s, self._expire, (sandbox,)
                )
                self._idle.daemon = True
                self._idle.start()
        return sandbox, survey

    def _expire(self, sandbox: Sandbox) -> None:
        """Waited too long for its episode: removed (the seed will start a fresh one)."""
        with self._lock:
            if self._claimed:
                return
            self.expired = True
        log.info(
            "sandbox %s, started ahead, waited %g s for its episode: removed",
            sandbox.id,
            self._launcher.settings.started_ahead_idle_s,
        )
        self._launcher.stop(sandbox)

    def _claim(self) -> bool:
        """The sandbox started ahead is the caller's now: False when it expired."""
        with self._lock:
            self._claimed = True
            if self._idle is not None:
                self._idle.cancel()
            return not self.expired

    def prepared(self) -> bool:
        """Whether the images were made in the background (raises what that raised)."""
        if self._background is None:
            return False
        self._background.join()
        if self._background.prepare_error is not None:
            raise self._background.prepare_error
        return True

    def take(self) -> tuple[Sandbox, SandboxSurvey | None] | None:
        """The sandbox started ahead (raises what its start raised); None when none was,
        when it waited past `started_ahead_idle_s`, or when the engine has lost it since
        (an engine restarted meanwhile): the seed starts a fresh one then."""
        background, self._background = self._background, None
        if background is None:
            return None
        background.join()
        if background.start_error is not None:
            raise background.start_error
        if not self._claim():
            return None
        if background.result is not None:
            sandbox = background.result[0]
            try:
                if isinstance(sandbox, TellsLiveness):
                    alive = sandbox.alive()
                else:
                    status = sandbox.status()
                    alive = status.present and status.running
            except SandboxError:
                alive = False
            if not alive:
                log.warning("sandbox %s, started ahead, is gone; starting a fresh one", sandbox.id)
                self._launcher.stop(sandbox)
                return None
        return background.result

    def abandon(self) -> Sandbox | None:
        """At cleanup: the sandbox started ahead, for removal, whatever came of it."""
        background, self._background = self._background, None
        if background is None:
            return None
        background.join()
        if not self._claim():
            return None  # removed already
        return None if background.result is None else background.result[0]
