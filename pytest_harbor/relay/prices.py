"""What a model call costs, in US dollars, from a table of prices per million tokens: the
one shipped beside this module (prices.toml) or the user's own, in the same format."""

from __future__ import annotations

import datetime
import json
import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pytest_harbor.relay.usage import CallUsage

__all__ = ["ModelPrice", "PriceTable", "PriceTableError", "default_prices", "load_prices"]

#: The shipped table.
DEFAULT_TABLE = Path(__file__).parent / "prices.toml"

#: Prices are per this many tokens.
PER_TOKENS = 1_000_000

#: A release date at the end of a model name: `-20250929` or `-2024-08-06`.
_DATE_SUFFIX = re.compile(r"-(?:\d{8}|\d{4}-\d{2}-\d{2})$")

#: A TOML key that needs no quotes.
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")

#: A price: a finite number, not negative, written as a number (not "3" or true).
_PRICE = Field(ge=0, allow_inf_nan=False, strict=True)


class PriceTableError(Exception):
    """A price table that cannot be used; the message names the file and the field."""


class ModelPrice(BaseModel):
    """One model's prices, in US dollars per million tokens. A cache price not given is
    the input price (what a provider without a cache discount charges)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = _PRICE
    output: float = _PRICE
    cached_input: float = _PRICE
    cache_write: float = _PRICE

    @model_validator(mode="before")
    @classmethod
    def _cache_prices_default_to_input(cls, data: Any) -> Any:
        if isinstance(data, dict) and "input" in data:
            return {"cached_input": data["input"], "cache_write": data["input"], **data}
        return data

    def cost(self, usage: CallUsage) -> float:
        """What the call cost: the uncached input, the cache reads and writes, and the
        output, each at its price. Never negative, whatever the counts say."""
        uncached = max(usage.prompt_tokens - usage.cached_tokens - usage.cache_write_tokens, 0)
        dollars = (
            uncached * self.input
            + usage.cached_tokens * self.cached_input
            + usage.cache_write_tokens * self.cache_write
            + usage.completion_tokens * self.output
        )
        return max(dollars / PER_TOKENS, 0.0)


class PriceTable(BaseModel):
    """Prices by model name, with when they were read and from where."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    date: datetime.date
    source: str
    models: dict[str, ModelPrice] = Field(default_factory=dict)

    def price_of(self, model: str) -> ModelPrice | None:
        """The price of `model`: by its exact name, else without a provider prefix
        (`anthropic/claude-sonnet-4-5`), else also without a date at its end
        (`claude-sonnet-4-5-20250929`, `gpt-4o-2024-08-06`); None when none is listed."""
        bare = model.rpartition("/")[2]
        for name in (model, bare, _DATE_SUFFIX.sub("", bare)):
            if name in self.models:
                return self.models[name]
        return None


def load_prices(path: Path | str) -> PriceTable:
    """The price table in the TOML file `path`; PriceTableError when it cannot be read or
    a field is wrong."""
    try:
        data = tomllib.loads(Path(path).read_bytes().decode("utf-8"))
    except OSError as error:
        raise PriceTableError(f"{path}: cannot read the price table: {error.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise PriceTableError(f"{path}: not valid TOML: {error}") from None
    try:
        return PriceTable.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        raise PriceTableError(f"{path}: {_toml_key(first['loc'])}: {first['msg']}") from None


def default_prices() -> PriceTable:
    """The table shipped with the package (list prices; see its `date` and `source`)."""
    return load_prices(DEFAULT_TABLE)


def _toml_key(loc: tuple[int | str, ...]) -> str:
    """Where a field is, as TOML writes it: `models."gpt-4.1".input`."""
    parts = [str(part) for part in loc]
    quoted = [part if _BARE_KEY.fullmatch(part) else json.dumps(part) for part in parts]
    return ".".join(quoted) or "(the whole table)"
