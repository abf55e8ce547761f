"""The network sandboxes with network access are on: one bridge per engine on which
containers cannot reach each other (inter-container traffic off), so no episode reaches
another's services; each reaches the outside as on the engine's default bridge, where
every container of the engine reaches every other.

One network serves every run on the engine, kept as a cache like the trusted tools'
volume: the engine has room for a few dozen networks only (its address pools), and runs
at once, each with several processes, would use it up."""

from __future__ import annotations

import threading

import docker.errors

from pytest_harbor.labels import CACHE_LABEL
from pytest_harbor.sandboxes.base import SandboxStartError
from pytest_harbor.sandboxes.docker.engine import ENGINE_ERRORS, Endpoint, engine_for, explain
from pytest_harbor.sandboxes.images import build_lock

__all__ = ["ISOLATED_NETWORK", "IsolatedNetwork"]

#: The network's name; its label CACHE_LABEL=isolated says pytest-harbor made it (no task
#: can name a network of the engine, nor set that label).
ISOLATED_NETWORK = "pytest-harbor-isolated"
_ROLE = "isolated"
#: The bridge driver's option that turns traffic between its containers off.
_ICC = "com.docker.network.bridge.enable_icc"


class IsolatedNetwork:
    """The isolated network of one engine, made on first use and then found."""

    def __init__(self, endpoint: Endpoint | None) -> None:
        self._endpoint = endpoint
        self._ready = False
        self._lock = threading.Lock()

    def name(self) -> str:
        with self._lock:
            if not self._ready:
                key = ISOLATED_NETWORK
                if self._endpoint is not None:
                    key = f"{self._endpoint.key}-{key}"
                with build_lock(key):
                    if not self._found():
                        self._make()
                self._ready = True
            return ISOLATED_NETWORK

    def forget(self) -> None:
        """The network is gone (someone removed it): the next sandbox makes it again."""
        with self._lock:
            self._ready = False

    def _found(self) -> bool:
        api = engine_for(self._endpoint).api
        try:
            network = api.inspect_network(ISOLATED_NETWORK)
        except docker.errors.NotFound:
            return False
        except ENGINE_ERRORS as error:
            raise SandboxStartError(
                f"cannot ask for the sandboxes' network: {explain(error)}"
            ) from None
        labels = network.get("Labels") or {}
        options = network.get("Options") or {}
        if labels.get(CACHE_LABEL) != _ROLE or options.get(_ICC) != "false":
            raise SandboxStartError(
                f"the network {ISOLATED_NETWORK} on this engine was not made by pytest-harbor "
                f"(no label {CACHE_LABEL}={_ROLE}, or its containers reach each other); "
                f"remove it (docker network rm {ISOLATED_NETWORK})"
            )
        return True

    def _make(self) -> None:
        try:
            engine_for(self._endpoint).api.create_network(
                ISOLATED_NETWORK,
                driver="bridge",
                options={_ICC: "false"},
                labels={CACHE_LABEL: _ROLE},
                check_duplicate=True,
            )
        except ENGINE_ERRORS as error:
            raise SandboxStartError(
                f"cannot make the sandboxes' network: {explain(error)}"
            ) from None
