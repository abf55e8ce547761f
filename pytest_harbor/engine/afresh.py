"""A sandbox the engine lost before any agent had it is started again.

Nothing of the episode has happened in such a sandbox: no agent has worked in it, so a
fresh one is the same episode, not a second try at it. An engine restarted mid-run
loses every sandbox it held, those started ahead of their episodes (EarlyStart) and
those being seeded as well as those agents work in; only the last are the episodes it
was running. Whether the engine lost the sandbox is asked of the provider (never of
anything inside the sandbox), and a loop of losses is bounded."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_harbor.display import harbor_logger
from pytest_harbor.engine.failures import EpisodeError
from pytest_harbor.engine.recovery import came_back
from pytest_harbor.redaction import Redactor
from pytest_harbor.sandboxes.base import (
    EngineUnreachable,
    Sandbox,
    SandboxError,
    SandboxStartError,
)

if TYPE_CHECKING:
    from pytest_harbor.engine.launcher import SandboxLauncher

__all__ = ["FRESH_STARTS", "FreshStarts", "engine_lost"]

log = harbor_logger()

#: Fresh sandboxes an episode may take for ones the engine lost before any agent had
#: them; past that, the loss is the episode's failure as before.
FRESH_STARTS = 2


def engine_lost(sandbox: Sandbox | None, error: SandboxError) -> bool:
    """Whether `error` came of the engine losing `sandbox`: its engine did not answer,
    or the provider says the sandbox is gone or stopped (or cannot say)."""
    if isinstance(error, EngineUnreachable):
        return True
    if sandbox is None:
        return False
    try:
        status = sandbox.status()
    except SandboxError:
        return True
    return not (status.present and status.running)


class FreshStarts:
    """An episode's fresh starts, up to FRESH_STARTS."""

    def __init__(
        self, episode: str, launcher: SandboxLauncher, redactor: Redactor, wait_s: float
    ) -> None:
        self._episode = episode
        self._launcher = launcher
        self._redactor = redactor
        self._wait_s = wait_s
        self.taken = 0

    def take(self, sandbox: Sandbox | None, error: SandboxError, failure: EpisodeError) -> None:
        """Before any agent, `error` happened to `sandbox`: when the engine lost it, drop
        it and wait for the engine to answer (the caller seeds afresh); else, or past
        FRESH_STARTS, raise `failure`."""
        if self.taken >= FRESH_STARTS or not engine_lost(sandbox, error):
            raise failure from None
        self.taken += 1
        log.warning(
            "%s: the engine lost the sandbox before any agent had it (%s); starting a fresh one",
            self._episode,
            self._redactor.text(str(error)),
        )
        if sandbox is not None:
            self._launcher.stop(sandbox)
        came_back(self._launcher.provider, SandboxStartError(str(error)), self._wait_s)
