"""When the sandbox engine stops answering mid-run (dockerd restarted, say): episodes
running on it lose their sandboxes (`harbor:sandbox_lost`, no result, run again by
--harbor-resume); a sandbox that cannot start waits for the engine to answer again and
starts then, so the run goes on; an engine that stays silent past
`engine_recovery_timeout_s` stops the run with one message (EngineGone)."""

from __future__ import annotations

import time

from pytest_harbor.display import harbor_logger
from pytest_harbor.engine.failures import EngineGone, FailureKind
from pytest_harbor.sandboxes.base import (
    ReadinessCheck,
    SandboxError,
    SandboxProvider,
    SandboxStartError,
)

__all__ = ["came_back"]

log = harbor_logger()

_POLL_S = 1.0


def came_back(provider: SandboxProvider, error: SandboxStartError, timeout_s: float) -> bool:
    """After a start failed with `error`: True when the engine did not answer and answers
    again (start again), False when it answers (the failure was something else); raises
    EngineGone when it stays silent for `timeout_s`."""
    if not isinstance(provider, ReadinessCheck) or _answers(provider):
        return False
    started = time.monotonic()
    log.warning("the sandbox engine does not answer (%s); waiting up to %g s", error, timeout_s)
    while time.monotonic() - started < timeout_s:
        time.sleep(_POLL_S)
        if _answers(provider):
            log.warning(
                "the sandbox engine answers again after %.0f s; going on",
                time.monotonic() - started,
            )
            return True
    raise EngineGone(
        FailureKind.SANDBOX_START_FAILED,
        f"{error}; the engine has not answered for {timeout_s:g} s "
        "(engine_recovery_timeout_s): the run stops here, and the same command with "
        "--harbor-resume goes on from here",
    )


def _answers(provider: ReadinessCheck) -> bool:
    try:
        provider.check_ready()
    except SandboxError:
        return False
    return True
