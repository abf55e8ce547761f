"""The model endpoint's check before any episode: it lists the model (`GET /models`) and,
unless told not to, answers one small request like the agent's; else a usage error."""

from __future__ import annotations

import pytest

from pytest_harbor.harnesses.base import SpeaksModelApi
from pytest_harbor.harnesses.model import ModelEndpointError, check_endpoint
from pytest_harbor.harnesses.model_request import SendsModelRequests, check_request
from pytest_harbor.plugin.run import HarborRun

__all__ = ["check_model_endpoint"]


def check_model_endpoint(run: HarborRun) -> None:
    """A usage error naming the model and its URL when the endpoint cannot serve the run.
    A replay asks the endpoint nothing: its answers are recorded ones."""
    model, options = run.model, run.options.model
    if model is None or options.replay is not None:
        return
    harness = run.harness
    shape = harness.model_request if isinstance(harness, SendsModelRequests) else None
    api = harness.model_api if isinstance(harness, SpeaksModelApi) else None
    where = f"--harbor-model {model.name} at {model.base_url}"
    try:
        check_endpoint(model, api=api or (shape.api if shape else "chat-completions"))
    except ModelEndpointError as error:
        raise pytest.UsageError(f"{where}: {error}") from None
    if shape is None or not options.preflight_request:
        return
    try:
        check_request(model, shape)
    except ModelEndpointError as error:
        raise pytest.UsageError(
            f"{where}: {error}\n(the run's agent would send such requests: fix the endpoint, "
            "or give --harbor-no-preflight-request to skip this check)"
        ) from None
