"""What a sandbox reaches beyond itself, phase by phase: the capabilities a provider's
sandboxes may have for it (an allow-list's egress, this machine's address), the name
the model relay is reached by, and the openings in the border that keeps a sandbox with
the network to the internet alone. `base.py` gives them with the rest of the contract."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from pytest_harbor.reach import Opening

__all__ = [
    "BRIDGE_NAME_OPTION",
    "BRIDGE_PREFIX",
    "RELAY_NAME",
    "FiltersEgress",
    "GuardsBorder",
    "Opening",
    "ReachesThisMachine",
    "bridge_name",
]

#: The name a sandbox reaches the model relay (an HTTP server of the engine's, on this
#: machine) by, in any phase given the relay: `http://model.pytest-harbor.internal/`, on
#: port 80, plain HTTP. Under `.internal`, which no public name can take.
RELAY_NAME = "model.pytest-harbor.internal"
#: Every bridge the docker provider makes on an engine (the sandboxes' network, an
#: egress's, a Compose project's) is named with it; the engine host's border judges what
#: comes in on one (sandboxes/docker/egress/border.py).
BRIDGE_PREFIX = "phb"
#: The bridge driver's option that names its interface on the engine's machine.
BRIDGE_NAME_OPTION = "com.docker.network.bridge.name"


def bridge_name(kind: str, key: str) -> str:
    """The interface name of a bridge pytest-harbor makes: the prefix, one letter for its
    `kind` (`i` the sandboxes' network; `c` a Compose project's; `e` an enclosed one, with
    no route out and no address on the engine's machine: an egress's, a Compose project's
    behind an egress or without the network), and 11
    hex digits of `key` (the engine's ID, the network's name), 15 characters in all, the
    most an interface name may have."""
    return f"{BRIDGE_PREFIX}{kind[:1]}{hashlib.sha256(key.encode()).hexdigest()[:11]}"


@runtime_checkable
class GuardsBorder(Protocol):
    """A provider whose sandboxes with the network reach the internet alone (never this
    machine, link-local, private or shared addresses) but for what it is told to open."""

    def open_to(self, openings: Sequence[Opening]) -> None:
        """From the next sandbox on, these destinations open too (for this process's
        sandboxes); called before the first sandbox starts."""
        ...


@runtime_checkable
class FiltersEgress(Protocol):
    """A sandbox started `filtered` whose network can be an allow-list for a phase."""

    def set_egress(
        self, enabled: bool, hosts: tuple[str, ...] | None, relay: str | None = None
    ) -> None:
        """From now on: no network (`enabled` false), only `hosts` (names, `*.suffix`,
        addresses or networks), or the whole network (`hosts` None). While `relay` (the
        relay's `IP:PORT` on this machine) is given, the sandbox reaches it as
        `http://{RELAY_NAME}/` whatever else the phase allows; None: the name leads
        nowhere. Raises SandboxError."""
        ...


@runtime_checkable
class ReachesThisMachine(Protocol):
    """A sandbox that can say at which address it reaches a server on this machine (the
    model relay's)."""

    def host_address(self) -> str:
        """The IP address of this machine at which the sandbox's egress (and the sandbox
        itself, in a phase with the whole network) reaches a server listening on it: the
        gateway of the sandbox's outside network. Raises SandboxError, saying why, when
        there is none."""
        ...
