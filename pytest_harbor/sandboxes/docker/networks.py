"""The network sandboxes with network access are on: one bridge per engine on which
containers cannot reach each other (inter-container traffic off), so no episode reaches
another's services; each reaches the outside as on the engine's default bridge, where
every container of the engine reaches every other. And this machine's address on a
network (`host_address`), where a sandbox reaches a server of the engine's own.

One network serves every run on the engine, kept as a cache like the trusted tools'
volume: the engine has room for a few dozen networks only (its address pools), and runs
at once, each with several processes, would use it up."""

from __future__ import annotations

import ipaddress
import socket
import threading
import uuid
from collections.abc import Mapping
from typing import Any

import docker.errors

from pytest_harbor.labels import CACHE_LABEL
from pytest_harbor.sandboxes.base import SandboxError, SandboxStartError
from pytest_harbor.sandboxes.docker.engine import ENGINE_ERRORS, Endpoint, engine_for, explain
from pytest_harbor.sandboxes.images import build_lock
from pytest_harbor.sandboxes.routes import BRIDGE_NAME_OPTION, BRIDGE_PREFIX, bridge_name

__all__ = ["ISOLATED_NETWORK", "NO_HOST_ADDRESS", "IsolatedNetwork", "gateway", "host_address"]

#: The network's name; its label CACHE_LABEL=isolated says pytest-harbor made it (no task
#: can name a network of the engine, nor set that label).
ISOLATED_NETWORK = "pytest-harbor-isolated"
_ROLE = "isolated"
#: The bridge driver's option that turns traffic between its containers off.
_ICC = "com.docker.network.bridge.enable_icc"
#: The bridge driver's option that keeps an address for this machine off a network.
NO_HOST_ADDRESS = "com.docker.network.bridge.inhibit_ipv4"
#: A sandbox on the engine's host network shares this machine's own loopback.
_HOST_NETWORK = "host"
_LOOPBACK = "127.0.0.1"


def host_address(endpoint: Endpoint | None, network: str) -> str:
    """This machine's address on `network` of the engine at `endpoint`: the network's
    gateway, which its bridge holds (127.0.0.1 on the host network). Raises SandboxError,
    saying why, when it has none, or when the gateway is no address of this machine (the
    engine runs elsewhere: another machine, a VM, a namespace of its own)."""
    if network == _HOST_NETWORK:
        return _LOOPBACK
    try:
        details = engine_for(endpoint).api.inspect_network(network)
    except ENGINE_ERRORS as error:
        raise SandboxError(
            f"cannot ask the engine for the network {network}: {explain(error)}"
        ) from None
    address = gateway(details, network)
    family = socket.AF_INET if ipaddress.ip_address(address).version == 4 else socket.AF_INET6
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
    except OSError:
        raise SandboxError(
            f"the gateway {address} of the network {network} is no address of this machine: "
            "the Docker engine runs elsewhere (another machine, a VM, or a network "
            "namespace of its own), so a server here cannot be reached from its sandboxes"
        ) from None
    return address


def gateway(details: Mapping[str, Any], network: str) -> str:
    """The gateway a network's inspection names (IPAM config), IPv4 before IPv6; raises
    SandboxError when its bridge holds no address or none is named."""
    if (details.get("Options") or {}).get(NO_HOST_ADDRESS) == "true":
        raise SandboxError(
            f"the network {network} has no address on this machine (its bridge holds none)"
        )
    found: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
    for entry in (details.get("IPAM") or {}).get("Config") or []:
        # Some engines give the gateway with its prefix length.
        named = str((entry or {}).get("Gateway") or "").split("/")[0]
        try:
            found.append(ipaddress.ip_address(named))
        except ValueError:
            continue
    if not found:
        raise SandboxError(
            f"the engine names no gateway for the network {network} (its IPAM config), so "
            "no address of this machine is known there"
        )
    return str(min(found, key=lambda address: address.version))


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
        if not str(options.get(BRIDGE_NAME_OPTION, "")).startswith(BRIDGE_PREFIX):
            return self._replace_unnamed(api, network)
        return True

    def _replace_unnamed(self, api: docker.APIClient, network: Mapping[str, Any]) -> bool:
        """The network as an earlier version made it, its bridge not named for the border:
        removed when nothing is on it (then made anew), else SandboxStartError."""
        if network.get("Containers"):
            raise SandboxStartError(
                f"the network {ISOLATED_NETWORK} on this engine was made by an earlier "
                "pytest-harbor, whose bridge the border does not know, and containers are "
                f"still on it; once they are gone, remove it (docker network rm "
                f"{ISOLATED_NETWORK}) and it is made anew"
            )
        try:
            api.remove_network(ISOLATED_NETWORK)
        except docker.errors.NotFound:
            pass
        except ENGINE_ERRORS as error:
            raise SandboxStartError(
                f"cannot replace the sandboxes' network: {explain(error)}"
            ) from None
        return False

    def _make(self) -> None:
        api = engine_for(self._endpoint).api
        try:
            # Named for the border, and apart from every other: engines may share a host
            # (and an ID, started with the same configuration folder), and an attempt
            # that failed half-way may leave its name taken.
            bridge = bridge_name("i", uuid.uuid4().hex)
            api.create_network(
                ISOLATED_NETWORK,
                driver="bridge",
                options={_ICC: "false", BRIDGE_NAME_OPTION: bridge},
                labels={CACHE_LABEL: _ROLE},
                check_duplicate=True,
            )
        except ENGINE_ERRORS as error:
            raise SandboxStartError(
                f"cannot make the sandboxes' network: {explain(error)}"
            ) from None
