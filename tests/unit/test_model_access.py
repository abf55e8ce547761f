"""An episode's way to its model (engine/model_access.py), against a relay that answers
from the test's books: a token per attempt, each turn's usage as the relay's difference,
causes the relay saw (never the agent's claim of one), and the ends a budget and a replay
miss put to an episode."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from pydantic import SecretStr

from pytest_harbor.engine.failures import EpisodeError, FailureKind
from pytest_harbor.engine.model_access import ModelAccess
from pytest_harbor.harnesses.base import AgentFailure, AgentRun, Usage
from pytest_harbor.harnesses.model import ModelConfig
from pytest_harbor.relay import Counts, GrantReport, GrantRequest, RelayClient, RunSpend

MODEL = ModelConfig(
    name="openai/gpt-5", base_url="https://api.example/v1", api_key=SecretStr("sk-x")
)


@dataclass
class BooksRelay:
    """A relay whose books the test writes."""

    report_of: GrantReport = field(default_factory=GrantReport)
    spend_of: RunSpend = field(default_factory=RunSpend)
    granted: list[GrantRequest] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)
    opened: list[str] = field(default_factory=list)
    host_url: str = "http://127.0.0.1:4000/v1"

    def grant(self, request: GrantRequest) -> str:
        self.granted.append(request)
        return f"hbr-{len(self.granted)}"

    def report(self, token: str) -> GrantReport:
        return self.report_of

    def end(self, token: str) -> GrantReport:
        self.ended.append(token)
        return self.report_of

    def open(self, token: str) -> None:
        self.opened.append(token)

    def close(self, token: str) -> GrantReport:
        return self.report_of

    def spend(self) -> RunSpend:
        return self.spend_of

    def listen(self, address: str) -> int:
        return 4000


class InSandbox:
    name = "cli"
    model_in_sandbox = True


def access(relay: BooksRelay) -> ModelAccess:
    made = ModelAccess(
        MODEL, cast(RelayClient, relay), cast(Any, InSandbox()), cassette="ts/t__r0", episode="t"
    )
    made.begin_attempt()
    return made


def test_the_harness_gets_the_relay_and_a_token_per_attempt_never_the_key() -> None:
    relay = BooksRelay()
    model = access(relay)
    given = model.for_harness()
    assert given is not None and given.base_url == relay.host_url
    assert given.api_key is not None and given.api_key.get_secret_value() == "hbr-1"
    assert relay.granted[0].models == ("gpt-5", "openai/gpt-5")
    model.begin_attempt()  # a retry: the first token dies, a second is made
    assert relay.ended == ["hbr-1"]
    assert model.for_harness().api_key.get_secret_value() == "hbr-2"  # type: ignore[union-attr]
    model.end()
    model.end()
    assert relay.ended == ["hbr-1", "hbr-2"]


def test_each_turn_gets_the_relays_counts_of_its_own_calls() -> None:
    relay = BooksRelay()
    model = access(relay)
    relay.report_of = GrantReport(counts=Counts(requests=2, prompt_tokens=300, cost_usd=0.5))
    first = model.settle(AgentRun(usage=Usage(prompt_tokens=1, tool_calls=3)))
    relay.report_of = GrantReport(counts=Counts(requests=3, prompt_tokens=500, cost_usd=0.75))
    second = model.settle(AgentRun(usage=Usage(prompt_tokens=99_999)))
    assert first.usage == Usage(requests=2, prompt_tokens=300, cost_usd=0.5, tool_calls=3)
    assert second.usage == Usage(requests=1, prompt_tokens=200, cost_usd=0.25)
    # A call of a model the price table lacks: the turn's cost is unknown, not 0.
    relay.report_of = GrantReport(
        counts=Counts(requests=4, prompt_tokens=500, cost_usd=0.75, unpriced=1)
    )
    assert model.settle(AgentRun()).usage == Usage(requests=1, cost_usd=None)


@pytest.mark.parametrize(
    ("claimed", "seen", "cause", "is_claim"),
    [
        ("rate_limited", (("rate_limited", "HTTP 429"),), "rate_limited", False),
        ("agent_crashed", (("api_error", "HTTP 503"),), "api_error", False),
        ("rate_limited", (), "agent_crashed", True),
        ("api_error", (), "agent_crashed", True),
        ("context_length_exceeded", (), "context_length_exceeded", True),
        ("timeout", (("rate_limited", "HTTP 429"),), "timeout", False),
    ],
)
def test_a_failed_turns_cause_is_what_the_relay_saw(
    claimed: str, seen: tuple[tuple[str, str], ...], cause: str, is_claim: bool
) -> None:
    relay = BooksRelay()
    model = access(relay)
    relay.report_of = GrantReport(causes=seen)
    failure = AgentFailure(claimed, "exited 1", claimed=claimed != "timeout")  # type: ignore[arg-type]
    settled = model.settle(AgentRun(exit_code=1, failure=failure))
    assert settled.failure is not None
    assert (settled.failure.cause, settled.failure.claimed) == (cause, is_claim)


def test_a_refused_call_for_the_budget_or_a_replay_miss_ends_the_episode() -> None:
    relay = BooksRelay()
    model = access(relay)
    relay.report_of = GrantReport(refused_for_budget=1)
    relay.spend_of = RunSpend(budget_reached="--harbor-max-cost=1 USD reached")
    with pytest.raises(EpisodeError) as spent:
        model.settle(AgentRun(exit_code=1))
    assert spent.value.failure_kind == FailureKind.BUDGET_SPENT
    with pytest.raises(EpisodeError) as refused:
        model.begin_attempt()  # no new attempt once the budget is spent
    assert refused.value.failure_kind == FailureKind.BUDGET_SPENT
    missing = access(BooksRelay(report_of=GrantReport(replay_misses=("POST /v1/x (key k)",))))
    with pytest.raises(EpisodeError) as missed:
        missing.settle(AgentRun())
    assert missed.value.failure_kind == FailureKind.REPLAY_MISS
    assert "POST /v1/x (key k)" in str(missed.value)


def test_a_sandbox_with_no_way_to_this_machine_ends_the_episode_saying_so() -> None:
    model = access(BooksRelay())
    with pytest.raises(EpisodeError) as failed:
        model.open_turn(
            cast(Any, type("Elsewhere", (), {"id": "abc123456789xyz"})()), filtered=True
        )
    assert failed.value.failure_kind == FailureKind.RELAY_FAILED
    assert "cannot reach the model relay" in str(failed.value)
