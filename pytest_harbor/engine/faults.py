"""Whose fault a failed step is, once an agent has had the sandbox.

A failure the agent cannot have caused takes the sample out of the score (masked); a
failure it can have caused scores the episode 0, or a policy learns to cause it. Nothing
in the sandbox decides which: the engine asks its provider how the sandbox is (status()),
and only what the provider sees is trusted. An engine that does not answer, or a sandbox
that is gone or stopped (nothing inside a sandbox can stop or remove it), is the engine's
fault, unless a root agent has had it (root can end the first process); a sandbox that
still runs is the sandbox's: whatever made the step fail is in it.
"""

from __future__ import annotations

from pytest_harbor.display import harbor_logger
from pytest_harbor.engine.failures import EpisodeError, FailureKind
from pytest_harbor.engine.rewards import RewardReading
from pytest_harbor.redaction import Redactor
from pytest_harbor.sandboxes.base import EngineUnreachable, Sandbox, SandboxError

__all__ = ["blame", "fault"]

log = harbor_logger()


def blame(
    sandbox: Sandbox, error: SandboxError, doing: str, *, root_had_it: bool = False
) -> RewardReading | None:
    """`doing` failed with `error` after an agent had `sandbox`: the reading that scores
    the episode 0 when the sandbox is to blame, or None when the engine is (the caller
    masks the sample, or ends the episode with no result). With `root_had_it` (a root
    agent has had the sandbox), a sandbox that stopped is to blame: root can end the
    first process (by lowering its limits as its own uid, then making it start a
    program). An engine that could not be reached for the step is to blame whatever it
    says of the sandbox afterwards (one shutting down still answers on connections it
    has open)."""
    if isinstance(error, EngineUnreachable):
        return None
    try:
        status = sandbox.status()
    except SandboxError:
        return None
    if status.out_of_memory:
        return RewardReading.failed(
            FailureKind.SANDBOX_EXHAUSTED,
            f"{doing} failed ({error}): a process in the sandbox ran out of memory and the "
            "kernel killed it",
        )
    if status.present and not status.running and root_had_it:
        return RewardReading.failed(
            FailureKind.VERIFIER_TAMPERED,
            f"{doing} failed ({error}): the sandbox stopped, which a root agent can bring "
            "about (its first process ended)",
        )
    if not status.present or not status.running:
        return None
    if status.out_of_processes:
        return RewardReading.failed(
            FailureKind.SANDBOX_EXHAUSTED,
            f"{doing} failed ({error}): the sandbox holds as many processes as its pids cap allows",
        )
    return RewardReading.failed(
        FailureKind.VERIFIER_TAMPERED,
        f"{doing} failed in a sandbox that still runs, because of what is in it: {error}",
    )


def fault(
    sandbox: Sandbox,
    error: SandboxError,
    doing: str,
    *,
    episode: str,
    redactor: Redactor,
    root_had_it: bool = False,
) -> RewardReading:
    """The reading of a step of `episode` that failed once an agent had `sandbox`: scored
    0 when the sandbox is to blame (logged; blame()), a masked sample
    (`harbor:sandbox_lost`) when the engine is. An engine that could not be reached at
    all for the step ends the episode with no result (EpisodeError, `harbor:sandbox_lost`),
    as a sandbox lost during the agent's turn does: --harbor-resume runs it again."""
    if isinstance(error, EngineUnreachable):
        raise EpisodeError(FailureKind.SANDBOX_LOST, f"{doing}: {redactor.text(str(error))}")
    blamed = blame(sandbox, error, doing, root_had_it=root_had_it)
    if blamed is not None:
        log.warning("%s: %s", episode, redactor.text(blamed.failure_reason or ""))
        return blamed
    return RewardReading.failed(FailureKind.SANDBOX_LOST, f"{doing}: {error}", masked=True)
