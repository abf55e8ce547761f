"""What makes a started sandbox ready: the image's ENTRYPOINT and the task's healthcheck."""

from __future__ import annotations

import time
from collections.abc import Callable

from pytest_harbor.engine.failures import EpisodeError, FailureKind
from pytest_harbor.redaction import clip_tail
from pytest_harbor.sandboxes.base import ImageConfig, Sandbox, Spawned
from pytest_harbor.tasks.config import HealthcheckConfig

__all__ = ["entrypoint_failure", "start_entrypoint", "wait_healthy"]


def start_entrypoint(sandbox: Sandbox, config: ImageConfig, workdir: str | None) -> Spawned | None:
    """The sandbox runs a keep-alive instead of the image's ENTRYPOINT: start it (with the
    image's CMD as its arguments, as the image's user), watched by the engine. None when
    the image has none."""
    if not config.entrypoint:
        return None
    return sandbox.spawn(
        [*config.entrypoint, *config.cmd], user=config.user or None, workdir=workdir
    )


def entrypoint_failure(entrypoint: Spawned | None) -> str | None:
    """Why the ENTRYPOINT failed (it exited non-zero), or None while it runs or went fine.
    The engine saw it end: no file in the sandbox can say otherwise."""
    code = None if entrypoint is None else entrypoint.exit_code()
    if entrypoint is None or code in (None, 0):
        return None
    tail = clip_tail(entrypoint.output_tail().strip(), 300)
    return f"the image's ENTRYPOINT exited with code {code}" + (f": {tail}" if tail else "")


def wait_healthy(
    sandbox: Sandbox,
    check: HealthcheckConfig,
    *,
    workdir: str | None,
    user: str | None,
    remaining: Callable[[], float],
) -> None:
    """Run the check until it passes once. Failures in the start period do not count;
    after it, `retries` failures in a row fail the seed. An exec timeout is a failure, and
    so is running out of the episode's time (`remaining`)."""
    started = time.monotonic()
    failures = 0
    while True:
        probe = sandbox.exec(
            ["bash", "-c", check.command],
            workdir=workdir,
            user=user,
            timeout=min(check.timeout_sec, remaining()),
        )
        if probe.exit_code == 0 and not probe.timed_out:
            return
        why = "timed out" if probe.timed_out else f"exited {probe.exit_code}"
        detail = clip_tail((probe.stderr or probe.stdout).strip(), 300)
        if time.monotonic() - started < check.start_period_sec:
            failures, pause = 0, check.start_interval_sec
        else:
            failures, pause = failures + 1, check.interval_sec
        if failures >= check.retries or remaining() <= pause:
            raise EpisodeError(
                FailureKind.HEALTHCHECK_FAILED,
                f"the healthcheck `{check.command}` failed {max(failures, 1)} times in a row "
                f"(last: {why}; {detail})",
            )
        time.sleep(pause)
