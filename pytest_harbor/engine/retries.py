"""`agent_outcome_policy` applied to an episode's agent failures: verify what the agent
left, run the episode again in a fresh sandbox, or end it with no result."""

from __future__ import annotations

from pytest_harbor.agent_outcomes import AgentOutcomePolicy
from pytest_harbor.engine.failures import EpisodeError, FailureKind
from pytest_harbor.harnesses.base import AgentFailure

__all__ = ["AgentRetries"]


class AgentRetries:
    """Counts the retries of one episode, per cause."""

    def __init__(self, policy: AgentOutcomePolicy) -> None:
        self._policy = policy
        self._done: dict[str, int] = {}

    def pause_before_retry(self, failure: AgentFailure, turns_done: int) -> float | None:
        """None to verify; else the seconds to wait before the episode runs again in a
        fresh sandbox (counted as one retry). Raises EpisodeError when the episode ends
        with no result: the rule says so, its retries are spent, or `turns_done` earlier
        turns would have to run again. A cause the sandbox claimed (`failure.claimed`)
        is verified whatever the rule: the agent could have written it."""
        rule = self._policy.rule(failure.cause)
        if rule.action == "verify" or failure.claimed:
            return None
        kind = FailureKind.for_agent_cause(failure.cause)
        if rule.action != "retry":
            raise EpisodeError(kind, failure.message)
        if turns_done:
            raise EpisodeError(
                kind,
                f"{failure.message} (in turn {turns_done + 1}: a retry would run the "
                "earlier turns again, so the episode has no result; --harbor-resume runs "
                "it afresh)",
            )
        done = self._done.get(failure.cause, 0)
        if done >= rule.retries:
            raise EpisodeError(
                kind,
                f"{failure.message} (still after {done} retr{'y' if done == 1 else 'ies'} in "
                "a fresh sandbox)",
            )
        self._done[failure.cause] = done + 1
        return rule.backoff_before(done)
