"""What a sandbox reaches beyond itself, phase by phase: the capabilities a provider's
sandboxes may have for it (an allow-list's egress, this machine's address) and the name
the model relay is reached by. `base.py` gives them with the rest of the contract."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["RELAY_NAME", "FiltersEgress", "ReachesThisMachine"]

#: The name a sandbox reaches the model relay (an HTTP server of the engine's, on this
#: machine) by, in any phase given the relay: `http://model.pytest-harbor.internal/`, on
#: port 80, plain HTTP. Under `.internal`, which no public name can take.
RELAY_NAME = "model.pytest-harbor.internal"


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
