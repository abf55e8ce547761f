"""Attacks on the border (sandboxes/docker/egress/border.py), written by a red team: each
test is a task (its Compose file, Dockerfile or solve.sh) trying to reach what the border
promises no sandbox reaches, and passes when the border holds.

The targets are servers of the test process on this machine's address on a network the
test makes (its gateway): the border refuses anything a sandbox sends to any address of
this machine."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import docker
import pytest

from pytest_harbor.sandboxes.docker.watchdog import prepare_helper_image
from tests.fixtures import Dataset, run_harbor
from tests.integration.test_border import CHECK, LineServer

pytestmark = pytest.mark.docker


@dataclass
class HostTarget:
    """A server of the test's on this machine: TCP and UDP on `port` at `address`, this
    machine's address on a network of the test's."""

    address: str
    port: int


@pytest.fixture(scope="module")
def host_target(docker_client: docker.DockerClient) -> Iterator[HostTarget]:
    mark = {"pytest-harbor.run": f"border-attack-{uuid.uuid4().hex[:8]}"}
    # An address of this machine no rule of Docker's rewrites (as a host's own interfaces
    # are): the network's traffic out is not masqueraded.
    network = docker_client.networks.create(
        f"harbor-attack-{uuid.uuid4().hex[:8]}",
        labels=mark,
        options={"com.docker.network.bridge.enable_ip_masquerade": "false"},
    )
    try:
        network.reload()
        address = str(network.attrs["IPAM"]["Config"][0]["Gateway"])
        server = LineServer(address, "host-secret")
        try:
            yield HostTarget(address, server.port)
        finally:
            server.close()
    finally:
        network.remove()


#: The Compose service beside `main`: it tries, from fixed ports, to reach this machine
#: (TCP from 5556, UDP from 5557) again and again, and serves on port 9000 what it got.
PEER = r"""
import socket, sys, threading, time
target = (sys.argv[1], int(sys.argv[2]))
found = {"tcp": "unreachable", "udp": "unreachable"}
def serve():
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", 9000))
    server.listen(8)
    while True:
        client, _ = server.accept()
        with client:
            client.sendall(f"{found['tcp']}|{found['udp']}\n".encode())
threading.Thread(target=serve, daemon=True).start()
datagrams = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
datagrams.bind(("0.0.0.0", 5557))
datagrams.settimeout(0.3)
while True:
    if found["tcp"] == "unreachable":
        try:
            stream = socket.socket()
            stream.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            stream.bind(("0.0.0.0", 5556))
            stream.settimeout(1)
            stream.connect(target)
            found["tcp"] = stream.recv(100).decode().strip() or "unreachable"
            stream.close()
        except OSError:
            stream.close()
    if found["udp"] == "unreachable":
        try:
            datagrams.sendto(b"ping", target)
            found["udp"] = datagrams.recv(100).decode().strip()
        except OSError:
            pass
    time.sleep(0.3)
"""

#: solve.sh's program in `main`, as root (CAP_NET_RAW, which Docker gives by default):
#: it writes onto its bridge frames that claim to come from this machine's address and
#: go to the peer's ports, addressed to a MAC address no one has (so the peer's kernel
#: never sees them and never answers them). The host's connection tracking records a
#: connection this machine opened to the peer; the peer's own packets to this machine are
#: then that connection's replies, which the border lets through (`ct state established`).
SPOOF = r"""
import socket, struct, sys, time
host, port = sys.argv[1], int(sys.argv[2])
peer = socket.gethostbyname("peer")
def checksum(data):
    data += b"\0" * (len(data) % 2)
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    return ~(total + (total >> 16)) & 0xFFFF
def frame(protocol, segment):
    source, destination = socket.inet_aton(host), socket.inet_aton(peer)
    pseudo = source + destination + struct.pack("!BBH", 0, protocol, len(segment))
    at = 16 if protocol == 6 else 6
    segment = segment[:at] + struct.pack("!H", checksum(pseudo + segment)) + segment[at + 2:]
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(segment), 1, 0, 64, protocol, 0,
                     source, destination)
    ip = ip[:10] + struct.pack("!H", checksum(ip)) + ip[12:]
    mine = open("/sys/class/net/eth0/address").read().strip().replace(":", "")
    return bytes.fromhex("02deadbeef01" + mine) + b"\x08\x00" + ip + segment
syn = struct.pack("!HHIIBBHHH", port, 5556, 1000, 0, 5 << 4, 0x02, 64240, 0, 0)
datagram = struct.pack("!HHHH", port, 5557, 12, 0) + b"spof"
raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
raw.bind(("eth0", 0))
answer = "unreachable|unreachable"
for _ in range(20):
    raw.send(frame(6, syn))
    raw.send(frame(17, datagram))
    time.sleep(1)
    try:
        with socket.create_connection((peer, 9000), timeout=2) as report:
            answer = report.makefile().readline().strip()
    except OSError:
        continue
    if "unreachable" not in answer:
        break
tcp, udp = answer.split("|")
print(f"this machine tcp: {tcp}")
print(f"this machine udp: {udp}")
"""

HOLDS = "this machine tcp: unreachable\nthis machine udp: unreachable"


def test_compose_services_cannot_reach_this_machine_by_forging_its_connections(
    pytester: pytest.Pytester, harbor_dataset: Dataset, host_target: HostTarget
) -> None:
    # Two services of one project share a bridge on which they reach each other; the
    # border judges what comes in on it, and a packet that belongs to a connection the
    # host's connection tracking knows is let through first.
    helper = prepare_helper_image()
    compose = {
        "services": {
            "main": {},
            "peer": {
                "image": helper,
                "entrypoint": ["python3", "-c", PEER, host_target.address, str(host_target.port)],
            },
        }
    }
    harbor_dataset.task(
        "forged",
        toml="[agent]\ntimeout_sec = 120\n"
        f"[verifier]\ntimeout_sec = 60\nenv = {{ EXPECTED = {json.dumps(HOLDS)} }}\n"
        f'[environment]\ndocker_image = "{helper}"\nworkdir = "/app"\n'
        f'[solution]\nenv = {{ HOST = "{host_target.address}", PORT = "{host_target.port}" }}\n',
        solve_sh=f'python3 - "$HOST" "$PORT" > /tmp/probes.txt <<\'EOF\'\n{SPOOF}\nEOF\n',
        test_sh=CHECK,
        extra_files={"environment/docker-compose.yaml": json.dumps(compose)},
    )
    result = run_harbor(pytester, harbor_dataset)
    assert result.ret == 0, result.stdout.str()[-4000:]
    result.assert_outcomes(passed=1)
