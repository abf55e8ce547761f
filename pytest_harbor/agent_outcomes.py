"""Why an agent's turn failed, and what an episode does about it: `agent_outcome_policy`."""

from __future__ import annotations

import re
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "AGENT_CAUSES",
    "ENDPOINT_ERROR",
    "AgentCause",
    "AgentOutcomePolicy",
    "EndpointError",
    "OutcomeAction",
    "OutcomeRule",
]

#: The classified causes a harness (or the engine) gives for an agent turn that failed.
AgentCause = Literal[
    "timeout",
    "rate_limited",
    "api_error",
    "context_length_exceeded",
    "agent_crashed",
    "tools_unavailable",
]
AGENT_CAUSES: tuple[str, ...] = get_args(AgentCause)

#: `verify`: grade what the agent left; `retry`: run the episode again in a fresh sandbox;
#: `fail`: no result (a failures row, retried by --harbor-resume).
OutcomeAction = Literal["verify", "retry", "fail"]


class OutcomeRule(BaseModel):
    """What to do about one cause. Written `verify`, `fail`, `retry`, or in full
    `{action: retry, retries: 2, backoff_s: 30}`; after the last retry the episode fails."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    action: OutcomeAction
    #: How many times `retry` runs the episode again before it fails.
    retries: int = Field(default=2, ge=0)
    #: The pause before the first retry; it doubles for each further one.
    backoff_s: float = Field(default=30.0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _from_word(cls, value: Any) -> Any:
        return {"action": value} if isinstance(value, str) else value

    def backoff_before(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (0 for the first)."""
        return float(self.backoff_s * 2**retry)

    @property
    def total_backoff_s(self) -> float:
        return sum(self.backoff_before(n) for n in range(self.retries))


class AgentOutcomePolicy(BaseModel):
    """One rule per cause; a partial table keeps the defaults of the causes it leaves out.

    Defaults: what the agent did counts when it ran out of time, overflowed its context or
    crashed (the verifier grades the sandbox as it is); a rate limit or an API error is the
    endpoint's doing, so the episode runs again, twice, and then has no result. A required
    MCP server that cannot be reached leaves the episode without a result.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout: OutcomeRule = OutcomeRule(action="verify")
    rate_limited: OutcomeRule = OutcomeRule(action="retry")
    api_error: OutcomeRule = OutcomeRule(action="retry")
    context_length_exceeded: OutcomeRule = OutcomeRule(action="verify")
    agent_crashed: OutcomeRule = OutcomeRule(action="verify")
    #: An MCP server `task_mcp_grants = required` grants could not be reached before the
    #: agent's first turn (after a later turn, the agent may have broken it: scored).
    tools_unavailable: OutcomeRule = OutcomeRule(action="fail")

    def rule(self, cause: str) -> OutcomeRule:
        rule: OutcomeRule = getattr(self, cause)
        return rule

    @property
    def most_retries(self) -> OutcomeRule | None:
        """The retry rule that can take longest, for sizing the backstop."""
        retrying = [
            self.rule(cause) for cause in AGENT_CAUSES if self.rule(cause).action == "retry"
        ]
        if not retrying:
            return None
        return max(retrying, key=lambda rule: (rule.retries, rule.total_backoff_s))


#: The key under which a log record carries an EndpointError (`extra=`): the run's plugin
#: shows such a record on the terminal as it happens, not only in the item's captured log.
ENDPOINT_ERROR = "harbor_endpoint_error"
#: What a harness and the engine add to an endpoint's words: a prefix naming the status
#: ("the endpoint refused the request (HTTP 400): "), and notes at the end: the tries
#: ("(after 6 attempts)"), what the model relay saw ("(the model relay saw HTTP 500)").
_HARNESS_WORDS = re.compile(
    r"^[^:]*\(HTTP \d{3}\): "
    r"|(\s\((after \d+ attempts|the model relay saw [^()]*|it gave [^()]*)\))+$"
)


class EndpointError(BaseModel):
    """A model request the endpoint failed (an HTTP error, or no answer), as it happened:
    a request a harness tries again (`request`), an episode's agent that failed for it
    (`episode`), or an answer the model relay passed on to an agent in the sandbox, which
    retries on its own (`relay`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scope: Literal["request", "episode", "relay"]
    #: The HTTP status (None: no answer, or a broken one).
    status: int | None = None
    #: The endpoint's words as the harness gave them (the secrets masked).
    message: str
    #: Which try this was, of how many at most.
    attempt: int = Field(ge=1)
    attempts: int = Field(ge=1)
    #: The pause before the next try (None: no further try).
    retry_in_s: float | None = None
    #: The episode (None: the plugin names the item that was running).
    episode: str | None = None

    @property
    def words(self) -> str:
        """The endpoint's words without the harness's prefix."""
        return _HARNESS_WORDS.sub("", self.message)

    @property
    def key(self) -> tuple[int | None, str]:
        """Errors with the same key are the same error (shown a few times, then counted)."""
        return self.status, self.words

    def line(self, episode: str) -> str:
        """One line for a person: `<episode>: model endpoint answered 400: ... (...)`."""
        answered = "failed" if self.status is None else f"answered {self.status}"
        return f"{self.episode or episode}: model endpoint {answered}: {self.words} ({self._then})"

    @property
    def _then(self) -> str:
        if self.scope == "relay":
            return "passed on to the agent by the model relay"
        if self.scope == "request":
            if self.retry_in_s is None:
                return "request not tried again"
            tried = f"request attempt {self.attempt} of {self.attempts}"
            return f"{tried}, retrying in {self.retry_in_s:.3g} s"
        tried = f"episode attempt {self.attempt} of {self.attempts}"
        if self.retry_in_s is None:
            return f"{tried}, no further try"
        return f"{tried}, retrying in {self.retry_in_s:.3g} s in a fresh sandbox"
