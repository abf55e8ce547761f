"""`agent_outcome_policy` applied to an episode's agent failures: verify what the agent
left, run the episode again in a fresh sandbox, or end it with no result."""

from __future__ import annotations

from pytest_harbor.agent_outcomes import ENDPOINT_ERROR, AgentOutcomePolicy, EndpointError
from pytest_harbor.display import harbor_logger
from pytest_harbor.engine.failures import EpisodeError, FailureKind
from pytest_harbor.harnesses.base import AgentFailure

__all__ = ["AgentRetries"]

log = harbor_logger()

#: The causes that are the model endpoint's doing (told as they happen, see tell()).
_ENDPOINT_CAUSES = frozenset({"api_error", "rate_limited"})


class AgentRetries:
    """Counts the retries of one episode, per cause."""

    def __init__(self, policy: AgentOutcomePolicy, episode: str | None = None) -> None:
        self._policy = policy
        self._episode = episode
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
        done = self._done.get(failure.cause, 0)
        retries = rule.retries if rule.action == "retry" and not turns_done else done
        pause = rule.backoff_before(done) if done < retries else None
        self.tell(failure, done + 1, retries + 1, pause)
        if rule.action != "retry":
            raise EpisodeError(kind, failure.message)
        if turns_done:
            raise EpisodeError(
                kind,
                f"{failure.message} (in turn {turns_done + 1}: a retry would run the "
                "earlier turns again, so the episode has no result; --harbor-resume runs "
                "it afresh)",
            )
        if pause is None:
            raise EpisodeError(
                kind,
                f"{failure.message} (still after {done} retr{'y' if done == 1 else 'ies'} in "
                "a fresh sandbox)",
            )
        self._done[failure.cause] = done + 1
        return pause

    def tell(self, failure: AgentFailure, attempt: int, attempts: int, pause: float | None) -> None:
        """A failure that is the endpoint's, logged as an EndpointError: the run shows it
        on the terminal at once (the item's log has it too)."""
        if failure.cause not in _ENDPOINT_CAUSES:
            return
        error = EndpointError(
            scope="episode",
            status=failure.status_code,
            message=failure.message,
            attempt=attempt,
            attempts=attempts,
            retry_in_s=pause,
            episode=self._episode,
        )
        log.warning("%s", error.line(self._episode or "?"), extra={ENDPOINT_ERROR: error})
