"""The egress sidecar of a sandbox created with a `networkPolicy`, as OpenSandbox's
components/egress serves it: its policy API on port 18080 behind the server's proxy
(`GET`/`POST /policy`, a token of its own in `OPENSANDBOX-EGRESS-AUTH`, which the
endpoint route hands out), enforced on addresses as its `dns+nft` mode does: loopback,
the nameservers and answers to connections out are let through, then each rule's
addresses (an IP, a network, or the addresses a name has now), then the default. The
fake enforces with iptables in the sandbox's own network namespace (through nsenter),
which the sandbox cannot change (its container lacks CAP_NET_ADMIN). In `dns` mode the
real sidecar filters names alone; the fake then enforces nothing, and says so in
`enforcementMode` as the real one does."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import subprocess
import uuid
from typing import Any

from tests.opensandbox_fake.records import _Sandbox, _State
from tests.opensandbox_fake.wire import GO_JSON, _error, _go_json, _Handler, _HttpError

EGRESS_PORT = 18080
EGRESS_AUTH_HEADER = "OPENSANDBOX-EGRESS-AUTH"


def parse_policy(value: object) -> dict[str, Any]:
    """A policy as the sidecar reads it: actions lower-cased, deny by default; a
    ValueError for what it refuses."""
    if value is None:
        return {"defaultAction": "deny", "egress": []}
    if not isinstance(value, dict):
        raise ValueError("policy must be an object")
    default = str(value.get("defaultAction") or "deny").strip().lower()
    if default not in ("allow", "deny"):
        raise ValueError(f"unsupported defaultAction {default!r}")
    rules = []
    for rule in value.get("egress") or []:
        if not isinstance(rule, dict):
            raise ValueError("egress rules must be objects")
        action = str(rule.get("action") or "deny").strip().lower()
        target = str(rule.get("target") or "").strip()
        if action not in ("allow", "deny"):
            raise ValueError(f"unsupported action {action!r}")
        if not target:
            raise ValueError("egress target cannot be empty")
        rules.append({"action": action, "target": target})
    return {"defaultAction": default, "egress": rules}


def _mode(policy: dict[str, Any]) -> str:
    if not policy["egress"]:
        return "allow_all" if policy["defaultAction"] == "allow" else "deny_all"
    return "enforcing"


def _addresses(target: str) -> list[str]:
    """A rule's IPv4 addresses or networks (a name's, as the host resolves it now)."""
    with contextlib.suppress(ValueError):
        network = ipaddress.ip_network(target, strict=False)
        return [str(network)] if network.version == 4 else []
    name = target[2:] if target.startswith("*.") else target
    try:
        found = socket.getaddrinfo(name, None, socket.AF_INET)
    except OSError:
        return []
    return sorted({str(entry[4][0]) for entry in found})


class _Egress(_State):
    """The sidecars of the fake's sandboxes."""

    egress_mode: str | None

    def _egress_start(self, sandbox: _Sandbox, pid: int, nameservers: list[str]) -> None:
        sandbox.egress_token = uuid.uuid4().hex
        sandbox.egress_pid = pid
        sandbox.nameservers = nameservers
        self._enforce(sandbox)

    def _serve_egress(
        self, handler: _Handler, sandbox: _Sandbox, method: str, path: str, body: bytes
    ) -> None:
        if handler.headers.get(EGRESS_AUTH_HEADER) != sandbox.egress_token:
            handler.reply(401, b"unauthorized\n", "text/plain; charset=utf-8")
            return
        if path != "/policy":
            handler.reply(404, b"404 page not found\n", "text/plain; charset=utf-8")
            return
        if method == "GET":
            policy = sandbox.policy or parse_policy(None)
            answer = {
                "status": "ok",
                "mode": _mode(policy),
                "enforcementMode": self.egress_mode,
                "policy": policy,
            }
        elif method in ("POST", "PUT"):
            try:
                text = body.decode().strip()
                policy = parse_policy(json.loads(text) if text else None)
            except ValueError as error:
                message = f"invalid policy: {error}\n".encode()
                handler.reply(400, message, "text/plain; charset=utf-8")
                return
            sandbox.policy = policy
            self._enforce(sandbox)
            answer = {"status": "ok", "mode": _mode(policy), "enforcementMode": self.egress_mode}
        else:
            handler.reply(405, b"method not allowed\n", "text/plain; charset=utf-8")
            return
        handler.reply(200, _go_json(answer), GO_JSON)

    def _enforce(self, sandbox: _Sandbox) -> None:
        """The sandbox's policy as iptables rules in its network namespace (dns+nft)."""
        policy = sandbox.policy or parse_policy(None)
        if self.egress_mode != "dns+nft":
            return
        rules = [["-F", "OUTPUT"]]
        if _mode(policy) != "allow_all":
            rules += [
                ["-A", "OUTPUT", "-o", "lo", "-j", "ACCEPT"],
                [
                    "-A",
                    "OUTPUT",
                    "-m",
                    "conntrack",
                    "--ctstate",
                    "ESTABLISHED,RELATED",
                    "-j",
                    "ACCEPT",
                ],
            ]
            for server in sandbox.nameservers:
                for protocol in ("udp", "tcp"):
                    rules.append(
                        [
                            "-A",
                            "OUTPUT",
                            "-d",
                            server,
                            "-p",
                            protocol,
                            "--dport",
                            "53",
                            "-j",
                            "ACCEPT",
                        ]
                    )
            for rule in policy["egress"]:
                verdict = "ACCEPT" if rule["action"] == "allow" else "REJECT"
                for address in _addresses(rule["target"]):
                    rules.append(["-A", "OUTPUT", "-d", address, "-j", verdict])
            if policy["defaultAction"] == "deny":
                rules.append(["-A", "OUTPUT", "-j", "REJECT"])
        for rule in rules:
            self._iptables(sandbox, "iptables", rule)
        # No address of IPv6 is let through unless all is.
        closing = _mode(policy) != "allow_all"
        self._iptables(sandbox, "ip6tables", ["-F", "OUTPUT"])
        if closing:
            self._iptables(sandbox, "ip6tables", ["-A", "OUTPUT", "-o", "lo", "-j", "ACCEPT"])
            self._iptables(sandbox, "ip6tables", ["-A", "OUTPUT", "-j", "REJECT"])

    def _iptables(self, sandbox: _Sandbox, tool: str, rule: list[str]) -> None:
        done = subprocess.run(
            ["nsenter", "-t", str(sandbox.egress_pid), "-n", tool, "-w", *rule],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0 and tool == "iptables":
            raise _error(500, "EGRESS::POLICY_FAILED", f"{tool} {rule}: {done.stderr.strip()}")


def egress_refusal() -> _HttpError:
    """What a server without an egress image answers a networkPolicy."""
    return _error(
        400,
        "SANDBOX::INVALID_PARAMETER",
        "egress.image must be configured when networkPolicy is provided.",
    )
