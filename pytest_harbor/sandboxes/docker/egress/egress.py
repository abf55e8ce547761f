"""The egress of a sandbox whose network is an allow-list (pytest-harbor).

It runs in a container of its own, the sandbox's only neighbour on a network with no
route out; the sandbox's names are resolved by it (the engine points the sandbox's DNS
here). Under an allow-list it answers a listed name with its own address and forwards
what then comes: HTTP on port 80 by its Host header, TLS on port 443 by the name the
client sends (SNI), and, on port 3128, proxy requests (CONNECT, or an absolute URL) for
any port. Anything else, an unlisted name, a raw address that is not listed, goes
nowhere. In every mode, while the policy names a relay (the model relay on the engine's
machine), RELAY_NAME resolves to the egress and a request for it on port 80 (by Host, or
through the proxy) goes to the relay and nowhere else; without one the name leads
nowhere. The policy is a file only the engine writes (`/run/egress/policy.json`):
`{"mode": "allowlist" | "public" | "none", "hosts": [...], "address": "...",
"relay": "IP:PORT" | null}`, read again for every query and connection. Standard
library only; every parser here is total: what a sandbox sends can end its own
connection, never the egress.
"""

from __future__ import annotations

import ipaddress
import json
import os
import select
import socket
import struct
import sys
import threading
import time

POLICY = os.environ.get("EGRESS_POLICY", "/run/egress/policy.json")
HEAD_CAP = 16 * 1024
READ_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 600.0
MAX_CONNECTIONS = 256
TTL_S = 5
#: A policy file that does not read is read again this many times, this long apart, before
#: the egress holds it to mode none: the engine's archive API replaces the file by removing
#: it and writing it anew, and a read between the two finds it missing or short.
POLICY_READS = 10
POLICY_RETRY_S = 0.005
#: The name a sandbox reaches the model relay by, on port 80 (sandboxes/base.py's
#: RELAY_NAME; this program imports nothing of the package's, a unit test holds the two
#: equal).
RELAY_NAME = "model.pytest-harbor.internal"
RELAY_PORT = 80

_slots = threading.BoundedSemaphore(MAX_CONNECTIONS)


def say(message: str) -> None:
    print(f"egress: {message}", flush=True)


class Policy:
    """The engine's policy file, read again for every query and connection (it holds a
    few hundred bytes). No stamp of the file would do: the engine's archive API gives it
    the whole second the archive names as its time, so two policies of one size written
    within a second look the same to stat."""

    def __init__(self, path: str) -> None:
        self._path = path
        #: The file's bytes as last read (None: it did not read, the policy is none).
        self._read: bytes | None = None
        self.mode = "none"
        self.hosts: list[str] = []
        self.address = ""
        #: Where a request for RELAY_NAME goes (None: nowhere).
        self.relay: tuple[str, int] | None = None
        self._lock = threading.Lock()

    def current(self) -> Policy:
        with self._lock:
            for attempt in range(POLICY_READS):
                if attempt:
                    time.sleep(POLICY_RETRY_S)
                try:
                    with open(self._path, "rb") as handle:
                        content = handle.read()
                    if content != self._read:
                        self._apply(json.loads(content))
                        self._read = content
                    return self
                except (OSError, ValueError, TypeError, AttributeError):
                    continue
            # Fail closed on a file that stays broken; read again at the next call.
            self.mode, self.hosts, self.relay, self._read = "none", [], None, None
            return self

    def _apply(self, data: dict[str, object]) -> None:
        """The fields of a policy as read (raises on one that is not a policy)."""
        listed = data.get("hosts") or []
        if not isinstance(listed, list):
            raise TypeError("hosts is not a list")
        hosts = [normal(str(host)) for host in listed]
        mode, address = str(data.get("mode", "none")), str(data.get("address", ""))
        relay = relay_address(data.get("relay"))
        self.mode, self.hosts, self.address, self.relay = mode, hosts, address, relay

    def allows(self, host: str) -> bool:
        if self.mode == "public":
            return True
        if self.mode != "allowlist":
            return False
        return allowed(normal(host), self.hosts)


def normal(host: str) -> str:
    return host.strip().lower().rstrip(".")


def is_relay_name(host: str | None) -> bool:
    return host is not None and normal(host) == RELAY_NAME


def relay_address(value: object) -> tuple[str, int] | None:
    """The relay's `IP:PORT` (an IPv6 address in brackets) as (address, port); None for
    anything else, a name included: the egress resolves nothing on the relay's way."""
    if not isinstance(value, str):
        return None
    host, port = split_port(value, -1)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    return (str(address), port) if port > 0 else None


def destination(policy: Policy, host: str | None, port: int) -> tuple[str, int] | None:
    """Where a request for `host`:`port` goes (None: refused). RELAY_NAME on port 80 goes
    to the policy's relay whatever the mode, and nowhere else ever, listed or not."""
    if not host or port < 0:
        return None
    if is_relay_name(host):
        return policy.relay if port == RELAY_PORT else None
    return (host, port) if policy.allows(host) else None


def allowed(host: str, entries: list[str]) -> bool:
    """Whether `host` (a name or an address) is listed: by name, by `*.suffix` (any name
    below the suffix), or, for an address, by address or network."""
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        address = None
    for entry in entries:
        if address is not None:
            try:
                if address in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                continue
        elif entry.startswith("*."):
            if host.endswith(entry[1:]) and len(host) > len(entry) - 1:
                return True
        elif host == entry:
            return True
    return False


# ---------------------------------------------------------------------------- DNS


def dns_question(packet: bytes) -> tuple[int, str, int, int] | None:
    """(id, name, type, end of the question) of a query with one question, or None."""
    if len(packet) < 12:
        return None
    ident, flags, questions = struct.unpack("!HHH", packet[:6])
    if flags & 0x8000 or questions != 1:
        return None
    labels: list[str] = []
    at = 12
    while True:
        if at >= len(packet):
            return None
        length = packet[at]
        at += 1
        if length == 0:
            break
        if length & 0xC0 or at + length > len(packet) or len(labels) > 127:
            return None
        labels.append(packet[at : at + length].decode("ascii", "replace"))
        at += length
    if at + 4 > len(packet):
        return None
    qtype = struct.unpack("!H", packet[at : at + 2])[0]
    return ident, ".".join(labels), qtype, at + 4


def dns_reply(packet: bytes, question: tuple[int, str, int, int], policy: Policy) -> bytes:
    ident, name, qtype, end = question
    header = packet[:12]
    flags = 0x8180 | (struct.unpack("!H", header[2:4])[0] & 0x0100)  # RD copied, RA set
    body = packet[12:end]
    answers = b""
    count = 0
    if is_relay_name(name):
        known = policy.relay is not None
    else:
        known = policy.mode == "allowlist" and allowed(normal(name), policy.hosts)
    if known:
        if qtype in (1, 255) and policy.address:
            try:
                address = socket.inet_aton(policy.address)
            except OSError:
                address = b""
            if address:
                answers = struct.pack("!HHHIH", 0xC00C, 1, 1, TTL_S, 4) + address
                count = 1
    else:
        flags |= 3  # NXDOMAIN
    return struct.pack("!HHHHHH", ident, flags, 1, count, 0, 0) + body + answers


def upstream_dns() -> str:
    try:
        with open("/etc/resolv.conf", encoding="utf-8") as handle:
            for line in handle:
                parts = line.split()
                if len(parts) >= 2 and parts[0] == "nameserver":
                    return parts[1]
    except OSError:
        pass
    return "127.0.0.11"


def forward_dns(packet: bytes) -> bytes | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as upstream:
        upstream.settimeout(5.0)
        try:
            upstream.sendto(packet, (upstream_dns(), 53))
            return upstream.recv(4096)
        except OSError:
            return None


def answer_dns(packet: bytes, policy: Policy) -> bytes | None:
    question = dns_question(packet)
    if question is None:
        return None
    # The relay's name is answered here in every mode: no resolver beyond the egress
    # (the outside network's, where another container may carry that name) is asked.
    if policy.mode == "public" and not is_relay_name(question[1]):
        return forward_dns(packet)
    return dns_reply(packet, question, policy)


def serve_dns_udp(server: socket.socket, policy: Policy) -> None:
    while True:
        try:
            packet, client = server.recvfrom(4096)
            reply = answer_dns(packet, policy.current())
            if reply is not None:
                server.sendto(reply, client)
        except Exception as error:  # one bad query never stops the server
            say(f"dns: {type(error).__name__}")


def serve_dns_tcp(connection: socket.socket, policy: Policy) -> None:
    size = read_exact(connection, 2)
    if size is None:
        return
    packet = read_exact(connection, struct.unpack("!H", size)[0])
    if packet is None:
        return
    reply = answer_dns(packet, policy.current())
    if reply is not None:
        connection.sendall(struct.pack("!H", len(reply)) + reply)


# ---------------------------------------------------------------------------- TCP


def read_exact(connection: socket.socket, count: int) -> bytes | None:
    data = b""
    while len(data) < count:
        chunk = connection.recv(count - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def read_head(connection: socket.socket) -> bytes:
    """An HTTP request's head (up to its blank line), at most HEAD_CAP bytes."""
    data = b""
    while b"\r\n\r\n" not in data and len(data) < HEAD_CAP:
        chunk = connection.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def http_authority(head: bytes) -> tuple[str, int] | None:
    """The host and port (80 unless named; -1 for a bad one) of a request's Host header."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"host":
            return split_port(value.strip().decode("ascii", "replace"), 80)
    return None


def http_target(head: bytes) -> tuple[str | None, int]:
    """Where a request on port 80 asks to go: its Host's name, on port 80 whatever port
    the Host names, but for RELAY_NAME, which names its port (only 80 reaches the relay)."""
    authority = http_authority(head)
    if authority is None:
        return None, 80
    host, port = authority
    return host, port if is_relay_name(host) else 80


def split_port(authority: str, default: int) -> tuple[str, int]:
    """`host[:port]` (an IPv6 address in brackets) as (host, port)."""
    if authority.startswith("["):
        host, _, rest = authority[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif authority.count(":") == 1:
        host, _, port = authority.partition(":")
    else:
        host, port = authority, ""
    try:
        number = int(port) if port else default
    except ValueError:
        number = -1
    return host, number if 0 < number < 65536 else -1


def read_client_hello(connection: socket.socket) -> bytes:
    data = b""
    while len(data) < 5:
        chunk = connection.recv(5 - len(data))
        if not chunk:
            return data
        data += chunk
    length = struct.unpack("!H", data[3:5])[0]
    while len(data) < 5 + min(length, HEAD_CAP):
        chunk = connection.recv(5 + length - len(data))
        if not chunk:
            break
        data += chunk
    return data


def tls_server_name(hello: bytes) -> str | None:
    """The server name a TLS ClientHello asks for, or None."""
    try:
        if len(hello) < 9 or hello[0] != 0x16 or hello[5] != 0x01:
            return None
        at = 9 + 2 + 32  # record header, handshake header, version, random
        at += 1 + hello[at]  # session id
        at += 2 + struct.unpack("!H", hello[at : at + 2])[0]  # cipher suites
        at += 1 + hello[at]  # compression methods
        end = at + 2 + struct.unpack("!H", hello[at : at + 2])[0]
        at += 2
        while at + 4 <= min(end, len(hello)):
            kind, size = struct.unpack("!HH", hello[at : at + 4])
            at += 4
            if kind == 0:  # server_name
                names = hello[at : at + size]
                cursor = 2
                while cursor + 3 <= len(names):
                    name_type, name_size = (
                        names[cursor],
                        struct.unpack("!H", names[cursor + 1 : cursor + 3])[0],
                    )
                    cursor += 3
                    if name_type == 0:
                        return names[cursor : cursor + name_size].decode("ascii", "replace")
                    cursor += name_size
                return None
            at += size
    except (IndexError, struct.error):
        return None
    return None


def splice(one: socket.socket, other: socket.socket) -> None:
    sockets = [one, other]
    last = time.monotonic()
    while time.monotonic() - last < IDLE_TIMEOUT_S:
        ready, _, broken = select.select(sockets, [], sockets, 30.0)
        if broken:
            return
        for source in ready:
            data = source.recv(65536)
            if not data:
                return
            (other if source is one else one).sendall(data)
            last = time.monotonic()


def onward(host: str, port: int) -> socket.socket:
    return socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)


def handle(connection: socket.socket, port: int, policy: Policy) -> None:
    connection.settimeout(READ_TIMEOUT_S)
    if port == 53:
        serve_dns_tcp(connection, policy)
        return
    current = policy.current()
    if port == 80:
        head = read_head(connection)
        (host, target_port), reply = http_target(head), b""
    elif port == 443:
        head = read_client_hello(connection)
        host, target_port, reply = tls_server_name(head), 443, b""
    else:  # the proxy port
        head = read_head(connection)
        host, target_port, head, reply = proxy_request(head)
    target = destination(current, host, target_port)
    if target is None:
        say(f"refused {host or '(no name)'}:{target_port}")
        if port == 3128:
            connection.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
        return
    try:
        upstream = onward(*target)
    except OSError as error:
        say(f"cannot reach {host}:{target_port}: {error}")
        if port == 3128:
            connection.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
        return
    with upstream:
        connection.settimeout(None)
        upstream.settimeout(None)
        if reply:
            connection.sendall(reply)
        if head:
            upstream.sendall(head)
        splice(connection, upstream)


def proxy_request(head: bytes) -> tuple[str | None, int, bytes, bytes]:
    """(host, port, what to send on, what to answer first) of a proxy request."""
    line = head.split(b"\r\n", 1)[0].decode("ascii", "replace")
    parts = line.split()
    if len(parts) != 3:
        return None, -1, b"", b""
    method, target, _ = parts
    if method.upper() == "CONNECT":
        host, port = split_port(target, 443)
        return (
            host,
            port,
            head[head.find(b"\r\n\r\n") + 4 :],
            (b"HTTP/1.1 200 Connection established\r\n\r\n"),
        )
    if target.lower().startswith("http://"):
        authority = target[7:].split("/", 1)[0]
        host, port = split_port(authority, 80)
        return host, port, head, b""
    return None, -1, b"", b""


def serve_tcp(server: socket.socket, port: int, policy: Policy) -> None:
    while True:
        try:
            connection, _ = server.accept()
        except OSError:
            continue
        if not _slots.acquire(blocking=False):
            connection.close()
            continue
        threading.Thread(target=_serve, args=(connection, port, policy), daemon=True).start()


def _serve(connection: socket.socket, port: int, policy: Policy) -> None:
    try:
        with connection:
            handle(connection, port, policy)
    except Exception as error:  # one connection's trouble ends that connection only
        say(f"port {port}: {type(error).__name__}")
    finally:
        _slots.release()


def listening(port: int) -> socket.socket:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port))
    server.listen(128)
    return server


def main() -> None:
    policy = Policy(POLICY)
    # Every socket is bound before `ready` is said: the engine waits for that word only.
    dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dns.bind(("0.0.0.0", 53))
    servers = {port: listening(port) for port in (53, 80, 443, 3128)}
    threading.Thread(target=serve_dns_udp, args=(dns, policy), daemon=True).start()
    for port, server in servers.items():
        threading.Thread(target=serve_tcp, args=(server, port, policy), daemon=True).start()
    say("ready")
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(0)
