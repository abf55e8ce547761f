"""The relay's books: each grant (a token made for one episode's attempt) with what its
calls took and showed, the run's spend, and the budget that admits each call."""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field

from pytest_harbor.relay.reports import Counts, GrantReport, GrantRequest, RunSpend

__all__ = ["MOST_AT_ONCE", "TOKEN_PREFIX", "Budget", "Grant", "Ledger"]

#: Every token begins so, which tells it from a provider's key in a log.
TOKEN_PREFIX = "hbr-"
#: What a grant keeps of the causes and refusals it saw (the first ones).
_MOST_NOTES = 50
#: The most requests one grant may have under way at once.
MOST_AT_ONCE = 32


@dataclass
class Grant:
    """One token's episode, the model names it may call, and its books. A grant serves
    only while its episode's agent works (`open`); the requests it has under way are
    `tasks`, ended when it closes."""

    token: str
    request: GrantRequest
    counts: Counts = field(default_factory=Counts)
    causes: list[tuple[str, str]] = field(default_factory=list)
    errors: list[tuple[int | None, str]] = field(default_factory=list)
    refused_for_budget: int = 0
    replay_misses: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    open: bool = False
    tasks: set[asyncio.Task[object]] = field(default_factory=set)

    def saw(self, cause: str, what: str) -> None:
        if len(self.causes) < _MOST_NOTES:
            self.causes.append((cause, what))

    def failed(self, status: int | None, words: str) -> None:
        """An answer of the endpoint's that failed (status None: no answer)."""
        if len(self.errors) < _MOST_NOTES:
            self.errors.append((status, words))

    def note(self, notes: list[str], text: str) -> None:
        if len(notes) < _MOST_NOTES:
            notes.append(text)

    def report(self) -> GrantReport:
        return GrantReport(
            counts=self.counts,
            causes=tuple(self.causes),
            errors=tuple(self.errors),
            refused_for_budget=self.refused_for_budget,
            replay_misses=tuple(self.replay_misses),
            refused=tuple(self.refused),
        )


@dataclass(frozen=True)
class Budget:
    """The run's caps: dollars and tokens (None: no cap)."""

    max_cost_usd: float | None = None
    max_tokens: int | None = None

    @property
    def capped(self) -> bool:
        return self.max_cost_usd is not None or self.max_tokens is not None

    def reached(self, spent: Counts) -> str | None:
        """Why no further call may be served, or None."""
        if self.max_cost_usd is not None and spent.cost_usd >= self.max_cost_usd:
            return (
                f"--harbor-max-cost={self.max_cost_usd:g} USD reached "
                f"(spent {spent.cost_usd:.4f} USD)"
            )
        if self.max_tokens is not None and spent.tokens >= self.max_tokens:
            return f"--harbor-max-tokens={self.max_tokens} reached (spent {spent.tokens} tokens)"
        return None


class Ledger:
    """Every grant of the run, and the run's spend. Grants that ended still count.

    A call is admitted while the run's spend, with what it and the calls under way are
    expected to take (admission.expected_tokens), stays under the budget; else it waits for
    one of them to end. With none under way a call is admitted until the budget is reached.
    So the calls under way pass the cap only by what they take beyond their expectation."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self._grants: dict[str, Grant] = {}
        self.spent = Counts()
        self.made = 0
        #: What the calls under way are expected to take, and how many they are.
        self.reserved = Counts()
        self.under_way = 0
        #: The longest completion counted from an answer (the expectation of a call that
        #: names no bound of its own).
        self.longest_completion = 0

    def grant(self, request: GrantRequest) -> Grant:
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        grant = Grant(token, request)
        self._grants[token] = grant
        self.made += 1
        return grant

    def find(self, token: str | None) -> Grant | None:
        return None if token is None else self._grants.get(token)

    def end(self, token: str) -> Grant | None:
        """The token is dead from now on; its books are returned for a last report."""
        return self._grants.pop(token, None)

    def charge(self, grant: Grant, counts: Counts) -> None:
        grant.counts = grant.counts + counts
        self.spent = self.spent + counts
        self.longest_completion = max(self.longest_completion, counts.completion_tokens)

    def admits(self, expected: Counts) -> bool | None:
        """Whether a call `expected` to take so much is admitted now (False: it waits for a
        call under way to end); None when the budget is reached and nothing is under way
        to wait for."""
        if not self.budget.capped:
            return True
        if self.budget.reached(self.spent) is not None:
            return None if self.under_way == 0 else False
        if self.under_way == 0:
            return True
        return self.budget.reached(self.spent + self.reserved + expected) is None

    def reserve(self, expected: Counts) -> None:
        self.reserved = self.reserved + expected
        self.under_way += 1

    def release(self, expected: Counts) -> None:
        self.reserved = self.reserved - expected
        self.under_way -= 1

    def state(self) -> RunSpend:
        return RunSpend(
            counts=self.spent, budget_reached=self.budget.reached(self.spent), grants=self.made
        )
