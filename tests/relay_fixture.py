"""What the relay's tests share: a relay started in front of a scripted endpoint, and a
token granted and opened as the engine does for an episode's turn."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from pytest_harbor.relay import GrantRequest, RelayClient, RelayProcess

__all__ = ["KEY", "MODEL", "Start", "another_call", "grant", "started_relays"]

#: The endpoint's key: the relay holds it, no harness ever does.
KEY = "sk-real-endpoint-key-0123456789"
MODEL = "scripted-model"

Start = Callable[..., tuple[RelayProcess, RelayClient]]


def started_relays(folder: Path) -> Iterator[Start]:
    """Start relays in front of an `upstream` (with the key, and any other start values);
    each is stopped when the generator is closed."""
    started: list[RelayProcess] = []

    def start(upstream: str, **values: Any) -> tuple[RelayProcess, RelayClient]:
        values.setdefault("api_key", KEY)
        process = RelayProcess.start(
            {"upstream": upstream, **values}, log=folder / f"relay-{len(started)}.log"
        )
        started.append(process)
        return process, process.client()

    try:
        yield start
    finally:
        for process in started:
            process.stop()


def grant(client: RelayClient, cassette: str = "set/task__r0", model: str = MODEL) -> str:
    """A token for an episode whose agent is at work (the relay serves it until closed)."""
    token = client.grant(GrantRequest(episode=cassette, models=(model,), cassette=cassette))
    client.open(token)
    return token


def another_call(client: RelayClient, token: str, timeout: float) -> int | str:
    """The status of another episode's ordinary call, or the name of its failure: what
    an attack must leave working."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    try:
        return httpx.post(
            f"{client.host_url}/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
        ).status_code
    except httpx.HTTPError as error:
        return type(error).__name__
