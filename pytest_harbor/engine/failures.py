"""The failure kinds an episode can end with."""

from __future__ import annotations

import errno
from pathlib import Path

__all__ = ["EngineGone", "EpisodeError", "FailureKind", "disk_full", "start_failure"]


class FailureKind:
    """The `failure_kind` strings this package writes (low cardinality, safe as labels)."""

    REWARD_MISSING = "harbor:reward_missing"
    REWARD_INVALID = "harbor:reward_invalid"
    VERIFIER_TIMEOUT = "harbor:verifier_timeout"
    VERIFIER_ERROR = "harbor:verifier_error"
    #: The agent changed what the verifier needs (its folders, the image's bash): scored 0.
    VERIFIER_TAMPERED = "harbor:verifier_tampered"
    #: Something in the sandbox ran out of memory (killed by the kernel) or of processes
    #: (the pids cap) and a step of the engine failed for it: scored 0.
    SANDBOX_EXHAUSTED = "harbor:sandbox_exhausted"
    #: The artifacts for a separate verifier were over a copy's caps (pytest_harbor/
    #: sandboxes/copies.py): the agent left them, so scored 0.
    ARTIFACTS_OVER_CAP = "harbor:artifacts_over_cap"
    ENTRYPOINT_FAILED = "harbor:entrypoint_failed"
    SANDBOX_LOST = "harbor:sandbox_lost"
    SOLUTION_FAILED = "harbor:solution_failed"
    AGENT_TIMEOUT = "agent_timeout"
    #: An agent turn that failed for a classified cause (see `agent_outcome_policy`).
    AGENT_RATE_LIMITED = "agent_rate_limited"
    AGENT_API_ERROR = "agent_api_error"
    AGENT_CONTEXT_LENGTH_EXCEEDED = "agent_context_length_exceeded"
    AGENT_CRASHED = "agent_crashed"
    AGENT_TOOLS_UNAVAILABLE = "agent_tools_unavailable"
    SANDBOX_START_FAILED = "harbor:sandbox_start_failed"
    EPISODE_TIMEOUT = "harbor:episode_timeout"
    DIGEST_MISMATCH = "harbor:digest_mismatch"
    HEALTHCHECK_FAILED = "harbor:healthcheck_failed"
    #: A step's workdir/ could not be copied in, or its setup.sh failed or ran out of time.
    STEP_SETUP_FAILED = "harbor:step_setup_failed"
    #: A Python verifier that could not be called as declared (a `response` it requires
    #: where there is none, a Python older than 3.8, a return that is not a reward).
    VERIFIER_CONTRACT = "harbor:verifier_contract"
    QUEUE_TIMEOUT = "harbor:queue_timeout"
    #: No room left on the device of the results folder (or the engine's): no result,
    #: and --harbor-resume runs it again once there is room.
    DISK_FULL = "harbor:disk_full"
    BUDGET_REFUSED = "harbor:budget_refused"
    #: The run's spend reached --harbor-max-cost or --harbor-max-tokens: the episode did
    #: not start, or a call of its agent was refused. No result; a resume runs it again.
    BUDGET_SPENT = "harbor:budget_spent"
    #: --harbor-replay had no recorded answer for a call of the agent's.
    REPLAY_MISS = "harbor:replay_miss"
    #: The run's model relay did not answer the engine.
    RELAY_FAILED = "harbor:relay_failed"
    TASK_REFUSED = "harbor:task_refused"
    MIN_REWARD_MISSED = "harbor:min_reward_missed"
    #: No result, and not the engine's doing: the process running the episode died, the
    #: run was interrupted, or the episode raised something unforeseen.
    WORKER_DIED = "harbor:worker_died"
    INTERRUPTED = "harbor:interrupted"
    INTERNAL_ERROR = "harbor:internal_error"

    #: Failures a resumed run does not retry: the same task and settings fail the same way.
    TERMINAL = frozenset({DIGEST_MISMATCH, BUDGET_REFUSED, TASK_REFUSED})

    @staticmethod
    def for_agent_cause(cause: str) -> str:
        """The failure kind of an agent turn that failed for `cause`."""
        return {
            "timeout": FailureKind.AGENT_TIMEOUT,
            "rate_limited": FailureKind.AGENT_RATE_LIMITED,
            "api_error": FailureKind.AGENT_API_ERROR,
            "context_length_exceeded": FailureKind.AGENT_CONTEXT_LENGTH_EXCEEDED,
            "agent_crashed": FailureKind.AGENT_CRASHED,
            "tools_unavailable": FailureKind.AGENT_TOOLS_UNAVAILABLE,
        }[cause]


class EpisodeError(Exception):
    """An episode that cannot produce a result (no row), with its failure kind."""

    __module__ = "pytest_harbor"

    def __init__(self, failure_kind: str, reason: str) -> None:
        self.failure_kind = failure_kind
        self.reason = reason
        super().__init__(reason)


def disk_full(error: BaseException, where: Path) -> EpisodeError | None:
    """The episode's failure when `error` says a device is full (writing below `where`),
    else None."""
    if not isinstance(error, OSError) or error.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    target = error.filename or where
    return EpisodeError(
        FailureKind.DISK_FULL,
        f"no space left on the device of {target} ({error.strerror}): free some and "
        "run the same command with --harbor-resume",
    )


def start_failure(error: BaseException) -> EpisodeError:
    """The failure of an episode whose images or sandbox could not be made: the engine's
    disk full (its words name the path), else the start failed."""
    text = str(error)
    if "no space left on device" in text.lower():
        return EpisodeError(FailureKind.DISK_FULL, f"the engine's disk is full: {text}")
    return EpisodeError(FailureKind.SANDBOX_START_FAILED, text)


class EngineGone(EpisodeError):
    """The sandbox engine stopped answering and did not answer again within
    `engine_recovery_timeout_s`: this episode has no result, and the run stops (one
    message; --harbor-resume goes on from there)."""

    __module__ = "pytest_harbor"
