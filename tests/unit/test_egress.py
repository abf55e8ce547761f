"""The egress program's parts without a container: what an allow-list admits, where the
relay's name leads, and parsers of what a sandbox sends (DNS queries, TLS ClientHellos,
HTTP heads) that never raise; and the policy the engine writes for it."""

from __future__ import annotations

import importlib.util
import io
import json
import socket
import struct
import tarfile
import threading
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_harbor.sandboxes.base import RELAY_NAME, SandboxError
from pytest_harbor.sandboxes.docker import filtering
from pytest_harbor.sandboxes.docker.filtering import Egress
from tests.fixtures import REPO_ROOT

PROGRAM = REPO_ROOT / "pytest_harbor" / "sandboxes" / "docker" / "egress" / "egress.py"


@pytest.fixture(scope="module")
def egress() -> ModuleType:
    spec = importlib.util.spec_from_file_location("egress_under_test", PROGRAM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_list_admits_names_suffixes_and_networks_only(egress: ModuleType) -> None:
    entries = ["pypi.org", "*.example.com", "10.0.0.0/8"]
    assert egress.allowed("pypi.org", entries)
    assert egress.allowed("files.example.com", entries)
    assert egress.allowed("a.b.example.com", entries)
    assert egress.allowed("10.2.3.4", entries)
    for refused in ("example.com", "evil-example.com", "pypi.org.evil", "11.0.0.1", "", "x"):
        assert not egress.allowed(refused, entries), refused


def query(name: str, qtype: int = 1) -> bytes:
    labels = b"".join(bytes([len(part)]) + part.encode() for part in name.split("."))
    return (
        struct.pack("!HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
        + labels
        + b"\0"
        + struct.pack("!HH", qtype, 1)
    )


def test_a_listed_name_resolves_to_the_egress_and_another_does_not(egress: ModuleType) -> None:
    policy = egress.Policy("/nonexistent")
    policy.mode, policy.hosts, policy.address = "allowlist", ["listed.test"], "10.9.8.7"
    listed = egress.dns_reply(
        query("Listed.Test"), egress.dns_question(query("Listed.Test")), policy
    )
    ident, flags, _, answers = struct.unpack("!HHHH", listed[:8])
    assert (ident, flags & 0xF, answers) == (0x1234, 0, 1)
    assert listed.endswith(bytes([10, 9, 8, 7]))
    other = egress.dns_reply(query("other.test"), egress.dns_question(query("other.test")), policy)
    assert struct.unpack("!H", other[2:4])[0] & 0xF == 3  # NXDOMAIN
    assert struct.unpack("!H", other[6:8])[0] == 0


def client_hello(name: str) -> bytes:
    server_name = b"\0" + struct.pack("!H", len(name)) + name.encode()
    extension = (
        struct.pack("!HH", 0, len(server_name) + 2)
        + struct.pack("!H", len(server_name))
        + server_name
    )
    body = (
        b"\x03\x03"
        + b"\0" * 32
        + b"\0"
        + struct.pack("!H", 2)
        + b"\x13\x01"
        + b"\x01\x00"
        + struct.pack("!H", len(extension))
        + extension
    )
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + struct.pack("!H", len(handshake)) + handshake


def test_the_tls_server_name_and_the_http_host_are_read(egress: ModuleType) -> None:
    assert egress.tls_server_name(client_hello("api.example.com")) == "api.example.com"
    head = b"GET / HTTP/1.1\r\nUser-Agent: x\r\nhOsT: listed.test:8080\r\n\r\n"
    assert egress.http_target(head) == ("listed.test", 80)
    assert egress.proxy_request(b"CONNECT a.test:22 HTTP/1.1\r\n\r\n")[:2] == ("a.test", 22)
    assert egress.proxy_request(b"GET http://b.test/x HTTP/1.1\r\n\r\n")[:2] == ("b.test", 80)
    assert egress.split_port("[::1]:443", 80) == ("::1", 443)
    assert egress.split_port("a.test:99999", 80) == ("a.test", -1)


@given(st.binary(max_size=600))
def test_no_bytes_a_sandbox_sends_make_a_parser_raise(egress: ModuleType, data: bytes) -> None:
    egress.dns_question(data)
    egress.tls_server_name(data)
    egress.http_target(data)
    egress.proxy_request(data)
    question = egress.dns_question(data)
    if question is not None:
        policy = egress.Policy("/nonexistent")
        policy.mode, policy.hosts, policy.address = "allowlist", ["*"], "10.0.0.1"
        egress.dns_reply(data, question, policy)


@given(st.binary(min_size=5, max_size=400))
def test_a_truncated_or_mangled_hello_gives_no_name_or_a_name(
    egress: ModuleType, tail: bytes
) -> None:
    hello = client_hello("listed.test")
    name = egress.tls_server_name(hello[: len(tail)] + tail)
    assert name is None or isinstance(name, str)


# ---------------------------------------------------------------------- the relay route

RELAY = "172.17.0.1:8123"
MODES = ("none", "allowlist", "public")


class Archives:
    """An engine API that keeps what put_archive is given."""

    def __init__(self) -> None:
        self.written: list[tuple[str, str, bytes]] = []

    def put_archive(self, container: str, path: str, data: bytes) -> bool:
        self.written.append((container, path, data))
        return True


@pytest.fixture
def archives(monkeypatch: pytest.MonkeyPatch) -> Archives:
    api = Archives()

    class Engine:
        pass

    engine = Engine()
    engine.api = api  # type: ignore[attr-defined]
    monkeypatch.setattr(filtering, "engine_for", lambda endpoint: engine)
    return api


def written_policy(archives: Archives) -> dict[str, Any]:
    _, path, data = archives.written[-1]
    assert path == "/run/egress"
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        member = archive.extractfile("policy.json")
        assert member is not None
        return dict(json.loads(member.read()))


def policy_file(egress: ModuleType, folder: Path, archives: Archives) -> Any:
    """The egress's Policy, reading what the engine wrote last."""
    path = folder / "policy.json"
    path.write_text(json.dumps(written_policy(archives)))
    return egress.Policy(str(path)).current()


def test_the_relay_name_is_the_same_on_both_sides(egress: ModuleType) -> None:
    assert egress.RELAY_NAME == RELAY_NAME


def test_the_policy_carries_the_relay_or_null_and_the_egress_reads_it(
    egress: ModuleType, archives: Archives, tmp_path: Path
) -> None:
    gate = Egress("egress-id", "egress-net", "10.9.8.7", "outside", None)
    gate.set_policy("allowlist", ("listed.test",), RELAY)
    assert written_policy(archives) == {
        "mode": "allowlist",
        "hosts": ["listed.test"],
        "address": "10.9.8.7",
        "relay": RELAY,
    }
    assert policy_file(egress, tmp_path, archives).relay == ("172.17.0.1", 8123)
    gate.set_policy("public")
    assert written_policy(archives)["relay"] is None
    assert policy_file(egress, tmp_path, archives).relay is None
    gate.set_policy("none", relay="[fd00::1]:80")
    assert policy_file(egress, tmp_path, archives).relay == ("fd00::1", 80)


def extracted(folder: Path, archives: Archives) -> Path:
    """What the engine wrote last, extracted from its archive as the engine's archive API
    does: the file's time is the archive's (whole seconds)."""
    _, _, data = archives.written[-1]
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        archive.extractall(folder, filter="tar")
    return folder / "policy.json"


def test_two_policies_of_one_size_written_within_a_second_are_told_apart(
    egress: ModuleType, archives: Archives, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One turn's phase lists a.test with one relay, the next turn's lists b.test with
    # another, within the second: the file's time and size are the same both times.
    monkeypatch.setattr(filtering, "time", SimpleNamespace(time=lambda: 1_796_639_201.4))
    gate = Egress("egress-id", "egress-net", "10.9.8.7", "outside", None)
    gate.set_policy("allowlist", ("a.test",), "172.17.0.1:8123")
    path = extracted(tmp_path, archives)
    first = path.stat()
    policy = egress.Policy(str(path))
    assert policy.current().allows("a.test")
    gate.set_policy("allowlist", ("b.test",), "172.17.0.2:8123")
    extracted(tmp_path, archives)
    assert (path.stat().st_mtime, path.stat().st_size) == (first.st_mtime, first.st_size)
    now = policy.current()
    assert (now.allows("a.test"), now.allows("b.test")) == (False, True)
    assert now.relay == ("172.17.0.2", 8123)
    assert egress.destination(now, RELAY_NAME, 80) == ("172.17.0.2", 8123)


def policy_text(relay: str | None) -> str:
    return json.dumps({"mode": "none", "hosts": [], "address": "10.9.8.7", "relay": relay})


@pytest.mark.parametrize("caught", ["missing", "empty", "half written"])
def test_a_policy_file_caught_while_it_is_replaced_is_read_again(
    egress: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caught: str
) -> None:
    # The engine's archive API removes the file, then writes it anew: a query in between
    # waits for the new file rather than find the relay's name unknown.
    path = tmp_path / "policy.json"
    written = policy_text("172.17.0.1:8123")
    if caught != "missing":
        path.write_text("" if caught == "empty" else written[:20])
    pauses: list[float] = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        path.write_text(written)

    monkeypatch.setattr(egress, "time", SimpleNamespace(sleep=pause))
    policy = egress.Policy(str(path)).current()
    assert (policy.mode, policy.relay, len(pauses)) == ("none", ("172.17.0.1", 8123), 1)
    assert answer(egress, RELAY_NAME, 1, policy)[:2] == (0, 1)


def test_a_policy_file_that_stays_broken_holds_the_egress_closed(
    egress: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"mode": "allowlist", "hosts": ["a.test"], "relay": RELAY}))
    policy = egress.Policy(str(path))
    assert policy.current().allows("a.test")
    pauses: list[float] = []
    monkeypatch.setattr(egress, "time", SimpleNamespace(sleep=pauses.append))
    path.write_text('{"mode": "public", "hosts": [')
    closed = policy.current()
    assert (closed.mode, closed.hosts, closed.relay) == ("none", [], None)
    assert not closed.allows("a.test")
    assert len(pauses) == egress.POLICY_READS - 1
    assert sum(pauses) < 0.1  # a query waits for a write, not for long
    path.write_text(policy_text(RELAY))
    assert policy.current().relay == ("172.17.0.1", 8123)


@pytest.mark.parametrize(
    "relay", ["model.example:80", "172.17.0.1", "172.17.0.1:0", "172.17.0.1:70000", "fd00::1:80"]
)
def test_a_relay_that_is_not_an_address_and_port_is_refused_before_it_is_written(
    archives: Archives, relay: str
) -> None:
    with pytest.raises(SandboxError, match="is not IP:PORT"):
        Egress("egress-id", "egress-net", "10.9.8.7", "outside", None).set_policy(
            "none", relay=relay
        )
    assert archives.written == []


@pytest.mark.parametrize(
    "value", [None, 8123, "", "172.17.0.1", "relay.test:80", "172.17.0.1:x", "fd00::1:80"]
)
def test_the_egress_reads_anything_but_an_address_and_port_as_no_relay(
    egress: ModuleType, value: object
) -> None:
    assert egress.relay_address(value) is None


def policy(egress: ModuleType, mode: str, relay: tuple[str, int] | None) -> Any:
    made = egress.Policy("/nonexistent")
    made.mode, made.hosts, made.address, made.relay = mode, ["listed.test"], "10.9.8.7", relay
    return made


def answer(egress: ModuleType, name: str, qtype: int, made: Any) -> tuple[int, int, bytes]:
    """(rcode, answer count, the reply) the egress gives a question."""
    reply = egress.answer_dns(query(name, qtype), made)
    assert reply is not None
    _, flags, _, count = struct.unpack("!HHHH", reply[:8])
    return flags & 0xF, count, reply


@pytest.mark.parametrize("mode", MODES)
def test_the_relay_name_resolves_to_the_egress_in_every_mode_while_a_relay_is_given(
    egress: ModuleType, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    # No resolver beyond the egress is asked for it, in the public mode either.
    monkeypatch.setattr(egress, "forward_dns", lambda packet: pytest.fail("forwarded"))
    given_relay = policy(egress, mode, ("172.17.0.1", 8123))
    rcode, count, reply = answer(egress, "Model.Pytest-Harbor.Internal", 1, given_relay)
    assert (rcode, count) == (0, 1)
    assert reply.endswith(bytes([10, 9, 8, 7]))
    assert answer(egress, RELAY_NAME, 28, given_relay)[:2] == (0, 0)  # AAAA: none
    without = policy(egress, mode, None)
    assert answer(egress, RELAY_NAME, 1, without)[:2] == (3, 0)  # NXDOMAIN
    assert answer(egress, RELAY_NAME, 28, without)[:2] == (3, 0)


def test_listing_the_relays_suffix_does_not_make_its_name_resolve(egress: ModuleType) -> None:
    made = policy(egress, "allowlist", None)
    made.hosts = ["*.pytest-harbor.internal", RELAY_NAME]
    assert answer(egress, RELAY_NAME, 1, made)[:2] == (3, 0)
    assert egress.destination(made, RELAY_NAME, 80) is None


@pytest.mark.parametrize("mode", MODES)
def test_the_relay_name_leads_to_the_relay_on_port_80_and_nowhere_else(
    egress: ModuleType, mode: str
) -> None:
    relay = ("172.17.0.1", 8123)
    made = policy(egress, mode, relay)
    assert egress.destination(made, RELAY_NAME, 80) == relay
    assert egress.destination(made, "MODEL.pytest-harbor.internal.", 80) == relay
    for port in (443, 8123, 22, -1):
        assert egress.destination(made, RELAY_NAME, port) is None, port
    assert egress.destination(policy(egress, mode, None), RELAY_NAME, 80) is None
    # The relay's own address is a host like any other.
    raw = egress.destination(made, "172.17.0.1", 8123)
    assert raw == (None if mode != "public" else ("172.17.0.1", 8123))
    # Everything else as before.
    listed = egress.destination(made, "listed.test", 443)
    assert listed == (None if mode == "none" else ("listed.test", 443))
    other = egress.destination(made, "other.test", 80)
    assert other == (("other.test", 80) if mode == "public" else None)


@pytest.mark.parametrize(
    ("head", "target"),
    [
        (f"GET / HTTP/1.1\r\nHost: {RELAY_NAME}\r\n\r\n", (RELAY_NAME, 80)),
        (f"GET / HTTP/1.1\r\nHost: {RELAY_NAME}:80\r\n\r\n", (RELAY_NAME, 80)),
        (f"GET / HTTP/1.1\r\nhost:  {RELAY_NAME.upper()}.\r\n\r\n", (RELAY_NAME.upper() + ".", 80)),
        (f"GET / HTTP/1.1\r\nHost: {RELAY_NAME}:8123\r\n\r\n", (RELAY_NAME, 8123)),
        (f"GET / HTTP/1.1\r\nHost: {RELAY_NAME}:x\r\n\r\n", (RELAY_NAME, -1)),
        # Another host goes to port 80 whatever port its Host names, as it always did.
        ("GET / HTTP/1.1\r\nHost: listed.test:8080\r\n\r\n", ("listed.test", 80)),
        ("GET / HTTP/1.1\r\n\r\n", (None, 80)),
    ],
)
def test_a_request_on_port_80_names_where_it_goes_by_its_host(
    egress: ModuleType, head: str, target: tuple[str | None, int]
) -> None:
    assert egress.http_target(head.encode()) == target


@pytest.mark.parametrize(
    ("head", "target"),
    [
        (f"GET http://{RELAY_NAME}/v1/chat HTTP/1.1\r\n\r\n", (RELAY_NAME, 80)),
        (f"GET http://{RELAY_NAME}:80/ HTTP/1.1\r\n\r\n", (RELAY_NAME, 80)),
        (f"CONNECT {RELAY_NAME}:80 HTTP/1.1\r\n\r\n", (RELAY_NAME, 80)),
        (f"CONNECT {RELAY_NAME} HTTP/1.1\r\n\r\n", (RELAY_NAME, 443)),
        (f"GET http://{RELAY_NAME}:8123/ HTTP/1.1\r\n\r\n", (RELAY_NAME, 8123)),
    ],
)
def test_a_proxy_request_names_the_relay_and_its_port(
    egress: ModuleType, head: str, target: tuple[str, int]
) -> None:
    assert egress.proxy_request(head.encode())[:2] == target


class Relay:
    """A server on 127.0.0.1 that keeps the first bytes of a connection and answers."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.received = b""
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        connection, _ = self.server.accept()
        with connection:
            connection.settimeout(5.0)
            while b"\r\n\r\n" not in self.received:
                chunk = connection.recv(4096)
                if not chunk:
                    break
                self.received += chunk
            connection.sendall(b"HTTP/1.0 200 OK\r\n\r\nfrom the relay")


def through_the_egress(
    egress: ModuleType, tmp_path: Path, port: int, request: bytes, relay: str | None
) -> bytes:
    """What a client gets for `request` sent to the egress's `port` under a policy in
    which no host is listed, but the relay may be given."""
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"mode": "none", "hosts": [], "address": "", "relay": relay}))
    client, served = socket.socketpair()
    with client:
        worker = threading.Thread(
            target=egress.handle, args=(served, port, egress.Policy(str(path))), daemon=True
        )
        worker.start()
        client.sendall(request)
        worker.join(10.0)
        served.close()
        client.settimeout(5.0)
        return b"".join(iter(lambda: client.recv(4096), b""))


@pytest.mark.parametrize("port", [80, 3128])
def test_a_request_for_the_relay_name_is_sent_to_the_relay_head_first(
    egress: ModuleType, tmp_path: Path, port: int
) -> None:
    relay = Relay()
    target = "/v1/models" if port == 80 else f"http://{RELAY_NAME}/v1/models"
    request = f"GET {target} HTTP/1.0\r\nHost: {RELAY_NAME}\r\n\r\n".encode()
    answer = through_the_egress(egress, tmp_path, port, request, f"127.0.0.1:{relay.port}")
    assert answer.endswith(b"from the relay")
    assert relay.received == request
    relay.server.close()


def test_without_a_relay_the_proxy_refuses_its_name(egress: ModuleType, tmp_path: Path) -> None:
    request = f"GET http://{RELAY_NAME}/ HTTP/1.0\r\n\r\n".encode()
    answer = through_the_egress(egress, tmp_path, 3128, request, None)
    assert answer.startswith(b"HTTP/1.1 403 Forbidden")
