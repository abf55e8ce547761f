"""The egress program's parts without a container: what an allow-list admits, and parsers
of what a sandbox sends (DNS queries, TLS ClientHellos, HTTP heads) that never raise."""

from __future__ import annotations

import importlib.util
import struct
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

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
    assert egress.http_host(head) == "listed.test"
    assert egress.proxy_request(b"CONNECT a.test:22 HTTP/1.1\r\n\r\n")[:2] == ("a.test", 22)
    assert egress.proxy_request(b"GET http://b.test/x HTTP/1.1\r\n\r\n")[:2] == ("b.test", 80)
    assert egress.split_port("[::1]:443", 80) == ("::1", 443)
    assert egress.split_port("a.test:99999", 80) == ("a.test", -1)


@given(st.binary(max_size=600))
def test_no_bytes_a_sandbox_sends_make_a_parser_raise(egress: ModuleType, data: bytes) -> None:
    egress.dns_question(data)
    egress.tls_server_name(data)
    egress.http_host(data)
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
