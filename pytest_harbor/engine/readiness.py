"""What makes a started sandbox ready: the image's ENTRYPOINT and the task's healthcheck."""

from __future__ import annotations

import time
from collections.abc import Callable

from pytest_harbor.engine.failures import EpisodeError, FailureKind
from pytest_harbor.engine.verification import ENTRYPOINT_EXIT, RUN_DIR
from pytest_harbor.sandboxes.base import ImageConfig, Sandbox, SandboxError
from pytest_harbor.tasks.config import HealthcheckConfig

__all__ = ["entrypoint_failure", "start_entrypoint", "wait_healthy"]

# Starts "$@" in the background, keeping its output and its exit code.
_BACKGROUND = (
    f'( "$@" > {RUN_DIR}/entrypoint.log 2>&1; echo $? > {RUN_DIR}/{ENTRYPOINT_EXIT} ) '
    "> /dev/null 2>&1 &"
)


def start_entrypoint(sandbox: Sandbox, config: ImageConfig, workdir: str | None) -> bool:
    """The sandbox runs a keep-alive instead of the image's ENTRYPOINT: start it (with the
    image's CMD as its arguments, as the image's user). Returns whether there was one."""
    if not config.entrypoint:
        return False
    started = sandbox.exec(
        ["/bin/sh", "-c", _BACKGROUND, "sh", *config.entrypoint, *config.cmd],
        user=config.user or None,
        workdir=workdir,
        timeout=30.0,
    )
    if started.exit_code != 0:
        raise SandboxError(f"cannot start the image's ENTRYPOINT: {started.stderr.strip()}")
    return True


def entrypoint_failure(sandbox: Sandbox) -> str | None:
    """Why the ENTRYPOINT failed (it exited non-zero), or None while it runs or went fine."""
    exit_file = sandbox.download(f"{RUN_DIR}/{ENTRYPOINT_EXIT}").get(ENTRYPOINT_EXIT)
    if exit_file is None:
        return None
    code = exit_file.decode().strip()
    if code in ("", "0"):
        return None
    log_tail = sandbox.download(f"{RUN_DIR}/entrypoint.log").get("entrypoint.log", b"")
    tail = log_tail.decode("utf-8", errors="replace").strip()[-300:]
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
        detail = (probe.stderr or probe.stdout).strip()[-300:]
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
