"""The model as an episode's harness reaches it: through the run's relay, never directly.

Each attempt of an episode gets a token of its own from the relay, valid for the run's
model only and dead once the attempt ends; the harness is given the relay's address and
that token, never the endpoint's key. A harness whose agent calls its model from inside
the sandbox (a CLI agent) gets the relay's route into the sandbox for each agent phase,
whatever else that phase's network allows: by the relay's name through the sandbox's
egress, or, for a sandbox with the whole network and no egress, at the address of this
machine its network reaches. What a turn's calls took, and the causes their answers
showed, are the relay's books, read after the turn: never the agent's own account.
"""

from __future__ import annotations

import dataclasses

from pydantic import SecretStr

from pytest_harbor.agent_outcomes import AgentCause
from pytest_harbor.display import harbor_logger
from pytest_harbor.engine.failures import EpisodeError, FailureKind
from pytest_harbor.engine.relay_errors import RelayErrorWatch
from pytest_harbor.harnesses.base import AgentFailure, AgentRun, Harness, Usage
from pytest_harbor.harnesses.model import ModelConfig
from pytest_harbor.relay import Counts, GrantReport, GrantRequest, RelayClient, RelayError
from pytest_harbor.sandboxes.base import (
    RELAY_NAME,
    ReachesThisMachine,
    Sandbox,
    SandboxError,
)

__all__ = ["ModelAccess", "in_sandbox"]

log = harbor_logger()

#: Causes only an endpoint's answers can show: with a relay, an agent's claim of one that
#: the relay did not see is a crash.
_ENDPOINT_CAUSES = frozenset({"rate_limited", "api_error"})


def in_sandbox(harness: Harness) -> bool:
    """Whether the harness's agent calls its model from inside the sandbox."""
    return bool(getattr(harness, "model_in_sandbox", False))


@dataclasses.dataclass(frozen=True)
class TurnCalls:
    """What one turn's model calls took and showed, from the relay's books."""

    counts: Counts
    causes: tuple[tuple[str, str], ...]
    refused_for_budget: int
    replay_misses: tuple[str, ...]


class ModelAccess:
    """One episode's way to its model (see the module's docstring). Without a relay (the
    Python API, when the caller starts none) the harness is handed the model as given."""

    def __init__(
        self,
        model: ModelConfig | None,
        relay: RelayClient | None,
        harness: Harness,
        *,
        cassette: str,
        episode: str,
    ) -> None:
        self.model = model
        self.relay = relay if model is not None else None
        self.in_sandbox = in_sandbox(harness)
        self._cassette = cassette
        self._episode = episode
        self._token: str | None = None
        self._seen = GrantReport()
        self._sandbox_url: str | None = None
        #: While an agent in the sandbox works: its calls' failed answers, told at once.
        self._watch: RelayErrorWatch | None = None

    @property
    def relayed(self) -> bool:
        return self.relay is not None

    @property
    def routes_into_sandbox(self) -> bool:
        """The relay's route goes into the sandbox in every agent phase (so a sandbox
        whose agent has no network still needs an egress)."""
        return self.relay is not None and self.in_sandbox

    def for_harness(self) -> ModelConfig | None:
        """The model as the harness is given it: the relay's address and this attempt's
        token in place of the endpoint's URL and key."""
        model, relay = self.model, self.relay
        if model is None or relay is None:
            return model
        return model.model_copy(
            update={
                "base_url": relay.host_url,
                "api_key": SecretStr(self._token or "no-token"),
                "sandbox_base_url": self._sandbox_url,
            }
        )

    # ------------------------------------------------------------------ attempts

    def begin_attempt(self) -> None:
        """A token for a new attempt (the last one's ended, its spend set apart); raises
        EpisodeError when the run's budget is spent."""
        relay, model = self.relay, self.model
        if relay is None or model is None:
            return
        if self._token is not None:
            self._end()
        try:
            spend = relay.spend()
            if spend.budget_reached is not None:
                raise EpisodeError(
                    FailureKind.BUDGET_SPENT, f"not started: the run's {spend.budget_reached}"
                )
            names = {model.name, model.name.rsplit("/", 1)[-1]}
            self._token = relay.grant(
                GrantRequest(
                    episode=self._episode, models=tuple(sorted(names)), cassette=self._cassette
                )
            )
        except RelayError as error:
            raise EpisodeError(FailureKind.RELAY_FAILED, str(error)) from None
        self._seen = GrantReport()

    def end(self) -> None:
        """The attempt's token dies (idempotent)."""
        if self._token is not None:
            self._end()

    def _end(self) -> GrantReport:
        self._stop_watching()
        token, self._token = self._token, None
        assert token is not None and self.relay is not None
        try:
            return self.relay.end(token)
        except RelayError as error:
            log.warning("%s: %s", self._episode, error)
            return self._seen

    # ------------------------------------------------------------------ phases

    def open_turn(self, sandbox: Sandbox, *, filtered: bool) -> str | None:
        """The token serves for the agent's turn (never between turns); for an agent in
        the sandbox, the relay's route into it: the relay's address for the sandbox's
        egress (`filtered`), else None (the sandbox reaches it at this machine's address on
        its network). Raises EpisodeError (`harbor:relay_failed`) when the relay does not
        answer or the sandbox has no way to this machine, naming why."""
        if self.relay is None or self._token is None:
            return None
        try:
            self.relay.open(self._token)
        except RelayError as error:
            raise EpisodeError(FailureKind.RELAY_FAILED, str(error)) from None
        if not self.in_sandbox:
            return None
        self._stop_watching()
        self._watch = RelayErrorWatch(
            self.relay, self._token, self._episode, told=len(self._seen.errors)
        )
        self._watch.start()
        try:
            if not isinstance(sandbox, ReachesThisMachine):
                raise SandboxError(f"sandbox {sandbox.id[:12]} cannot reach this machine")
            gateway = sandbox.host_address()
            port = self.relay.listen(gateway)
        except (SandboxError, RelayError) as error:
            raise EpisodeError(
                FailureKind.RELAY_FAILED,
                f"the agent calls its model from inside the sandbox, which cannot reach "
                f"the model relay on this machine: {error}",
            ) from None
        if filtered:
            self._sandbox_url = f"http://{RELAY_NAME}/v1"
            return f"{gateway}:{port}"
        self._sandbox_url = f"http://{gateway}:{port}/v1"
        return None

    # ------------------------------------------------------------------ turns

    def settle(self, agent: AgentRun) -> AgentRun:
        """The turn's run with its usage and its failure's cause from the relay's books;
        raises EpisodeError when the run's budget refused one of its calls, or a replay
        had no answer for one."""
        if self.relay is None or self._token is None:
            return agent
        calls = self._turn_calls()
        if calls.replay_misses:
            raise EpisodeError(
                FailureKind.REPLAY_MISS,
                "the replay has no recorded answer for " + "; ".join(calls.replay_misses[:3]),
            )
        if calls.refused_for_budget:
            spend = self.relay.spend()
            raise EpisodeError(
                FailureKind.BUDGET_SPENT,
                f"the run's {spend.budget_reached or 'budget was spent'}: "
                f"{calls.refused_for_budget} model call(s) of the turn were refused",
            )
        usage = _usage(calls.counts, agent.usage)
        return dataclasses.replace(agent, usage=usage, failure=_cause(agent.failure, calls))

    def _turn_calls(self) -> TurnCalls:
        """The turn's calls, once the token is closed (a call still under way ends, and
        counts as far as it went)."""
        assert self.relay is not None and self._token is not None
        try:
            report = self.relay.close(self._token)
        except RelayError as error:
            raise EpisodeError(FailureKind.RELAY_FAILED, str(error)) from None
        finally:
            self._stop_watching()
        seen, self._seen = self._seen, report
        return TurnCalls(
            counts=report.counts - seen.counts,
            causes=report.causes[len(seen.causes) :],
            refused_for_budget=report.refused_for_budget - seen.refused_for_budget,
            replay_misses=report.replay_misses[len(seen.replay_misses) :],
        )

    def _stop_watching(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.stop()


def _usage(counts: Counts, claimed: Usage | None) -> Usage:
    """The relay's counts as a row's usage (the MCP tool calls are the harness's own
    count: the relay sees model calls only)."""
    return Usage(
        prompt_tokens=counts.prompt_tokens,
        completion_tokens=counts.completion_tokens,
        cached_tokens=counts.cached_tokens,
        requests=counts.requests,
        cost_usd=round(counts.cost_usd, 6) if counts.requests and not counts.unpriced else None,
        tool_calls=claimed.tool_calls if claimed is not None else 0,
    )


def _cause(failure: AgentFailure | None, calls: TurnCalls) -> AgentFailure | None:
    """A failed turn's cause as the relay saw it: the last an answer showed (not a claim);
    a rate limit or endpoint error the relay did not see is the agent's crash."""
    if failure is None or failure.cause in ("timeout", "tools_unavailable"):
        return failure
    if calls.causes:
        cause, what = calls.causes[-1]
        seen = what.removeprefix("HTTP ")
        return AgentFailure(
            cause=cause,  # type: ignore[arg-type]
            message=f"{failure.message} (the model relay saw {what})",
            status_code=failure.status_code or (int(seen) if seen.isdigit() else None),
            claimed=False,
        )
    if failure.cause in _ENDPOINT_CAUSES:
        crashed: AgentCause = "agent_crashed"
        return AgentFailure(
            cause=crashed,
            message=f"{failure.message} (it gave {failure.cause}, which no answer the "
            "model relay passed on showed)",
            status_code=failure.status_code,
            claimed=failure.claimed,
        )
    return failure
