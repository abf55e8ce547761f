"""The border of the docker provider's sandboxes: a sandbox with the whole network reaches
the internet and nothing of this machine, its bridges' gateways, a private address or a
link-local one (a stand-in for the cloud's metadata service), by TCP or UDP, as root or
not, in a Compose project, in a build step and on a second engine; what the `reach`
setting names opens, and only that.

The targets: servers in containers of the test's own on networks it creates (one of them
at 169.254.169.254), and servers of the test process on this machine's addresses on those
networks and on the sandboxes' own (their gateways). Each answers a line naming itself."""

from __future__ import annotations

import json
import socket
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest

from pytest_harbor.sandboxes import ImageSource
from pytest_harbor.sandboxes.docker import Endpoint
from pytest_harbor.sandboxes.docker.images import TOOLS_IMAGE
from pytest_harbor.sandboxes.docker.networks import ISOLATED_NETWORK, IsolatedNetwork
from pytest_harbor.sandboxes.docker.watchdog import prepare_helper_image
from pytest_harbor.sandboxes.opensandbox.images import RegistryImages
from tests.fixtures import BASE_IMAGE, Dataset, run_harbor
from tests.second_engine import SecondEngine, image_archive

pytestmark = pytest.mark.docker

#: A server of TCP and UDP on one port, answering every connection and datagram with a
#: line: `python3 -c SERVE LINE PORT`.
SERVE = r"""
import socket, sys, threading
line, port = sys.argv[1].encode() + b"\n", int(sys.argv[2])
def tcp():
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port))
    server.listen(16)
    while True:
        client, _ = server.accept()
        client.sendall(line)
        client.close()
threading.Thread(target=tcp, daemon=True).start()
datagrams = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
datagrams.bind(("0.0.0.0", port))
while True:
    _, sender = datagrams.recvfrom(512)
    datagrams.sendto(line, sender)
"""
TARGET_PORT = 7000


class LineServer:
    """A server of the test process on one address of this machine, TCP and UDP on one
    port, answering with `line`."""

    def __init__(self, address: str, line: str, port: int = 0) -> None:
        self.line = line.encode() + b"\n"
        self.tcp = socket.socket()
        self.tcp.bind((address, port))
        self.port = self.tcp.getsockname()[1]
        self.tcp.listen(16)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind((address, self.port))
        self.answered = 0
        for target in (self._serve_tcp, self._serve_udp):
            threading.Thread(target=target, daemon=True).start()

    def _serve_tcp(self) -> None:
        while True:
            try:
                client, _ = self.tcp.accept()
            except OSError:
                return
            self.answered += 1
            with client:
                client.sendall(self.line)

    def _serve_udp(self) -> None:
        while True:
            try:
                _, sender = self.udp.recvfrom(512)
                self.answered += 1
                self.udp.sendto(self.line, sender)
            except OSError:
                return

    def close(self) -> None:
        for handle in (self.tcp, self.udp):
            handle.close()


@dataclass
class Targets:
    """What the probes try. On this machine: its addresses on the two engines' sandbox
    networks (their gateways), where a server of the test's answers on `host_port`. In
    containers on the second engine (whose own rules let the first engine's sandboxes
    through, as a neighbour on a private network would): a private address and the
    metadata service's."""

    gateways: dict[str, str]
    host_port: int
    private: str
    engine: SecondEngine
    metadata: str = "169.254.169.254"

    def values(self, on: str = "first") -> dict[str, str]:
        """What the probes read, for a sandbox on the engine `on`."""
        other = "second" if on == "first" else "first"
        return {
            "GATEWAY": self.gateways[on],
            "OTHER_GATEWAY": self.gateways[other],
            "HOST_PORT": str(self.host_port),
            "PRIVATE": self.private,
            "METADATA": self.metadata,
            "TARGET_PORT": str(TARGET_PORT),
        }

    def env(self, on: str = "first") -> str:
        """values() as a TOML inline table."""
        pairs = (f'{key} = "{value}"' for key, value in self.values(on).items())
        return "{ " + ", ".join(pairs) + " }"


def _gateway(client: docker.DockerClient, network: str) -> str:
    return str(client.api.inspect_network(network)["IPAM"]["Config"][0]["Gateway"])


def _serve_in_container(
    client: docker.DockerClient,
    image: str,
    mark: dict[str, str],
    network: str,
    name: str,
    address: str | None = None,
) -> str:
    container = client.containers.create(
        image,
        entrypoint=["python3", "-c", SERVE, f"{name}-secret", str(TARGET_PORT)],
        labels=mark,
    )
    client.networks.get(network).connect(container, ipv4_address=address)
    container.start()
    container.reload()
    return str(container.attrs["NetworkSettings"]["Networks"][network]["IPAddress"])


@pytest.fixture(scope="module")
def targets(docker_client: docker.DockerClient) -> Iterator[Targets]:
    mark = {"pytest-harbor.run": f"border-test-{uuid.uuid4().hex[:8]}"}
    helper = prepare_helper_image()
    engine = SecondEngine().start()
    servers: list[LineServer] = []
    try:
        second = engine.client()
        for tag in (helper, BASE_IMAGE, TOOLS_IMAGE):
            second.images.load(image_archive(docker_client, tag))
        gateways = {}
        for endpoint in (None, Endpoint(engine.url)):
            IsolatedNetwork(endpoint).name()
        gateways["first"] = _gateway(docker_client, ISOLATED_NETWORK)
        gateways["second"] = _gateway(second, ISOLATED_NETWORK)
        private = second.networks.create(f"harbor-border-{uuid.uuid4().hex[:8]}", labels=mark)
        link_local = second.networks.create(
            f"harbor-border-ll-{uuid.uuid4().hex[:8]}",
            labels=mark,
            ipam=docker.types.IPAMConfig(
                pool_configs=[docker.types.IPAMPool(subnet="169.254.169.0/24")]
            ),
        )
        private_address = _serve_in_container(second, helper, mark, private.name, "private")
        _serve_in_container(second, helper, mark, link_local.name, "metadata", "169.254.169.254")
        first = LineServer(gateways["first"], "gateway-secret")
        servers = [first, LineServer(gateways["second"], "host-secret", first.port)]
        yield Targets(gateways, first.port, private_address, engine)
    finally:
        for server in servers:
            server.close()
        engine.stop()


#: Probes: each prints the line its target answered, or `unreachable`.
PROBES = r"""
tcp() {
  answer=$(timeout 4 bash -c 'exec 3<>"/dev/tcp/$1/$2" && head -n 1 <&3' _ "$1" "$2" 2>/dev/null)
  echo "${answer:-unreachable}"
}
udp() {
  answer=$(timeout 4 bash -c 'exec 3<>"/dev/udp/$1/$2" && printf ping >&3 &&
    timeout 2 head -n 1 <&3' _ "$1" "$2" 2>/dev/null)
  echo "${answer:-unreachable}"
}
internet() {
  answer=$(timeout 10 bash -c 'exec 3<>/dev/tcp/deb.debian.org/80 &&
    printf "HEAD / HTTP/1.0\r\nHost: deb.debian.org\r\n\r\n" >&3 && head -n 1 <&3' 2>/dev/null)
  echo "${answer:0:5}"
}
probe_here() {
  echo "gateway tcp: $(tcp "$GATEWAY" "$HOST_PORT")"
  echo "gateway udp: $(udp "$GATEWAY" "$HOST_PORT")"
  echo "this machine tcp: $(tcp "$OTHER_GATEWAY" "$HOST_PORT")"
  echo "this machine udp: $(udp "$OTHER_GATEWAY" "$HOST_PORT")"
}
probe() {
  probe_here
  echo "private tcp: $(tcp "$PRIVATE" "$TARGET_PORT")"
  echo "private udp: $(udp "$PRIVATE" "$TARGET_PORT")"
  echo "metadata tcp: $(tcp "$METADATA" "$TARGET_PORT")"
  echo "metadata udp: $(udp "$METADATA" "$TARGET_PORT")"
  echo "internet: $(internet)"
}
"""

HERE = """gateway tcp: unreachable
gateway udp: unreachable
this machine tcp: unreachable
this machine udp: unreachable"""
EXPECTED = (
    HERE
    + """
private tcp: unreachable
private udp: unreachable
metadata tcp: unreachable
metadata udp: unreachable
internet: HTTP/"""
)

CHECK = (
    "cat /tmp/probes.txt\n"
    '[ "$(cat /tmp/probes.txt)" = "$EXPECTED" ] && echo 1 > /logs/verifier/reward.txt '
    "|| echo 0 > /logs/verifier/reward.txt\n"
)


def probing_task(
    dataset: Dataset,
    name: str,
    targets: Targets,
    *,
    expected: str = EXPECTED,
    probe: str = "probe",
    on: str = "first",
    agent: str = "",
    environment: str = "",
    dockerfile: str | None = None,
    extra_files: dict[str, str] | None = None,
) -> None:
    image = "" if dockerfile is not None or extra_files else f'docker_image = "{BASE_IMAGE}"\n'
    dataset.task(
        name,
        toml=f"[agent]\ntimeout_sec = 120\n{agent}"
        f"[verifier]\ntimeout_sec = 60\nenv = {{ EXPECTED = {json.dumps(expected)} }}\n"
        f'[environment]\n{image}workdir = "/app"\n{environment}'
        f"[solution]\nenv = {targets.env(on)}\n",
        solve_sh=PROBES + f"{probe} > /tmp/probes.txt\n",
        test_sh=CHECK,
        dockerfile=dockerfile,
        extra_files=extra_files,
    )


def only_on(engine: SecondEngine) -> str:
    hosts = {"hosts": [{"url": engine.url, "capacity": 2, "name": "second"}]}
    return f"--harbor-set=sandbox_provider_options={json.dumps(hosts)}"


def test_a_sandbox_with_the_network_reaches_the_internet_and_nothing_here(
    pytester: pytest.Pytester, harbor_dataset: Dataset, targets: Targets
) -> None:
    # Root (the oracle's default) and an agent user without privileges.
    probing_task(harbor_dataset, "as-root", targets)
    probing_task(harbor_dataset, "as-nobody", targets, agent='user = "nobody"\n')
    result = run_harbor(pytester, harbor_dataset, "-n", "2")
    assert result.ret == 0, result.stdout.str()[-4000:]
    result.assert_outcomes(passed=2)


def test_on_a_second_engine_a_sandbox_reaches_nothing_of_this_machine(
    pytester: pytest.Pytester, harbor_dataset: Dataset, targets: Targets
) -> None:
    # The second engine routes nothing out (no masquerade of its own): what its sandboxes
    # could reach without the border is this machine.
    probing_task(harbor_dataset, "second", targets, expected=HERE, probe="probe_here", on="second")
    result = run_harbor(pytester, harbor_dataset, only_on(targets.engine))
    assert result.ret == 0, result.stdout.str()[-4000:]
    result.assert_outcomes(passed=1)


def test_a_compose_service_reaches_the_internet_and_nothing_here(
    pytester: pytest.Pytester, harbor_dataset: Dataset, targets: Targets
) -> None:
    compose = "services:\n  main: {}\n"
    probing_task(
        harbor_dataset,
        "compose",
        targets,
        environment=f'docker_image = "{BASE_IMAGE}"\n',
        extra_files={"environment/docker-compose.yaml": compose},
    )
    result = run_harbor(pytester, harbor_dataset)
    assert result.ret == 0, result.stdout.str()[-4000:]
    result.assert_outcomes(passed=1)


def test_a_build_step_reaches_the_internet_and_nothing_here(
    pytester: pytest.Pytester, harbor_dataset: Dataset, targets: Targets
) -> None:
    # The probes run in a RUN step; what they found is in the image, which the verifier
    # reads.
    assignments = " ".join(f"{key}={value}" for key, value in targets.values().items())
    dockerfile = (
        f"FROM {BASE_IMAGE}\n"
        "COPY probes.sh /probes.sh\n"
        f"RUN {assignments} bash -c '. /probes.sh && probe > /tmp/probes.txt'\n"
    )
    probing_task(harbor_dataset, "build", targets, dockerfile=dockerfile)
    (harbor_dataset.path / "build" / "environment" / "probes.sh").write_text(PROBES)
    (harbor_dataset.path / "build" / "solution" / "solve.sh").write_text("true\n")
    result = run_harbor(pytester, harbor_dataset)
    assert result.ret == 0, result.stdout.str()[-4000:]
    result.assert_outcomes(passed=1)


def test_what_the_reach_setting_names_opens_and_nothing_else(
    pytester: pytest.Pytester, harbor_dataset: Dataset, targets: Targets
) -> None:
    expected = EXPECTED.replace("gateway tcp: unreachable", "gateway tcp: gateway-secret")
    expected = expected.replace("gateway udp: unreachable", "gateway udp: gateway-secret")
    expected = expected.replace("private tcp: unreachable", "private tcp: private-secret")
    expected = expected.replace("private udp: unreachable", "private udp: private-secret")
    # host-gateway is this machine at any of its addresses.
    expected = expected.replace("machine tcp: unreachable", "machine tcp: host-secret")
    expected = expected.replace("machine udp: unreachable", "machine udp: host-secret")
    probing_task(harbor_dataset, "reach", targets, expected=expected)
    reach = [f"{targets.private}:{TARGET_PORT}", f"host-gateway:{targets.host_port}"]
    result = run_harbor(pytester, harbor_dataset, f"--harbor-set=reach={json.dumps(reach)}")
    assert result.ret == 0, result.stdout.str()[-4000:]
    result.assert_outcomes(passed=1)


def test_opensandboxs_builds_on_this_machine_run_under_the_border(
    targets: Targets, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    # The OpenSandbox provider builds a task's image on this machine's engine before it
    # pushes it: the same probes in a RUN step there.
    assignments = " ".join(f"{key}={value}" for key, value in targets.values().items())
    (tmp_path / "probes.sh").write_text(PROBES)
    (tmp_path / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nCOPY probes.sh /probes.sh\n"
        f"RUN {assignments} bash -c '. /probes.sh && probe > /tmp/probes.txt'\n"
        f"LABEL pytest-harbor.run=border-test-{uuid.uuid4().hex[:8]}\n"
    )
    image = RegistryImages(None).local.prepare_image(
        ImageSource(docker_image=None, context_dir=tmp_path, build_timeout_sec=300.0)
    )
    try:
        found = docker_client.containers.run(image, ["cat", "/tmp/probes.txt"], remove=True)
        assert found.decode().strip() == EXPECTED
    finally:
        docker_client.images.remove(image, force=True)
