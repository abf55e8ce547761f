"""The model options as given (`--harbor-model*`, the spend and replay options)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_harbor.harnesses.model import DEFAULT_API_KEY_ENV

__all__ = ["ModelOptions"]


@dataclass(frozen=True)
class ModelOptions:
    """The model options as given; the run makes a ModelConfig of them when its harness
    talks to a model."""

    name: str | None = None
    url: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    api_key_env: str = DEFAULT_API_KEY_ENV
    #: Given as `--harbor-model-api-key` (or its ini key): a warning says why not to.
    api_key: str | None = None
    concurrency: int = 16
    #: Before the run, send one small request like the agent's (the pre-flight request).
    preflight_request: bool = True
    #: The run's budget (the relay serves no call past it), its price table, and where
    #: model calls are recorded or replayed from (docs/cost-and-replay.md).
    max_cost_usd: float | None = None
    max_tokens: int | None = None
    prices: Path | None = None
    record: Path | None = None
    replay: Path | None = None

    @property
    def given(self) -> bool:
        spend = (self.max_cost_usd, self.max_tokens, self.prices, self.record, self.replay)
        return bool(self.name or self.url or self.params or self.api_key) or any(
            value is not None for value in spend
        )
