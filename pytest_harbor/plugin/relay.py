"""The run's model relay in pytest: started by the controller's pre-flight (or the sole
process's) once the endpoint answers, its address handed to each xdist worker, stopped
when the run ends; and the one line a run whose budget was spent ends with."""

from __future__ import annotations

import contextlib

import pytest

from pytest_harbor.plugin.options import ModelOptions
from pytest_harbor.plugin.run import HarborRun
from pytest_harbor.relay import RelayError, RelayProcess, RunSpend

__all__ = ["check_spend_options", "spend_line", "start_relay", "stop_relay"]


def check_spend_options(model: ModelOptions, name: str | None) -> None:
    """Options about the calls of the model `name` that cannot go together, as usage
    errors: a cost cap on a model the price table does not price among them (its calls
    would cost the budget nothing)."""
    if model.record is not None and model.replay is not None:
        raise pytest.UsageError(
            "--harbor-record with --harbor-replay: a replay answers from a recording; "
            "record into another folder in another run"
        )
    if model.replay is not None and not model.replay.is_dir():
        raise pytest.UsageError(f"--harbor-replay: {model.replay} is not a folder")
    from pytest_harbor.relay.prices import PriceTableError, default_prices, load_prices

    try:
        table = default_prices() if model.prices is None else load_prices(model.prices)
    except PriceTableError as error:
        raise pytest.UsageError(f"--harbor-prices: {error}") from None
    if model.max_cost_usd is not None and name is not None and table.price_of(name) is None:
        raise pytest.UsageError(
            f"--harbor-max-cost: the price table has no price for {name!r}, so its calls "
            "would cost the budget nothing; give a table that prices it (--harbor-prices) "
            "or cap tokens instead (--harbor-max-tokens)"
        )


def start_relay(run: HarborRun) -> RelayProcess | None:
    """The relay of a run whose harness talks to a model (None for one that talks to
    none); a usage error when it cannot start."""
    model = run.model
    if model is None:
        return None
    options = run.options.model
    key = None if options.replay is not None or model.api_key is None else model.api_key
    start = {
        "upstream": model.base_url,
        "api_key": None if key is None else key.get_secret_value(),
        "prices": None if options.prices is None else str(options.prices),
        "max_cost_usd": options.max_cost_usd,
        "max_tokens": options.max_tokens,
        "record": None if options.record is None else str(options.record),
        "replay": None if options.replay is None else str(options.replay),
        "masked": tuple(run.settings.revealed_secrets().values()),
    }
    try:
        process = RelayProcess.start(start, log=run.scratch_dir / "relay.log")
    except RelayError as error:
        raise pytest.UsageError(f"--harbor-model {model.name}: {error}") from None
    run.relay = process.client()
    return process


def stop_relay(process: RelayProcess | None, run: HarborRun) -> RunSpend | None:
    """End the relay; the run's spend as it last counted it (None without a relay)."""
    if process is None:
        return None
    spend = None
    with contextlib.suppress(RelayError):
        spend = process.client().spend()
    process.stop()
    run.relay = None
    return spend


def spend_line(spend: RunSpend) -> str | None:
    """The line a run ends with when its budget stopped it, else None."""
    if spend.budget_reached is None:
        return None
    return (
        f"harbor: the run's budget stopped it: {spend.budget_reached}; the episodes left "
        "without a result (harbor:budget_spent) run with --harbor-resume"
    )
