"""Fixtures the unit tests share."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.model_server import Script, ScriptedModel
from tests.relay_fixture import Start, started_relays


@pytest.fixture
def serve() -> Iterator[Callable[[Script], ScriptedModel]]:
    """Start a scripted Chat Completions server on 127.0.0.1; each is stopped after the
    test."""
    servers: list[ScriptedModel] = []

    def start(script: Script) -> ScriptedModel:
        servers.append(ScriptedModel(script).__enter__())
        return servers[-1]

    yield start
    for server in servers:
        server.__exit__(None, None, None)


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[Start]:
    """Start a model relay in front of an endpoint; each is stopped after the test."""
    yield from started_relays(tmp_path)
