"""The relay route on the docker provider: a sandbox started `filtered` reaches a server on
this machine (listening at the sandbox's `host_address()`) as the relay's name in a phase
given the relay, whatever else the phase allows, directly and through the egress's proxy
port; in a phase without the whole network nothing else of this machine, root included
(it lacks CAP_NET_ADMIN); without a relay the name leads nowhere."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pytest_harbor.sandboxes import SandboxSpec
from pytest_harbor.sandboxes.base import (
    RELAY_NAME,
    ROOT_USER,
    TRUSTED_BUSYBOX,
    ReachesThisMachine,
    set_phase_network,
)
from pytest_harbor.sandboxes.docker import DockerProvider, DockerSandbox
from pytest_harbor.sandboxes.docker.networks import IsolatedNetwork, host_address
from pytest_harbor.sandboxes.routes import Opening
from tests.fixtures import BASE_IMAGE

pytestmark = pytest.mark.docker

#: Who asks: root, and a user of no privilege at all.
USERS = (ROOT_USER, "65534:65534")
#: A name no phase of these tests lists or reaches.
ELSEWHERE = "http://example.com/"


class Answers(BaseHTTPRequestHandler):
    """Answers every GET with the server's body."""

    def do_GET(self) -> None:
        body = self.server.body  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@dataclass
class Route:
    sandbox: DockerSandbox
    #: The server's `IP:PORT` on this machine, which a phase is given as its relay.
    relay: str
    body: str

    def fetch(self, url: str, *, user: str, proxy: bool) -> str | None:
        """What a GET of `url` in the sandbox answers (through the egress's proxy port
        when `proxy`, as proxy-aware clients go, else straight), or None when it fails."""
        # Busybox's own `wget -T` crashes (1.35); its `timeout` bounds the try instead.
        command = [TRUSTED_BUSYBOX, "timeout", "10", TRUSTED_BUSYBOX, "wget", "-q", "-O-"]
        if not proxy:
            command += ["-Y", "off"]
        result = self.sandbox.exec([*command, url], user=user, timeout=30)
        return result.stdout if result.exit_code == 0 and not result.timed_out else None

    def outcomes(self, url: str) -> set[str | None]:
        """What `url` gives every user, by either way (all at once: a try with no route
        takes seconds to fail)."""
        tries = [(user, proxy) for user in USERS for proxy in (True, False)]
        with ThreadPoolExecutor(len(tries)) as pool:
            return set(pool.map(lambda way: self.fetch(url, user=way[0], proxy=way[1]), tries))

    @property
    def by_name(self) -> str:
        return f"http://{RELAY_NAME}/anything"

    @property
    def raw(self) -> str:
        return f"http://{self.relay}/"


@pytest.fixture
def route(labels: dict[str, str]) -> Iterator[Route]:
    """A sandbox started `filtered` without network, and a server on this machine at its
    host_address() that answers a body of its own, its port opened in the border as the
    relay's is."""
    provider = DockerProvider()
    address = host_address(None, IsolatedNetwork(None).name())
    server = ThreadingHTTPServer((address, 0), Answers)
    body = f"relay-{uuid.uuid4().hex}"
    server.body = body.encode()  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    provider.open_to([Opening(None, server.server_address[1])])
    sandbox = provider.start(
        SandboxSpec(image=BASE_IMAGE, labels=labels, filtered=True, network=False)
    )
    try:
        assert isinstance(sandbox, ReachesThisMachine)
        assert sandbox.host_address() == address
        yield Route(sandbox, f"{address}:{server.server_address[1]}", body)
    finally:
        sandbox.stop()
        provider.unwatch()
        server.shutdown()
        server.server_close()


def test_without_network_the_relays_name_reaches_it_and_nothing_else_does(route: Route) -> None:
    set_phase_network(route.sandbox, False, None, route.relay)
    assert route.outcomes(route.by_name) == {route.body}
    assert route.fetch(f"http://{RELAY_NAME}:80/x", user=ROOT_USER, proxy=False) == route.body
    # The relay's own address, another port of the name, any other host: nowhere.
    assert route.outcomes(route.raw) == {None}
    assert route.outcomes(f"http://{RELAY_NAME}:{route.relay.rsplit(':', 1)[1]}/") == {None}
    assert route.outcomes(ELSEWHERE) == {None}
    # The phase's relay taken away: the name leads nowhere.
    set_phase_network(route.sandbox, False, None, None)
    assert route.outcomes(route.by_name) == {None}


def test_behind_an_allow_list_the_relay_is_reached_by_name_only(route: Route) -> None:
    set_phase_network(route.sandbox, True, ("listed.harbor.test",), route.relay)
    assert route.outcomes(route.by_name) == {route.body}
    assert route.outcomes(route.raw) == {None}
    assert route.outcomes(ELSEWHERE) == {None}
    set_phase_network(route.sandbox, True, ("listed.harbor.test",), None)
    assert route.outcomes(route.by_name) == {None}


def test_with_the_whole_network_the_relay_is_reached_by_name_and_by_address(
    route: Route,
) -> None:
    set_phase_network(route.sandbox, True, None, route.relay)
    assert route.outcomes(route.by_name) == {route.body}
    assert route.outcomes(route.raw) == {route.body}
    # The whole network without a relay: the address still answers, the name does not.
    set_phase_network(route.sandbox, True, None, None)
    assert route.outcomes(route.raw) == {route.body}
    assert route.outcomes(route.by_name) == {None}
