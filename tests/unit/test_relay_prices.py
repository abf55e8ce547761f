"""Prices of model calls: the table's format and its errors, the lookup of a model's
name, the cost arithmetic, and the shipped table."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_harbor.relay import prices
from pytest_harbor.relay.prices import (
    ModelPrice,
    PriceTable,
    PriceTableError,
    default_prices,
    load_prices,
)
from pytest_harbor.relay.usage import MAX_COUNT, CallUsage

HEADER = 'date = "2026-12-01"\nsource = "test"\n'


def table_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "prices.toml"
    path.write_text(text, encoding="utf-8")
    return path


def table(models: dict[str, ModelPrice]) -> PriceTable:
    return PriceTable(date=datetime.date(2026, 12, 1), source="test", models=models)


SONNET = ModelPrice(input=3.0, output=15.0, cached_input=0.3, cache_write=3.75)
GPT_4O = ModelPrice(input=2.5, output=10.0, cached_input=1.25)
GPT_4O_DATED = ModelPrice(input=5.0, output=15.0)


# Lookup --------------------------------------------------------------------------------

LOOKUP = table({"claude-sonnet-4-5": SONNET, "gpt-4o": GPT_4O, "gpt-4o-2024-05-13": GPT_4O_DATED})


@pytest.mark.parametrize(
    ("model", "price"),
    [
        ("claude-sonnet-4-5", SONNET),
        ("anthropic/claude-sonnet-4-5", SONNET),
        ("openrouter/anthropic/claude-sonnet-4-5", SONNET),
        ("claude-sonnet-4-5-20250929", SONNET),
        ("anthropic/claude-sonnet-4-5-20250929", SONNET),
        ("gpt-4o-2024-08-06", GPT_4O),
        ("openai/gpt-4o-2024-08-06", GPT_4O),
        ("gpt-4o-2024-05-13", GPT_4O_DATED),  # the exact name comes first
        ("gpt-4o", GPT_4O),
        ("claude-sonnet-4", None),
        ("claude-sonnet-4-5-2025", None),  # not a date
        ("claude-sonnet-4-5-20250929-v1", None),  # the date is not at the end
        ("claude-sonnet-4-5/other", None),
        ("CLAUDE-SONNET-4-5", None),
        ("gpt-4o-mini", None),
        ("", None),
        ("/", None),
    ],
)
def test_price_of_a_model_name(model: str, price: ModelPrice | None) -> None:
    assert LOOKUP.price_of(model) == price


def test_a_listed_name_with_a_prefix_is_found_whole_first() -> None:
    routed = ModelPrice(input=9.0, output=9.0)
    prices_ = table({"openrouter/gpt-4o": routed, "gpt-4o": GPT_4O})
    assert prices_.price_of("openrouter/gpt-4o") == routed
    assert prices_.price_of("azure/gpt-4o") == GPT_4O


# Cost ----------------------------------------------------------------------------------


def test_cost_of_an_anthropic_call_prices_each_part() -> None:
    usage = CallUsage(
        prompt_tokens=12 + 5021 + 310,
        completion_tokens=187,
        cached_tokens=5021,
        cache_write_tokens=310,
    )
    expected = (12 * 3.0 + 5021 * 0.3 + 310 * 3.75 + 187 * 15.0) / 1_000_000
    assert SONNET.cost(usage) == pytest.approx(expected)
    assert SONNET.cost(usage) == pytest.approx(0.0055098)


def test_cost_of_an_openai_call_with_cached_input() -> None:
    usage = CallUsage(prompt_tokens=1834, completion_tokens=212, cached_tokens=1536)
    assert GPT_4O.cost(usage) == pytest.approx((298 * 2.5 + 1536 * 1.25 + 212 * 10.0) / 1e6)


def test_a_million_tokens_cost_the_listed_prices() -> None:
    million = 1_000_000
    assert SONNET.cost(CallUsage(million, 0)) == pytest.approx(3.0)
    assert SONNET.cost(CallUsage(0, million)) == pytest.approx(15.0)
    assert SONNET.cost(CallUsage(million, 0, cached_tokens=million)) == pytest.approx(0.3)
    assert SONNET.cost(CallUsage(million, 0, cache_write_tokens=million)) == pytest.approx(3.75)
    assert SONNET.cost(CallUsage(0, 0)) == 0.0


def test_cache_prices_not_given_are_the_input_price() -> None:
    price = ModelPrice(input=2.0, output=8.0)
    assert (price.cached_input, price.cache_write) == (2.0, 2.0)
    usage = CallUsage(1_000_000, 0, cached_tokens=400_000, cache_write_tokens=100_000)
    assert price.cost(usage) == pytest.approx(2.0)


def test_cached_counts_past_the_prompt_cost_no_negative_uncached_input() -> None:
    usage = CallUsage(prompt_tokens=10, completion_tokens=0, cached_tokens=1_000_000)
    assert SONNET.cost(usage) == pytest.approx(0.3)


counts = st.integers(min_value=0, max_value=MAX_COUNT)
price_values = st.floats(min_value=0, max_value=1e6)


@given(counts, counts, counts, counts, price_values, price_values, price_values, price_values)
def test_cost_is_never_negative(
    prompt: int,
    completion: int,
    cached: int,
    written: int,
    input_: float,
    output: float,
    cached_input: float,
    cache_write: float,
) -> None:
    price = ModelPrice(
        input=input_, output=output, cached_input=cached_input, cache_write=cache_write
    )
    assert price.cost(CallUsage(prompt, completion, cached, written)) >= 0


# Loading and its errors ----------------------------------------------------------------


def test_a_table_loads_with_its_date_source_and_models(tmp_path: Path) -> None:
    path = table_file(
        tmp_path,
        HEADER + '[models."gpt-4.1"]\ninput = 2\noutput = 8.0\ncached_input = 0.5\n',
    )
    loaded = load_prices(path)
    assert loaded.date == datetime.date(2026, 12, 1)
    assert loaded.source == "test"
    assert loaded.models == {
        "gpt-4.1": ModelPrice(input=2.0, output=8.0, cached_input=0.5, cache_write=2.0)
    }


def test_a_date_may_be_a_toml_date(tmp_path: Path) -> None:
    path = table_file(tmp_path, 'date = 2026-12-01\nsource = "test"\n')
    assert load_prices(str(path)).date == datetime.date(2026, 12, 1)


def gpt_5(*lines: str) -> str:
    """A table with one model, gpt-5, of these lines."""
    return HEADER + '[models."gpt-5"]\n' + "".join(line + "\n" for line in lines)


NEGATIVE = "greater than or equal to 0"


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        (gpt_5("input = -1", "output = 10"), "models.gpt-5.input", NEGATIVE),
        (gpt_5("input = 1", "output = -0.5"), "models.gpt-5.output", NEGATIVE),
        (
            gpt_5("input = 1", "output = 1", "cached_input = -1"),
            "models.gpt-5.cached_input",
            NEGATIVE,
        ),
        (
            gpt_5("input = 1", "output = 1", "cache_write = -1"),
            "models.gpt-5.cache_write",
            NEGATIVE,
        ),
        (gpt_5("input = nan", "output = 10"), "models.gpt-5.input", "finite number"),
        (gpt_5("input = 1", "output = inf"), "models.gpt-5.output", "finite number"),
        (gpt_5('input = "1.25"', "output = 10"), "models.gpt-5.input", "valid number"),
        (gpt_5("input = true", "output = 10"), "models.gpt-5.input", "valid number"),
        (gpt_5("output = 10"), "models.gpt-5.input", "Field required"),
        (gpt_5("input = 1", "output = 1", "cached = 0.1"), "models.gpt-5.cached", "Extra inputs"),
        (HEADER + '[models."gpt-4.1"]\ninput = 2\n', 'models."gpt-4.1".output', "Field required"),
        (HEADER + "models = 3\n", "models", "valid dictionary"),
        (HEADER + 'models = { "gpt-5" = 3 }\n', "models.gpt-5", "valid dictionary"),
        ('source = "test"\n', "date", "Field required"),
        ('date = "December"\nsource = "test"\n', "date", "valid date"),
        ('date = "2026-12-01"\n', "source", "Field required"),
        ('date = "2026-12-01"\nsource = 3\n', "source", "valid string"),
        (HEADER + 'currency = "EUR"\n', "currency", "Extra inputs are not permitted"),
    ],
)
def test_a_bad_field_is_named_with_its_file(
    tmp_path: Path, text: str, where: str, message: str
) -> None:
    path = table_file(tmp_path, text)
    with pytest.raises(PriceTableError) as raised:
        load_prices(path)
    assert str(raised.value).startswith(f"{path}: {where}: ")
    assert message in str(raised.value)


def test_the_error_for_a_negative_price_reads_whole(tmp_path: Path) -> None:
    path = table_file(tmp_path, gpt_5("input = -1", "output = 10"))
    with pytest.raises(PriceTableError) as raised:
        load_prices(path)
    assert str(raised.value) == (
        f"{path}: models.gpt-5.input: Input should be greater than or equal to 0"
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'date = "2026-12-01\n', "not valid TOML"),
        (b"[models.\n", "not valid TOML"),
        (b'date = "2026-12-01"\ndate = "2026-12-02"\n', "not valid TOML"),
        (b'source = "\xff\xfe"\n', "not valid TOML"),
    ],
)
def test_a_file_that_is_not_toml_is_named(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "prices.toml"
    path.write_bytes(content)
    with pytest.raises(PriceTableError, match=message) as raised:
        load_prices(path)
    assert str(raised.value).startswith(f"{path}: ")


@pytest.mark.parametrize("kind", ["missing", "folder"])
def test_a_file_that_cannot_be_read_is_named(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "prices.toml"
    if kind == "folder":
        path.mkdir()
    with pytest.raises(PriceTableError, match="cannot read the price table") as raised:
        load_prices(path)
    assert str(raised.value).startswith(f"{path}: ")


# The shipped table ---------------------------------------------------------------------

#: The list prices the shipped table must hold: input, output, cached input, cache write.
LIST_PRICES = {
    "claude-opus-4-5": (5.0, 25.0, 0.5, 6.25),
    "claude-opus-4-1": (15.0, 75.0, 1.5, 18.75),
    "claude-sonnet-4-5": (3.0, 15.0, 0.3, 3.75),
    "claude-sonnet-4": (3.0, 15.0, 0.3, 3.75),
    "claude-haiku-4-5": (1.0, 5.0, 0.1, 1.25),
    "claude-3-5-haiku": (0.8, 4.0, 0.08, 1.0),
    "gpt-5": (1.25, 10.0, 0.125, 1.25),
    "gpt-5-mini": (0.25, 2.0, 0.025, 0.25),
    "gpt-5-nano": (0.05, 0.4, 0.005, 0.05),
    "gpt-5-codex": (1.25, 10.0, 0.125, 1.25),
    "gpt-4.1": (2.0, 8.0, 0.5, 2.0),
    "gpt-4.1-mini": (0.4, 1.6, 0.1, 0.4),
    "gpt-4o": (2.5, 10.0, 1.25, 2.5),
    "gpt-4o-mini": (0.15, 0.6, 0.075, 0.15),
    "o3": (2.0, 8.0, 0.5, 2.0),
    "o4-mini": (1.1, 4.4, 0.275, 1.1),
}


def test_the_shipped_table_is_dated_and_says_where_its_prices_come_from() -> None:
    shipped = default_prices()
    assert shipped.date == datetime.date(2026, 12, 1)
    assert "per million tokens" in shipped.source
    assert "override" in shipped.source


@pytest.mark.parametrize(("model", "listed"), LIST_PRICES.items(), ids=list(LIST_PRICES))
def test_the_shipped_table_lists_the_model(model: str, listed: tuple[float, ...]) -> None:
    price = default_prices().price_of(model)
    assert price is not None
    assert (price.input, price.output, price.cached_input, price.cache_write) == listed


def test_the_shipped_table_lies_beside_the_module() -> None:
    beside = Path(prices.__file__).parent / "prices.toml"
    assert beside.is_file()
    assert default_prices() == load_prices(beside)


def test_the_shipped_table_prices_a_dated_anthropic_answer() -> None:
    usage = CallUsage(5343, 187, 5021, 310, "claude-sonnet-4-5-20250929")
    assert usage.model is not None
    price = default_prices().price_of(usage.model)
    assert price is not None
    assert price.cost(usage) == pytest.approx(0.0055098)
