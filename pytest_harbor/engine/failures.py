"""The failure kinds an episode can end with."""

from __future__ import annotations

__all__ = ["FailureKind"]


class FailureKind:
    """The `failure_kind` strings this package writes (low cardinality, safe as labels)."""

    REWARD_MISSING = "harbor:reward_missing"
    REWARD_INVALID = "harbor:reward_invalid"
    VERIFIER_TIMEOUT = "harbor:verifier_timeout"
    VERIFIER_ERROR = "harbor:verifier_error"
    ENTRYPOINT_FAILED = "harbor:entrypoint_failed"
    SANDBOX_LOST = "harbor:sandbox_lost"
    SOLUTION_FAILED = "harbor:solution_failed"
    AGENT_TIMEOUT = "agent_timeout"
    SANDBOX_START_FAILED = "harbor:sandbox_start_failed"
    EPISODE_TIMEOUT = "harbor:episode_timeout"
    DIGEST_MISMATCH = "harbor:digest_mismatch"
