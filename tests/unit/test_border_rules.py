"""The border's rules as text, the openings it takes, the `reach` setting that names them,
and the names of the bridges it judges (the rules' effect is tested against the real
engine in tests/integration/test_border.py)."""

from __future__ import annotations

import importlib.util
import ipaddress
import sys
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_harbor.reach import Opening, check_reach, reach_openings
from pytest_harbor.sandboxes.routes import BRIDGE_PREFIX, bridge_name
from pytest_harbor.settings import HarborSettings

HELPER = Path(__file__).parents[2] / "pytest_harbor" / "sandboxes" / "docker" / "egress"


def _program(name: str) -> ModuleType:
    sys.path.insert(0, str(HELPER))
    try:
        spec = importlib.util.spec_from_file_location(f"helper_{name}", HELPER / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(HELPER))


border = _program("border")
watchdog = _program("watchdog")


def test_the_rules_refuse_this_machine_and_every_range_not_the_internet() -> None:
    rules = border.base_rules(["10.255.255.53", "fd00::53"])
    assert 'add rule inet pytest_harbor input iifname "phb*" reject' in rules
    for blocked in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"):
        assert blocked in rules
    assert "169.254.0.0/16" in rules and "fe80::/10" in rules and "fc00::/7" in rules
    assert "224.0.0.0/3" in rules and "ff00::/8" in rules
    # The internet's documentation ranges (where one package mirror here answers) stay.
    assert "192.0.2.0" not in rules and "203.0.113.0" not in rules
    # DNS to the resolvers this machine names, and nothing else of theirs.
    assert "add element inet pytest_harbor resolvers4 { 10.255.255.53 }" in rules
    assert "add element inet pytest_harbor resolvers6 { fd00::53 }" in rules
    assert rules.count("th dport 53") == 4
    # Rebuilt whole, in one transaction, without touching the holders.
    assert "flush chain inet pytest_harbor input" in rules
    assert "flush chain inet pytest_harbor openings" not in rules


def test_the_blocked_ranges_cover_every_address_that_is_not_global() -> None:
    v4 = [ipaddress.ip_network(item) for item in border.BLOCKED_V4]
    v6 = [ipaddress.ip_network(item) for item in border.BLOCKED_V6]
    for address in ("10.1.2.3", "169.254.169.254", "100.64.0.1", "127.0.0.1", "224.0.0.1"):
        assert any(ipaddress.ip_address(address) in net for net in v4), address
    for address in ("fd00:ec2::254", "fe80::1", "::1", "ff02::1", "::ffff:10.0.0.1"):
        assert any(ipaddress.ip_address(address) in net for net in v6), address
    for address in ("8.8.8.8", "203.0.113.80", "151.101.0.1"):
        assert not any(ipaddress.ip_address(address) in net for net in v4), address


@pytest.mark.parametrize(
    ("opening", "rule"),
    [
        ("tcp:local:41234", "fib daddr type local meta l4proto { tcp } th dport 41234"),
        ("tcp+udp:10.0.0.5:5432", "ip daddr 10.0.0.5 meta l4proto { tcp, udp } th dport 5432"),
        ("udp:[fd00::5]:53", "ip6 daddr fd00::5 meta l4proto { udp } th dport 53"),
    ],
)
def test_an_opening_becomes_one_match(opening: str, rule: str) -> None:
    assert border.opening_rule(opening) == rule


@pytest.mark.parametrize(
    "opening",
    [
        "tcp:local:0",
        "tcp:local:65536",
        "icmp:local:1",
        "tcp+tcp:local:1",
        "tcp:fd00::5:53",  # IPv6 without brackets
        "tcp:[10.0.0.1]:53",
        "tcp:example.com:80",  # a name: the engine resolves none
        "tcp:1.2.3.4; flush ruleset:80",
        "tcp:local:80 accept",
    ],
)
def test_an_opening_that_is_not_exactly_one_destination_is_refused(opening: str) -> None:
    with pytest.raises(border.BorderError):
        border.opening_rule(opening)


@given(st.text(max_size=60))
def test_any_opening_text_is_refused_or_becomes_a_plain_match(text: str) -> None:
    try:
        rule = border.opening_rule(text)
    except border.BorderError:
        return
    assert ";" not in rule and "\n" not in rule and "{" in rule


def test_a_holder_is_a_chain_of_its_openings_and_one_jump() -> None:
    rules = border.holder_rules("hold_0123456789ab", ["tcp:local:1", "tcp+udp:10.0.0.5:2"])
    assert rules.splitlines() == [
        "add chain inet pytest_harbor hold_0123456789ab",
        "add rule inet pytest_harbor hold_0123456789ab "
        "fib daddr type local meta l4proto { tcp } th dport 1 accept",
        "add rule inet pytest_harbor hold_0123456789ab "
        "ip daddr 10.0.0.5 meta l4proto { tcp, udp } th dport 2 accept",
        "add rule inet pytest_harbor openings jump hold_0123456789ab",
    ]
    with pytest.raises(border.BorderError):
        border.Border("not-hex")


def test_the_resolvers_are_the_addresses_resolv_conf_names(tmp_path: Path) -> None:
    conf = tmp_path / "resolv.conf"
    conf.write_text(
        "# comment\nnameserver 10.255.255.53\nnameserver fe80::1%eth0\nnameserver bogus\n"
        "search example.com\n"
    )
    assert border.resolvers(str(conf)) == ["10.255.255.53", "fe80::1"]
    assert border.resolvers(str(tmp_path / "missing")) == []


def test_the_watchdog_reads_its_border_and_labels() -> None:
    parsed = watchdog.parse(
        ["/s", "ID", "--border", "0123456789ab", "--open", "tcp:local:1", "a=b"]
    )
    assert parsed == ("/s", "ID", "0123456789ab", ["tcp:local:1"], ["a=b"])
    assert watchdog.parse(["/s", "ID"]) == ("/s", "ID", None, [], [])
    assert watchdog.parse(["/s", "ID", "--open", "tcp:local:1"]) is None  # no holder
    assert watchdog.parse(["/s", "ID", "--border"]) is None
    assert watchdog.parse(["/s", "ID", "stray"]) is None


def test_every_bridge_name_fits_an_interface_name_and_carries_the_prefix() -> None:
    for kind in "iec":
        name = bridge_name(kind, "some key")
        assert name.startswith(BRIDGE_PREFIX + kind) and len(name) == 15
    assert bridge_name("i", "a") != bridge_name("i", "b")
    assert BRIDGE_PREFIX == border.BRIDGE_PREFIX


def test_reach_entries_become_tcp_and_udp_openings() -> None:
    openings = reach_openings(["10.0.0.5:5432", "[fd00::5]:53", "host-gateway:8000"])
    assert openings == [
        Opening("10.0.0.5", 5432, ("tcp", "udp")),
        Opening("fd00::5", 53, ("tcp", "udp")),
        Opening(None, 8000, ("tcp", "udp")),
    ]
    assert [item.spec() for item in openings] == [
        "tcp+udp:10.0.0.5:5432",
        "tcp+udp:[fd00::5]:53",
        "tcp+udp:local:8000",
    ]
    assert reach_openings(["localhost:8000"])[0].address in ("127.0.0.1", "::1")


@pytest.mark.parametrize("entry", ["10.0.0.5", "10.0.0.5:0", ":80", "host:http", "[::1:80"])
def test_a_reach_entry_that_is_not_host_and_port_is_refused_naming_it(entry: str) -> None:
    with pytest.raises(ValueError, match="reach entry"):
        check_reach([entry])
    with pytest.raises(ValueError, match="reach"):
        HarborSettings(reach=[entry])


def test_a_name_that_does_not_resolve_is_said() -> None:
    with pytest.raises(ValueError, match="does not resolve"):
        reach_openings(["no-such-host.invalid:80"])


def test_a_reply_passes_only_for_a_connection_begun_off_the_bridges() -> None:
    # A sandbox sharing a bridge with another can forge a packet "from this machine":
    # the connection it makes is marked as begun on a bridge, and no reply to it passes.
    rules = border.base_rules([])
    for chain in ("input", "forward"):
        mark = f'{chain} iifname "phb*" ct state new ct mark set ct mark or 0x08000000'
        reply = (
            f'{chain} iifname "phb*" ct state established,related '
            "ct mark and 0x08000000 == 0 accept"
        )
        assert rules.index(mark) < rules.index(reply)
    assert "ct state established,related accept" not in rules


def test_this_machines_neighbours_are_its_routes_without_a_gateway(tmp_path: Path) -> None:
    routes = tmp_path / "route"
    routes.write_text(
        "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n"
        "eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"  # default
        "eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"  # 192.0.2.0/24
        "phbi0123\t0000A8C0\t00000000\t0001\t0\t0\t0\t00F0FFFF\t0\t0\t0\n"  # its own
        "eth1\t0000000A\t0101000A\t0003\t0\t0\t0\t000000FF\t0\t0\t0\n"  # via a gateway
    )
    routes6 = tmp_path / "ipv6_route"
    routes6.write_text(
        "fd000000000000000000000000000000 40 00000000000000000000000000000000 00 "
        "00000000000000000000000000000000 00000100 00000001 00000000 00000001 eth0\n"
        "fe800000000000000000000000000000 40 00000000000000000000000000000000 00 "
        "00000000000000000000000000000000 00000100 00000001 00000000 00000001 eth0\n"
        "00000000000000000000000000000000 00 00000000000000000000000000000000 00 "
        "fd000000000000000000000000000001 00000400 00000001 00000000 00000003 eth0\n"
    )
    assert border.neighbours(str(routes), str(routes6)) == ["192.0.2.0/24", "fd00::/64"]
    rules = border.base_rules([], ["192.0.2.0/24", "192.0.2.0/25", "fd00::/64"])
    assert "add element inet pytest_harbor neighbours4 { 192.0.2.0/24 }" in rules
    assert 'forward iifname "phb*" ip daddr @neighbours4 reject' in rules
