"""The relay route on the engine's side, without an engine: a phase's relay reaches every
policy the egress is given, a sandbox without an egress refuses one, and this machine's
address on a network is its gateway (tests/integration/test_relay_route.py has the real
engine)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from pytest_harbor.sandboxes.base import (
    FiltersEgress,
    ReachesThisMachine,
    SandboxError,
    set_phase_network,
)
from pytest_harbor.sandboxes.docker import sandbox as docker_sandbox
from pytest_harbor.sandboxes.docker.networks import NO_HOST_ADDRESS, gateway
from pytest_harbor.sandboxes.docker.sandbox import ComposeSandbox, DockerSandbox

RELAY = "172.17.0.1:8123"


class Plain:
    """A sandbox whose provider cannot filter its egress."""

    id = "plain-sandbox-id"

    def __init__(self) -> None:
        self.network: list[bool] = []

    def set_network(self, enabled: bool) -> None:
        self.network.append(enabled)


class Filtering(Plain):
    def __init__(self) -> None:
        super().__init__()
        self.egress: list[tuple[bool, tuple[str, ...] | None, str | None]] = []

    def set_egress(
        self, enabled: bool, hosts: tuple[str, ...] | None, relay: str | None = None
    ) -> None:
        self.egress.append((enabled, hosts, relay))


def test_a_phase_passes_its_relay_on_and_a_sandbox_that_cannot_filter_refuses_one() -> None:
    filtering = Filtering()
    set_phase_network(filtering, False, None, RELAY)  # type: ignore[arg-type]
    set_phase_network(filtering, True, ("listed.test",), RELAY)  # type: ignore[arg-type]
    set_phase_network(filtering, True, None)  # type: ignore[arg-type]
    assert filtering.egress == [
        (False, None, RELAY),
        (True, ("listed.test",), RELAY),
        (True, None, None),
    ]
    plain = Plain()
    with pytest.raises(SandboxError, match="cannot reach the model relay"):
        set_phase_network(plain, True, None, RELAY)  # type: ignore[arg-type]
    assert plain.network == []
    set_phase_network(plain, False, None)  # type: ignore[arg-type]
    assert plain.network == [False]


class Policies:
    """An egress that keeps the policies it is given."""

    outside = "outside-network"

    def __init__(self) -> None:
        self.given: list[tuple[str, Sequence[str], str | None]] = []

    def set_policy(self, mode: str, hosts: Sequence[str] = (), relay: str | None = None) -> None:
        self.given.append((mode, tuple(hosts), relay))


class Api:
    """An engine that keeps the network changes it is asked for."""

    def __init__(self) -> None:
        self.changes: list[str] = []

    def connect_container_to_network(self, *args: Any, **kwargs: Any) -> None:
        self.changes.append("connect")

    def disconnect_container_from_network(self, *args: Any, **kwargs: Any) -> None:
        self.changes.append("disconnect")


@pytest.fixture
def no_engine(monkeypatch: pytest.MonkeyPatch) -> Api:
    class Engine:
        api = Api()

    monkeypatch.setattr(docker_sandbox, "engine_for", lambda endpoint: Engine())
    return Engine.api


@pytest.mark.usefixtures("no_engine")
def test_every_policy_of_a_docker_sandbox_carries_the_phases_relay_the_public_one_too() -> None:
    sandbox = DockerSandbox("sandbox-id", online=False)
    egress = Policies()
    sandbox.egress = egress  # type: ignore[assignment]
    assert isinstance(sandbox, FiltersEgress) and isinstance(sandbox, ReachesThisMachine)
    sandbox.set_egress(True, None, RELAY)
    sandbox.set_egress(True, None, RELAY)
    sandbox.set_egress(False, None, RELAY)
    sandbox.set_egress(True, ("listed.test",), RELAY)
    sandbox.set_egress(True, None)
    sandbox.set_egress(False, None)
    assert egress.given == [
        ("public", (), RELAY),
        ("public", (), RELAY),
        ("none", (), RELAY),
        ("allowlist", ("listed.test",), RELAY),
        ("public", (), None),
        ("none", (), None),
    ]


def test_a_relay_that_is_not_an_address_and_port_changes_nothing(no_engine: Api) -> None:
    sandbox = DockerSandbox("sandbox-id", online=True)
    egress = Policies()
    sandbox.egress = egress  # type: ignore[assignment]
    for enabled, hosts in ((False, None), (True, ("listed.test",)), (True, None)):
        with pytest.raises(SandboxError, match="is not IP:PORT"):
            sandbox.set_egress(enabled, hosts, "relay.test:8123")
    assert (egress.given, no_engine.changes) == ([], [])


@pytest.mark.usefixtures("no_engine")
def test_a_compose_sandbox_gives_its_egress_the_relay_too() -> None:
    sandbox = ComposeSandbox("main-id", "project", online=False)
    egress = Policies()
    sandbox.egress = egress  # type: ignore[assignment]
    sandbox.set_egress(True, ("listed.test",), RELAY)
    sandbox.set_egress(False, None, RELAY)
    assert egress.given == [("allowlist", ("listed.test",), RELAY), ("none", (), RELAY)]


def test_a_docker_sandbox_without_an_egress_refuses_a_relay() -> None:
    for sandbox in (DockerSandbox("sandbox-id"), ComposeSandbox("main-id", "project")):
        with pytest.raises(SandboxError, match="not started `filtered`"):
            sandbox.set_egress(True, None, RELAY)


def test_on_the_host_network_this_machine_is_the_loopback() -> None:
    assert DockerSandbox("sandbox-id", network="host").host_address() == "127.0.0.1"


@pytest.mark.parametrize(
    ("config", "address"),
    [
        ([{"Subnet": "172.18.0.0/16", "Gateway": "172.18.0.1"}], "172.18.0.1"),
        ([{"Subnet": "fd00::/64", "Gateway": "fd00::1"}, {"Gateway": "10.1.0.1"}], "10.1.0.1"),
        ([{"Gateway": "10.2.0.1/24"}], "10.2.0.1"),
        ([{"Subnet": "fd00::/64", "Gateway": "fd00::1"}], "fd00::1"),
    ],
)
def test_this_machines_address_on_a_network_is_its_gateway_ipv4_first(
    config: list[dict[str, str]], address: str
) -> None:
    assert gateway({"IPAM": {"Config": config}}, "net") == address


@pytest.mark.parametrize(
    ("details", "why"),
    [
        ({"IPAM": {"Config": []}}, "names no gateway for the network net"),
        ({"IPAM": {"Config": None}}, "names no gateway"),
        ({"IPAM": {"Config": [{"Subnet": "10.3.0.0/16"}]}}, "names no gateway"),
        ({"IPAM": {"Config": [{"Gateway": "not an address"}]}}, "names no gateway"),
        ({}, "names no gateway"),
        (
            {
                "Options": {NO_HOST_ADDRESS: "true"},
                "IPAM": {"Config": [{"Gateway": "10.4.0.1"}]},
            },
            "the network net has no address on this machine",
        ),
    ],
)
def test_a_network_without_an_address_of_this_machine_is_said_so(
    details: dict[str, Any], why: str
) -> None:
    with pytest.raises(SandboxError, match=why):
        gateway(details, "net")
