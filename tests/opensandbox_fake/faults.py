"""Failures the fake serves on purpose, as a stalled proxy or a dropped connection would:
a command's event stream or a download that stops sending for a while, or is cut."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass
from typing import Literal

__all__ = ["Fault", "Faults"]


@dataclass
class Fault:
    """Served to the next `times` requests of `route` whose command line (path,
    command id) holds every string of `match`: after `after` events (bytes) sent, the
    rest is held `seconds` ("stall"), or the connection is cut ("cut"). A command runs on
    either way, as execd runs a command whoever listens. A "status" fault holds or cuts
    the answer to a command's status."""

    route: Literal["command", "download", "status"]
    match: tuple[str, ...]
    action: Literal["stall", "cut"]
    after: int = 1
    seconds: float = 0.0
    times: int = 1
    #: How many requests it was served to.
    served: int = 0


class Faults:
    """The faults waiting to be served."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: list[Fault] = []

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self._waiting.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self._waiting.clear()

    def take(self, route: str, detail: str) -> Fault | None:
        """The fault for this request, if any (served once more)."""
        with self._lock:
            for fault in self._waiting:
                if (
                    fault.route == route
                    and all(part in detail for part in fault.match)
                    and fault.served < fault.times
                ):
                    fault.served += 1
                    return fault
        return None


def cut(connection: socket.socket) -> None:
    """The connection dropped under the client, mid-answer."""
    with contextlib.suppress(OSError):
        connection.shutdown(socket.SHUT_RDWR)


class Holding:
    """What a stream sends, held from the moment a stall starts until it ends."""

    def __init__(self, fault: Fault | None) -> None:
        self.fault = fault
        self.sent = 0
        self.until = 0.0
        self.held: list[bytes] = []

    def holds(self, data: bytes) -> bool:
        """True when `data` waits (a stall); the fault starts once `after` are sent."""
        fault = self.fault
        if fault is not None and fault.action == "stall" and self.sent == fault.after:
            self.until = time.monotonic() + fault.seconds
        self.sent += 1
        if time.monotonic() < self.until:
            self.held.append(data)
            return True
        return False

    def cuts_now(self) -> bool:
        fault = self.fault
        return fault is not None and fault.action == "cut" and self.sent == fault.after

    def release(self) -> list[bytes]:
        """What was held, once the stall is over (waiting for it to end)."""
        time.sleep(max(0.0, self.until - time.monotonic()))
        held, self.held = self.held, []
        return held
