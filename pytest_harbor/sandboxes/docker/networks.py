"""The network sandboxes with network access are on: one bridge per run and process on
each engine, on which containers cannot reach each other (inter-container traffic off),
so no episode reaches another's services; each reaches the outside as on the engine's
default bridge, where every container of the engine reaches every other."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping

from pytest_harbor.labels import OWNER_LABEL, RUN_LABEL
from pytest_harbor.sandboxes.base import SandboxStartError
from pytest_harbor.sandboxes.docker.engine import ENGINE_ERRORS, Endpoint, engine_for, explain

__all__ = ["ISOLATED_PREFIX", "IsolatedNetworks"]

#: The name of each such network begins so, then 12 random hex digits.
ISOLATED_PREFIX = "hb-isolated-"
#: The bridge driver's option that turns traffic between its containers off.
_NO_ICC = {"com.docker.network.bridge.enable_icc": "false"}


class IsolatedNetworks:
    """The isolated networks of one engine, made on first use: one per run and owner
    (labelled with them, so the run's sweep and the reaper remove it with the run's
    sandboxes)."""

    def __init__(self, endpoint: Endpoint | None) -> None:
        self._endpoint = endpoint
        self._made: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def for_labels(self, labels: Mapping[str, str]) -> str:
        key = (labels.get(RUN_LABEL, ""), labels.get(OWNER_LABEL, ""))
        with self._lock:
            name = self._made.get(key)
            if name is None:
                name = self._made[key] = self._make(key)
            return name

    def forget(self, name: str) -> None:
        """A network that is gone (a sweep removed it): the next sandbox makes another."""
        with self._lock:
            self._made = {key: made for key, made in self._made.items() if made != name}

    def _make(self, key: tuple[str, str]) -> str:
        name = ISOLATED_PREFIX + uuid.uuid4().hex[:12]
        run, owner = key
        labels = {
            label: value for label, value in ((RUN_LABEL, run), (OWNER_LABEL, owner)) if value
        }
        try:
            engine_for(self._endpoint).api.create_network(
                name, driver="bridge", options=_NO_ICC, labels=labels
            )
        except ENGINE_ERRORS as error:
            raise SandboxStartError(
                f"cannot make the sandboxes' network: {explain(error)}"
            ) from None
        return name
