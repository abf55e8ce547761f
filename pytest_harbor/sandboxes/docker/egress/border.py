"""The border of an engine's sandboxes (pytest-harbor): what a sandbox, a Compose service or
a build step may reach beyond its own network, held in the engine host's own firewall.

Every bridge pytest-harbor makes on an engine is named with the prefix `phb`. The nftables
table `inet pytest_harbor` holds two chains on the host's input and forward hooks that
judge what comes in on such a bridge:

- into this machine (any of its addresses, the bridges' gateways included): refused;
- out of the bridge to a link-local, private, shared, loopback, multicast or reserved
  address (IPv4 or IPv6), or to the networks this machine's own interfaces are on:
  refused, any protocol;
- between two sandboxes of the sandboxes' network (`phbi`): refused;
- between two containers of another bridge, and to the internet: allowed;
- a reply: allowed only for a connection that began off the bridges (a connection whose
  first packet came in on one is marked), so that no container forges one "this machine
  began";
- DNS (port 53) to the resolvers this machine uses, which the engine's own resolver
  forwards sandboxes' queries to: allowed.

Openings are held by the processes that need them (the model relay's port on this
machine, the destinations the user named): each holder is a chain `hold_<id>` that the
`openings` chain jumps to, made by one watchdog (the process's keeper on the engine) and
deleted when its process is gone. A holder is alive while its watchdog holds the
abstract Unix socket of its name in the host's network namespace, which the kernel
releases however the watchdog ends; a holder whose socket is free is a leftover, and the
next watchdog to start deletes it.

It runs in the watchdog's container (the host's network namespace, CAP_NET_ADMIN) and
uses the `nft` program. Standard library only.

    python3 border.py show [OPENING ...]    # prints the rules it would install
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
import subprocess
import sys

TABLE = "inet pytest_harbor"
#: Every bridge pytest-harbor makes is named with it (the engine side: networks.py).
BRIDGE_PREFIX = "phb"
_HOLDER = re.compile(r"^hold_[0-9a-f]{12}$")
#: Refused destinations once out of a bridge: IPv4.
BLOCKED_V4 = (
    "0.0.0.0/8",  # "this network"
    "10.0.0.0/8",  # private
    "100.64.0.0/10",  # shared (carrier-grade NAT)
    "127.0.0.0/8",  # loopback
    "169.254.0.0/16",  # link-local: the cloud metadata service
    "172.16.0.0/12",  # private
    "192.0.0.0/24",  # protocol assignments
    "192.168.0.0/16",  # private
    "198.18.0.0/15",  # benchmarking
    "224.0.0.0/3",  # multicast, reserved, broadcast
)
#: Refused destinations once out of a bridge: IPv6.
BLOCKED_V6 = (
    "::/127",  # unspecified, loopback
    "::ffff:0.0.0.0/96",  # IPv4-mapped
    "64:ff9b:1::/48",  # local-use NAT64
    "fc00::/7",  # unique local (the cloud's IPv6 metadata address is one)
    "fe80::/10",  # link-local
    "ff00::/8",  # multicast
    "2001:db8::/32",  # documentation
    # The refused IPv4 ranges, as NAT64 (64:ff9b::/96) and 6to4 (2002::/16) embed them.
    "64:ff9b::a00:0/104",
    "64:ff9b::6440:0/106",
    "64:ff9b::7f00:0/104",
    "64:ff9b::a9fe:0/112",
    "64:ff9b::ac10:0/108",
    "64:ff9b::c0a8:0/112",
    "2002:a00::/24",
    "2002:6440::/26",
    "2002:7f00::/24",
    "2002:a9fe::/32",
    "2002:ac10::/28",
    "2002:c0a8::/32",
)
#: The bit of a connection's mark that says its first packet came in on a pytest-harbor
#: bridge: what comes in later on one is a reply the border lets through only when the
#: connection began elsewhere (a sandbox on a bridge it shares with another can forge a
#: packet that seems to come from this machine, and so a connection "this machine began").
BEGUN_ON_BRIDGE = "0x08000000"
_PROTOCOLS = ("tcp", "udp")


#: The version of the base rules: a watchdog leaves the table's rules to those of a later
#: version (another pytest-harbor may run on the same engine), and brings an earlier
#: version's up to its own. Raised with every change to base_rules().
RULES_VERSION = 3


class BorderError(Exception):
    """nft refused a change, or an opening is not understood."""


def _sets(resolvers: list[str], neighbours: list[str]) -> list[str]:
    """The script's lines that make the table's sets and fill them anew."""
    lines = [
        f"add set {TABLE} resolvers4 {{ type ipv4_addr; }}",
        f"add set {TABLE} resolvers6 {{ type ipv6_addr; }}",
        f"add set {TABLE} neighbours4 {{ type ipv4_addr; flags interval; }}",
        f"add set {TABLE} neighbours6 {{ type ipv6_addr; flags interval; }}",
    ]
    for version in (4, 6):
        addresses = {ipaddress.ip_address(item) for item in resolvers}
        found = sorted(str(item) for item in addresses if item.version == version)
        lines.append(f"flush set {TABLE} resolvers{version}")
        if found:
            lines.append(f"add element {TABLE} resolvers{version} {{ {', '.join(found)} }}")
        networks = [ipaddress.ip_network(item) for item in neighbours]
        # An interval set takes no two that overlap.
        collapsed: list[object] = list(
            ipaddress.collapse_addresses(  # type: ignore[type-var]
                [item for item in networks if item.version == version]
            )
        )
        found = [str(item) for item in collapsed]
        lines.append(f"flush set {TABLE} neighbours{version}")
        if found:
            lines.append(f"add element {TABLE} neighbours{version} {{ {', '.join(found)} }}")
    return lines


def base_rules(resolvers: list[str], neighbours: list[str] | None = None) -> str:
    """The nft script that makes (or brings up to date) the table, its chains and rules,
    leaving the holders and their jumps alone: `resolvers` are the addresses DNS may go
    to, `neighbours` the networks this machine's own interfaces are on (refused as the
    ranges are)."""
    bridge = f'iifname "{BRIDGE_PREFIX}*"'
    lines = [
        f"add table {TABLE}",
        f"add set {TABLE} version {{ type inet_service; }}",
        f"flush set {TABLE} version",
        f"add element {TABLE} version {{ {RULES_VERSION} }}",
        *_sets(resolvers, neighbours or []),
        f"add chain {TABLE} openings",
        f"add chain {TABLE} input {{ type filter hook input priority -10; policy accept; }}",
        f"add chain {TABLE} forward {{ type filter hook forward priority -10; policy accept; }}",
    ]
    dns = "meta l4proto { tcp, udp } th dport 53"
    lines += [f"flush chain {TABLE} input", f"flush chain {TABLE} forward"]
    for chain in ("input", "forward"):
        rule = f"add rule {TABLE} {chain} {bridge}"
        lines += [
            f"{rule} ct state new ct mark set ct mark or {BEGUN_ON_BRIDGE}",
            f"{rule} ct state established,related ct mark and {BEGUN_ON_BRIDGE} == 0 accept",
            f"{rule} jump openings",
            f"{rule} {dns} ip daddr @resolvers4 accept",
            f"{rule} {dns} ip6 daddr @resolvers6 accept",
        ]
    lines.insert(
        lines.index(f"add rule {TABLE} forward {bridge} jump openings"),
        # Between two sandboxes of the sandboxes' network (or two engines'): never, even
        # where the engine does not turn its containers' traffic off itself (an engine run
        # without its own iptables rules). A sandbox reaches its egress on the egress's
        # network, the relay on this machine.
        f'add rule {TABLE} forward iifname "{BRIDGE_PREFIX}i*" oifname "{BRIDGE_PREFIX}i*" '
        "reject with icmpx admin-prohibited",
    )
    lines += [
        # Into this machine: nothing else.
        f"add rule {TABLE} input {bridge} meta l4proto tcp reject with tcp reset",
        f"add rule {TABLE} input {bridge} reject with icmpx admin-prohibited",
        # Between two containers of the same bridge: the route back out of the bridge it
        # came in on; or out on an enclosed bridge (`phbe`: no address here, so no route
        # leads into it, and what goes out on it was passed along inside it).
        f"add rule {TABLE} forward {bridge} fib daddr . iif oif exists accept",
        f'add rule {TABLE} forward {bridge} oifname "{BRIDGE_PREFIX}e*" accept',
        f"add rule {TABLE} forward {bridge} ip daddr {{ {', '.join(BLOCKED_V4)} }} "
        "meta l4proto tcp reject with tcp reset",
        f"add rule {TABLE} forward {bridge} ip daddr {{ {', '.join(BLOCKED_V4)} }} "
        "reject with icmpx admin-prohibited",
        f"add rule {TABLE} forward {bridge} ip6 daddr {{ {', '.join(BLOCKED_V6)} }} "
        "meta l4proto tcp reject with tcp reset",
        f"add rule {TABLE} forward {bridge} ip6 daddr {{ {', '.join(BLOCKED_V6)} }} "
        "reject with icmpx admin-prohibited",
        # This machine's neighbours, whatever their range.
        f"add rule {TABLE} forward {bridge} ip daddr @neighbours4 reject with icmpx "
        "admin-prohibited",
        f"add rule {TABLE} forward {bridge} ip6 daddr @neighbours6 reject with icmpx "
        "admin-prohibited",
    ]
    return "\n".join(lines) + "\n"


def opening_rule(opening: str) -> str:
    """The match of one opening, `PROTOCOLS:ADDRESS:PORT`: PROTOCOLS `tcp`, `udp` or
    `tcp+udp`; ADDRESS `local` (any address of this machine) or an IP address (IPv6 in
    brackets); PORT 1-65535. Raises BorderError."""
    protocols, _, rest = opening.partition(":")
    address, _, port = rest.rpartition(":")
    chosen = protocols.split("+")
    if (
        not chosen
        or any(name not in _PROTOCOLS for name in chosen)
        or len(set(chosen)) < len(chosen)
    ):
        raise BorderError(f"opening {opening!r}: protocols must be tcp, udp or tcp+udp")
    if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise BorderError(f"opening {opening!r}: the port must be 1-65535")
    if address == "local":
        where = "fib daddr type local"
    else:
        bracketed = address.startswith("[") and address.endswith("]")
        try:
            ip = ipaddress.ip_address(address[1:-1] if bracketed else address)
        except ValueError:
            raise BorderError(f"opening {opening!r}: {address!r} is no IP address") from None
        if (ip.version == 6) != bracketed:
            raise BorderError(f"opening {opening!r}: an IPv6 address goes in brackets")
        where = f"{'ip' if ip.version == 4 else 'ip6'} daddr {ip}"
    return f"{where} meta l4proto {{ {', '.join(chosen)} }} th dport {int(port)}"


def holder_rules(holder: str, openings: list[str]) -> str:
    """The nft script that makes the holder's chain, its openings, and the jump to it."""
    lines = [f"add chain {TABLE} {holder}"]
    lines += [f"add rule {TABLE} {holder} {opening_rule(item)} accept" for item in openings]
    lines.append(f"add rule {TABLE} openings jump {holder}")
    return "\n".join(lines) + "\n"


def nft(script: str) -> None:
    """Run an nft script as one transaction: all of it or nothing. Raises BorderError."""
    try:
        done = subprocess.run(
            ["nft", "-f", "-"], input=script.encode(), capture_output=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise BorderError(f"cannot run nft: {error}") from None
    if done.returncode != 0:
        raise BorderError(done.stderr.decode(errors="replace").strip()[-500:])


def installed_version() -> int:
    """The version of the rules the table holds (0: no table, or one from before the
    versions)."""
    try:
        done = subprocess.run(
            ["nft", "-j", "list", "set", *TABLE.split(), "version"],
            capture_output=True,
            timeout=30,
        )
        listed = json.loads(done.stdout or b"{}") if done.returncode == 0 else {}
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return 0
    for item in listed.get("nftables", []) if isinstance(listed, dict) else []:
        found = (item.get("set") or {}).get("elem") if isinstance(item, dict) else None
        if isinstance(found, list) and found and isinstance(found[0], int):
            return int(found[0])
    return 0


def _jumps() -> dict[str, list[int]]:
    """The holders the openings chain jumps to, with the handles of those jumps."""
    try:
        done = subprocess.run(
            ["nft", "-j", "-a", "list", "chain", *TABLE.split(), "openings"],
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise BorderError(f"cannot run nft: {error}") from None
    if done.returncode != 0:
        raise BorderError(done.stderr.decode(errors="replace").strip()[-500:])
    found: dict[str, list[int]] = {}
    for item in json.loads(done.stdout or b"{}").get("nftables", []):
        rule = item.get("rule") if isinstance(item, dict) else None
        if not isinstance(rule, dict):
            continue
        for expression in rule.get("expr", []):
            target = (
                (expression.get("jump") or {}).get("target")
                if isinstance(expression, dict)
                else None
            )
            if isinstance(target, str) and _HOLDER.match(target):
                found.setdefault(target, []).append(int(rule["handle"]))
    return found


def _release(holder: str, handles: list[int]) -> str:
    lines = [f"delete rule {TABLE} openings handle {handle}" for handle in handles]
    lines += [f"flush chain {TABLE} {holder}", f"delete chain {TABLE} {holder}"]
    return "\n".join(lines) + "\n"


def _claim(holder: str) -> socket.socket | None:
    """The holder's abstract socket, bound now; None when another process holds it."""
    claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        claim.bind(f"\0pytest-harbor-border-{holder}")
    except OSError:
        claim.close()
        return None
    return claim


class Border:
    """One process's place at the border: the table made, its openings held."""

    def __init__(self, holder_id: str) -> None:
        self.holder = f"hold_{holder_id}"
        if not _HOLDER.match(self.holder):
            raise BorderError(f"holder id {holder_id!r} is not 12 hex digits")
        self._claim: socket.socket | None = None

    def install(
        self,
        openings: list[str],
        resolvers: list[str],
        neighbours: list[str] = (),  # type: ignore[assignment]
    ) -> None:
        """Make the table (or bring it up to date), delete leftover holders, and hold
        `openings`. Raises BorderError."""
        for item in openings:
            opening_rule(item)  # a bad one is refused before anything changes
        self._claim = _claim(self.holder)
        if self._claim is None:
            raise BorderError(f"another process holds {self.holder}")
        if installed_version() <= RULES_VERSION:
            nft(base_rules(resolvers, neighbours))
        self.collect()
        if openings:
            nft(holder_rules(self.holder, openings))

    def collect(self) -> int:
        """Delete the holders whose process is gone; how many."""
        collected = 0
        for holder, handles in _jumps().items():
            if holder == self.holder:
                continue
            claim = _claim(holder)
            if claim is None:
                continue  # alive
            try:
                nft(_release(holder, handles))
                collected += 1
            except BorderError:
                pass  # another watchdog collected it first
            finally:
                claim.close()
        return collected

    def release(self) -> None:
        """Let this process's openings go. Raises BorderError."""
        try:
            handles = _jumps().get(self.holder)
            if handles:
                nft(_release(self.holder, handles))
        finally:
            if self._claim is not None:
                self._claim.close()
                self._claim = None


def neighbours(routes: str = "/proc/net/route", routes6: str = "/proc/net/ipv6_route") -> list[str]:
    """The networks this machine's own interfaces are on (its routes without a gateway),
    but for pytest-harbor's bridges and the default route: its neighbours."""
    found: list[ipaddress.IPv4Network | ipaddress.IPv6Network | None] = [
        _route4(line.split()) for line in _lines(routes)[1:]
    ]
    found += [_route6(line.split()) for line in _lines(routes6)]
    return sorted({str(network) for network in found if network is not None})


def _route4(fields: list[str]) -> ipaddress.IPv4Network | None:
    """A line of /proc/net/route: the network of a route without a gateway."""
    if len(fields) < 8 or fields[0].startswith(BRIDGE_PREFIX):
        return None
    try:
        # Each as the kernel holds it: a little-endian word, in hex.
        destination, gateway, mask = (
            int.from_bytes(int(fields[index], 16).to_bytes(4, "little"), "big")
            for index in (1, 2, 7)
        )
        if gateway or not mask:
            return None
        return ipaddress.IPv4Network((destination, bin(mask).count("1")), strict=False)
    except (ValueError, OverflowError):
        return None


def _route6(fields: list[str]) -> ipaddress.IPv6Network | None:
    """A line of /proc/net/ipv6_route: the network of a route without a gateway (not the
    default, not loopback, not link-local or multicast, which are refused already)."""
    if len(fields) < 10 or fields[9].startswith(BRIDGE_PREFIX) or fields[9] == "lo":
        return None
    try:
        length, gateway = int(fields[1], 16), int(fields[4], 16)
        network = ipaddress.IPv6Network((int(fields[0], 16), length), strict=False)
    except ValueError:
        return None
    if gateway or not length or network.is_link_local or network.is_multicast:
        return None
    return network


def _lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(1 << 20).splitlines()
    except OSError:
        return []


def resolvers(path: str = "/etc/resolv.conf") -> list[str]:
    """The name servers this machine's resolver configuration names (IP addresses only)."""
    found: list[str] = []
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = handle.read(1 << 16).splitlines()
    except OSError:
        return found
    for line in lines:
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            try:
                found.append(str(ipaddress.ip_address(parts[1].split("%")[0])))
            except ValueError:
                continue
    return found


if __name__ == "__main__":
    if sys.argv[1:2] == ["show"]:
        print(base_rules(resolvers(), neighbours()), end="")
        print(holder_rules("hold_000000000000", sys.argv[2:]), end="")
