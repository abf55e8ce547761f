"""Nothing a process made is left on the engine after it dies, even with no later run: each
process that makes sandboxes holds a watchdog container on the engine (egress/watchdog.py).

The watchdog runs from the engine's helper image (the egress image, which holds both
programs), with the engine's socket mounted and no network. This process attaches to its
input through the engine's API and keeps that connection open, writing nothing. The
connection drops when this process ends in any way, SIGKILL included (the kernel closes
its sockets), and the engine then closes the watchdog's input (`StdinOnce`); the watchdog
removes every container, network, volume and snapshot image labelled with this run and
this process, and goes (`AutoRemove`). It works the same against a remote engine (the
connection is the engine's own API), and it never touches what another process made: the
process's own label is part of its filter.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

import docker.errors

from pytest_harbor.display import harbor_logger
from pytest_harbor.labels import LABEL_PREFIX
from pytest_harbor.sandboxes.base import ImageSource, SandboxError
from pytest_harbor.sandboxes.docker.engine import (
    ENGINE_ERRORS,
    Endpoint,
    engine_for,
    explain,
)
from pytest_harbor.sandboxes.docker.filtering import EGRESS_CONTEXT, EGRESS_ROLE
from pytest_harbor.sandboxes.docker.images import EngineImages
from pytest_harbor.sandboxes.routes import Opening

__all__ = ["WATCHDOG_LABEL", "Watchdog", "engine_socket", "prepare_helper_image"]

log = harbor_logger()

#: On a watchdog container: the labels it watches, as its filter.
WATCHDOG_LABEL = LABEL_PREFIX + "watchdog"
_SOCKET = "/var/run/docker.sock"
_READY_S = 30.0
_HELPER = ImageSource(docker_image=None, context_dir=EGRESS_CONTEXT, build_timeout_sec=600.0)


def engine_socket(endpoint: Endpoint | None, environ: Mapping[str, str]) -> str:
    """The engine's socket on the engine's own machine: the path of a `unix://` address
    (this machine's engine), else Docker's default place."""
    url = endpoint.url if endpoint is not None else environ.get("DOCKER_HOST", "")
    if url.startswith("unix://"):
        return url.removeprefix("unix://")
    return _SOCKET


def prepare_helper_image(endpoint: Endpoint | None = None) -> str:
    """The engine's helper image (the watchdog's and the egress's), made now if the engine
    lacks it; its tag. `.ci/setup` makes it ahead of a machine's first run."""
    return EngineImages(endpoint, "auto").prepare_image(_HELPER)


class Watchdog:
    """One process's watchdog on one engine; `arm` starts it, `disarm` lets it go."""

    def __init__(
        self,
        images: EngineImages,
        endpoint: Endpoint | None,
        socket_path: str,
        openings: tuple[Opening, ...] = (),
    ) -> None:
        self._images = images
        self._endpoint = endpoint
        self._socket_path = socket_path
        self._container: str | None = None
        self._connection: Any = None
        self._labels: dict[str, str] = {}
        #: What the border lets this process's sandboxes reach beyond the internet.
        self.openings = openings
        self._armed_with: tuple[dict[str, str], tuple[Opening, ...]] | None = None
        #: Lost, and not started again yet (the engine did not answer then).
        self._lost = False
        #: One change at a time: a watchdog whose input is let go sweeps everything of the
        #: process's, so two threads that both found it lost must not both start a new one
        #: (the second would let the first's go, and it would sweep the sandboxes started
        #: since).
        self._lock = threading.RLock()

    @property
    def armed(self) -> bool:
        return self._connection is not None

    def arm(self, labels: Mapping[str, str]) -> None:
        """Start the watchdog of what carries every one of `labels`; raises SandboxError
        (nothing left behind) when it cannot be started."""
        with self._lock:
            wanted = (dict(labels), self.openings)
            if self.armed and self._armed_with is not None:
                armed_labels, armed_openings = self._armed_with
                # The border alone (no labels) is held by any watchdog with its openings.
                if armed_openings == self.openings and wanted[0] in (armed_labels, {}):
                    return
            # Armed with other labels or openings (the border held before the process's
            # labels were known): a new one first, then the old one retires (it lets its
            # openings go and sweeps nothing).
            previous, previous_container = self._connection, self._container
            self._connection, self._container = None, None
            try:
                self._arm(labels)
            except SandboxError:
                self._connection, self._container = previous, previous_container
                raise
            self._armed_with = wanted
            if previous is not None:
                _let_go(previous, retire=True)

    def reopen(self, openings: tuple[Opening, ...]) -> None:
        """Hold `openings` from now on: an armed watchdog is replaced by one holding them
        (the same labels); raises SandboxError."""
        with self._lock:
            self.openings = openings
            if self.armed and self._armed_with is not None:
                self.arm(self._armed_with[0])

    def _arm(self, labels: Mapping[str, str]) -> None:
        self._labels = dict(labels)
        image = self._images.prepare_image(_HELPER)
        api = engine_for(self._endpoint).api
        watched = [f"{key}={value}" for key, value in sorted(labels.items())]
        holder = uuid.uuid4().hex[:12]
        border = ["--border", holder]
        for opening in self.openings:
            border += ["--open", opening.spec()]
        try:
            engine_id = str(api.info().get("ID") or "")
            created = api.create_container(
                image,
                entrypoint=["python3", "-u", "/watchdog.py"],
                command=["/engine.sock", engine_id, *border, *watched],
                name=f"pytest-harbor-watchdog-{holder}",
                labels={WATCHDOG_LABEL: ",".join(watched), EGRESS_ROLE: "watchdog"},
                # Not detached: the engine attaches the input and closes it when the one
                # client attached goes (StdinOnce).
                stdin_open=True,
                detach=False,
                host_config=api.create_host_config(
                    auto_remove=True,
                    # The border is the engine host's own firewall (egress/border.py).
                    network_mode="host",
                    cap_drop=["ALL"],
                    cap_add=["NET_ADMIN"],
                    binds={self._socket_path: {"bind": "/engine.sock", "mode": "rw"}},
                    mem_limit="64m",
                    pids_limit=64,
                    security_opt=["no-new-privileges"],
                ),
            )
            self._container = created["Id"]
            connection = api.attach_socket(
                self._container, params={"stdin": 1, "stream": 1, "stdout": 0, "stderr": 0}
            )
            api.start(self._container)
            self._wait_ready(api)
        except (*ENGINE_ERRORS, SandboxError) as error:
            self._forget(api)
            raise SandboxError(f"the watchdog did not start: {explain(error)}") from None
        self._connection = connection

    def lost(self) -> bool:
        """The watchdog is gone though disarm() was not called (the engine restarted, and
        the watchdog went with it): nothing watches this process any more. Asked of the
        engine (an engine that does not answer cannot tell: not lost, yet)."""
        if self._container is None:
            return self._lost
        try:
            state = engine_for(self._endpoint).api.inspect_container(self._container)["State"]
        except docker.errors.NotFound:
            return True
        except ENGINE_ERRORS:
            return False
        return not state.get("Running")

    def rearm(self) -> None:
        """A new watchdog for the labels of the last one (after lost()); raises
        SandboxError."""
        with self._lock:
            self.disarm()
            self._lost = True
            self.arm(self._labels)
            self._lost = False

    def rearm_if_lost(self) -> bool:
        """A new watchdog when this one is lost (rearm), asked and done as one step: of
        threads that find it lost at once, one starts the new one. Whether it did;
        raises SandboxError."""
        with self._lock:
            if not self.lost():
                return False
            self.rearm()
            return True

    def disarm(self) -> None:
        """Let the watchdog go: it sweeps what is left of this process's (nothing, when
        the process cleaned up) and removes itself."""
        with self._lock:
            self._disarm()

    def _disarm(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            _let_go(connection, retire=False)
        self._container = None

    def _wait_ready(self, api: Any) -> None:
        assert self._container is not None
        deadline = time.monotonic() + _READY_S
        while time.monotonic() < deadline:
            try:
                logs = api.logs(self._container)
            except ENGINE_ERRORS:
                logs = b""  # gone already: removed as it ended (AutoRemove)
            if b"watchdog: ready" in logs:
                return
            if b"watchdog: " in logs:
                raise SandboxError(logs.decode(errors="replace").strip()[-300:])
            time.sleep(0.05)
        raise SandboxError(f"not ready within {_READY_S:g} s")

    def _forget(self, api: Any) -> None:
        if self._container is not None:
            with contextlib.suppress(*ENGINE_ERRORS):
                api.remove_container(self._container, force=True)
        self._container = None


def _let_go(connection: Any, *, retire: bool) -> None:
    """End a watchdog's input: it lets its openings go, then sweeps what carries its
    labels, or (`retire`: a line written first) sweeps nothing."""
    raw = _socket_of(connection)
    if retire:
        with contextlib.suppress(OSError):
            raw.sendall(b"retire\n")
    with contextlib.suppress(OSError):
        # Shut down, not only closed: a socket closes only once every file made from it
        # is closed too, and the engine must see this one end now.
        raw.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        connection.close()
        raw.close()


def _socket_of(connection: Any) -> Any:
    """The socket under the docker SDK's attach stream (a SocketIO over a socket, or
    the socket itself)."""
    return getattr(connection, "_sock", connection)
