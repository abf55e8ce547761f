"""What a sandbox may reach beyond the internet: the destinations the user names (the
`reach` setting) and the engine opens for its own services (the model relay), as the
border of a provider's sandboxes takes them (`sandboxes/routes.py`)."""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["THIS_MACHINE", "Opening", "check_reach", "reach_openings"]

#: The name of this machine in a `reach` entry: any of its addresses, as a sandbox reaches
#: it (its network's gateway), like Docker's `host-gateway`.
THIS_MACHINE = "host-gateway"
PROTOCOLS = ("tcp", "udp")
#: A name (or an IPv4 address) as a `reach` entry may give it.
_NAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?$")


@dataclass(frozen=True)
class Opening:
    """A destination the border lets a sandbox, a Compose service or a build step reach:
    `address` (an IP address; None: any address of the engine's machine, such as its
    bridges' gateways) on `port`, by `protocols`."""

    address: str | None
    port: int
    protocols: tuple[str, ...] = ("tcp",)

    def spec(self) -> str:
        """As the engine's watchdog takes it: `tcp+udp:ADDRESS:PORT`, `local` for this
        machine, an IPv6 address in brackets."""
        where = "local"
        if self.address is not None:
            address = ipaddress.ip_address(self.address)
            where = f"[{address}]" if address.version == 6 else str(address)
        return f"{'+'.join(self.protocols)}:{where}:{self.port}"


def _split(entry: str) -> tuple[str, int]:
    """(host, port) of one entry: an IPv6 address without its brackets, an IPv4 address
    or a name as written. Raises ValueError naming the entry."""
    host, colon, port = entry.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            valid_host = ipaddress.ip_address(host).version == 6
        except ValueError:
            valid_host = False
    else:
        valid_host = bool(_NAME.match(host))
    valid_port = port.isascii() and port.isdigit() and 0 < int(port) < 65536
    if not (colon and valid_host and valid_port):
        raise ValueError(
            f"reach entry {entry!r} is not HOST:PORT (an IPv4 address, [an IPv6 address], a "
            f"name or {THIS_MACHINE}, and a port 1-65535)"
        )
    return host, int(port)


def check_reach(entries: Sequence[str]) -> None:
    """Raise ValueError naming the first `reach` entry that is not HOST:PORT."""
    for entry in entries:
        _split(entry)


def reach_openings(entries: Sequence[str]) -> list[Opening]:
    """The openings `reach` entries name, TCP and UDP each: an address as it is,
    `host-gateway` as this machine, a name as each address this machine resolves it to
    now. Raises ValueError naming an entry that is not HOST:PORT or a name that does not
    resolve."""
    openings: list[Opening] = []
    for entry in entries:
        host, port = _split(entry)
        if host == THIS_MACHINE:
            addresses: list[str | None] = [None]
        else:
            try:
                addresses = [str(ipaddress.ip_address(host))]
            except ValueError:
                addresses = [*sorted(_resolve(entry, host))]
        openings += [Opening(address, port, PROTOCOLS) for address in addresses]
    return openings


def _resolve(entry: str, host: str) -> set[str]:
    try:
        found = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as error:
        raise ValueError(f"reach entry {entry!r}: {host} does not resolve ({error})") from None
    return {str(ipaddress.ip_address(str(item[4][0]).split("%")[0])) for item in found}


#: The name a sandbox reaches the model relay (an HTTP server of the engine's, on this
#: machine) by, in any phase given the relay: `http://model.pytest-harbor.internal/`, on
#: port 80, plain HTTP. Under `.internal`, which no public name can take.
RELAY_NAME = "model.pytest-harbor.internal"
