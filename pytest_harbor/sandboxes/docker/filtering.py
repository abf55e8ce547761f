"""Allow-listed networks on Docker: a sandbox whose network may be an allow-list reaches
the outside only through an egress of its own, which no process in the sandbox can
change.

The sandbox is on two networks: the provider's (the outside) and a network of its own
that Docker gives no route out (`internal`) and no address on this machine (the bridge
holds none), on which its only neighbour is its egress container (egress/egress.py). Its
names are resolved by the egress (the sandbox's DNS server is the egress's address).

- **Public**: both networks; the egress resolves every name as the engine does.
- **Allow-list**: the outside network is taken away, so the sandbox has no route but to
  the egress. The egress answers a listed name (or `*.suffix`) with its own address and
  forwards HTTP (port 80, by Host), TLS (443, by SNI) and proxy requests (3128, any port;
  the sandbox's `HTTP_PROXY`/`HTTPS_PROXY` name it); an unlisted name does not resolve,
  and a raw address has no route.
- **No network**: the outside network taken away, and the egress forwards nothing.

The relay route holds in all three: while a phase is given the model relay's address on
this machine, the egress answers RELAY_NAME with its own address and sends what comes for
it on port 80 (by Host, or through the proxy port) to that address, from its own place on
the outside network, whose gateway is this machine (`DockerSandbox.host_address()`); the
name reaches nothing else, and without a relay it does not resolve.

A Compose project behind an allow-list has every network internal (no address on this
machine either); each of its services also joins the egress's network and resolves names
through it, and the policy changes by phase as for one sandbox (compose.episode_project).

The policy lives in the egress container, written by the engine through its archive API;
the sandbox shares no namespace, file or process with it, and has no capability to change
routes or firewall rules. A root agent cannot widen any of it.
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import json
import tarfile
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pytest_harbor.labels import LABEL_PREFIX
from pytest_harbor.sandboxes.base import RELAY_NAME, ImageSource, SandboxError, SandboxStartError
from pytest_harbor.sandboxes.docker.engine import ENGINE_ERRORS, Endpoint, engine_for, explain
from pytest_harbor.sandboxes.docker.images import HELPER_CONTEXT, EngineImages
from pytest_harbor.sandboxes.docker.networks import NO_HOST_ADDRESS
from pytest_harbor.sandboxes.docker.projects import remove_container
from pytest_harbor.sandboxes.routes import BRIDGE_NAME_OPTION, bridge_name

__all__ = ["EGRESS_CONTEXT", "EGRESS_ROLE", "PROXY_PORT", "Egress", "check_relay", "start_egress"]

#: The egress image's build context (its Dockerfile and egress.py).
EGRESS_CONTEXT = HELPER_CONTEXT
#: The label that tells an egress container from a sandbox.
EGRESS_ROLE = LABEL_PREFIX + "role"
PROXY_PORT = 3128
_POLICY_DIR = "/run/egress"
_READY_S = 30.0


@dataclass
class Egress:
    """A sandbox's egress: its container, the network it shares with the sandbox only,
    its address there, and the outside network."""

    container: str
    network: str
    address: str
    outside: str
    endpoint: Endpoint | None

    def proxy_env(self, beside: Iterable[str] = ()) -> dict[str, str]:
        """The variables that send proxy-aware clients through the egress; the names
        `beside` (a Compose project's services), and the relay's (which the egress answers
        on port 80 itself), are reached directly."""
        proxy = f"http://{self.address}:{PROXY_PORT}"
        direct = ",".join(["localhost", "127.0.0.1", RELAY_NAME, *beside])
        return {
            name: proxy for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
        } | {"NO_PROXY": direct, "no_proxy": direct}

    def set_policy(self, mode: str, hosts: tuple[str, ...] = (), relay: str | None = None) -> None:
        """`public`, `allowlist` (with `hosts`) or `none`, and in each the relay's
        `IP:PORT` that RELAY_NAME leads to (None: it leads nowhere); raises SandboxError."""
        if relay is not None:
            check_relay(relay)
        policy = json.dumps(
            {"mode": mode, "hosts": list(hosts), "address": self.address, "relay": relay}
        )
        data = policy.encode()
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            info = tarfile.TarInfo("policy.json")
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
            archive.addfile(info, io.BytesIO(data))
        try:
            api = engine_for(self.endpoint).api
            if not api.put_archive(self.container, _POLICY_DIR, buffer.getvalue()):
                raise SandboxError(f"egress {self.container[:12]}: its policy was not written")
        except ENGINE_ERRORS as error:
            raise SandboxError(
                f"egress {self.container[:12]}: cannot write its policy: {explain(error)}"
            ) from None

    def remove(self) -> None:
        remove_container(self.container, self.endpoint)
        # Gone already, or a leftover for the reaper (it carries the run's labels).
        with contextlib.suppress(*ENGINE_ERRORS):
            engine_for(self.endpoint).api.remove_network(self.network)


def check_relay(relay: str) -> None:
    """The egress takes the relay as an address with a port (an IPv6 address in
    brackets), never a name it would resolve; it would read anything else as no relay
    at all, so it is refused here."""
    host, _, port = relay.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    try:
        address = ipaddress.ip_address(host[1:-1] if bracketed else host)
    except ValueError:
        address = None
    valid = (
        address is not None
        and (address.version == 6) == bracketed
        and port.isascii()
        and port.isdigit()
        and 0 < int(port) < 65536
    )
    if not valid:
        raise SandboxError(
            f"the model relay's address {relay!r} is not IP:PORT (an address of this "
            "machine, as host_address() gives it, and the port the relay listens on)"
        )


def start_egress(
    images: EngineImages,
    *,
    outside: str,
    labels: Mapping[str, str],
    endpoint: Endpoint | None,
) -> Egress:
    """A network of the sandbox's own and its egress on it (policy `none` until told
    otherwise), ready to answer; raises SandboxStartError (and leaves nothing behind)."""
    image = images.prepare_image(
        ImageSource(docker_image=None, context_dir=EGRESS_CONTEXT, build_timeout_sec=600.0)
    )
    api = engine_for(endpoint).api
    name = f"pytest-harbor-egress-{uuid.uuid4().hex[:12]}"
    container: str | None = None
    try:
        api.create_network(
            name,
            driver="bridge",
            internal=True,
            options={NO_HOST_ADDRESS: "true", BRIDGE_NAME_OPTION: bridge_name("e", name)},
            labels=dict(labels),
            check_duplicate=True,
        )
        created = api.create_container(
            image,
            labels={**labels, EGRESS_ROLE: "egress"},
            host_config=api.create_host_config(
                network_mode=outside,
                cap_drop=["ALL"],
                cap_add=["NET_BIND_SERVICE"],
                mem_limit="256m",
                pids_limit=512,
                security_opt=["no-new-privileges"],
            ),
            detach=True,
        )
        container = created["Id"]
        api.connect_container_to_network(container, name)
        egress = Egress(container, name, "", outside, endpoint)
        api.start(container)
        details = api.inspect_container(container)
        egress.address = details["NetworkSettings"]["Networks"][name]["IPAddress"]
        egress.set_policy("none")
        _wait_ready(api, container)
        return egress
    except (*ENGINE_ERRORS, SandboxError, KeyError) as error:
        if container is not None:
            remove_container(container, endpoint)
        with contextlib.suppress(*ENGINE_ERRORS):
            api.remove_network(name)
        raise SandboxStartError(f"the sandbox's egress did not start: {explain(error)}") from None


def _wait_ready(api: object, container: str) -> None:
    deadline = time.monotonic() + _READY_S
    while time.monotonic() < deadline:
        logs = api.logs(container)  # type: ignore[attr-defined]
        if b"egress: ready" in logs:
            return
        state = api.inspect_container(container)["State"]  # type: ignore[attr-defined]
        if not state.get("Running"):
            raise SandboxStartError(
                f"the sandbox's egress ended as it started: {logs.decode(errors='replace')[-500:]}"
            )
        time.sleep(0.05)
    raise SandboxStartError(f"the sandbox's egress was not ready within {_READY_S:g} s")
