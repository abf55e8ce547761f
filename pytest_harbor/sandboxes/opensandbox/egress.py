"""A sandbox's egress sidecar (OpenSandbox's components/egress) as the provider drives
it: its policy read and replaced through its API on port 18080, reached through the
server's endpoint with the token the server gives it. Only its `dns+nft` mode holds a
policy on addresses; in `dns` mode a deny blocks names alone, so the provider refuses a
sandbox whose sidecar runs so."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from pytest_harbor.sandboxes.opensandbox.api import ApiError, Bounds, refusal, said, with_retries

__all__ = ["EGRESS_PORT", "EgressPolicy", "policy_of"]

#: The port the sidecar's API listens on, in the sandbox's network namespace.
EGRESS_PORT = 18080


def policy_of(enabled: bool, hosts: Sequence[str] | None) -> dict[str, Any]:
    """The sidecar's policy for a phase: no network, only `hosts` (names, `*.suffix`,
    addresses, networks), or the whole network."""
    if not enabled:
        return {"defaultAction": "deny", "egress": []}
    if hosts is None:
        return {"defaultAction": "allow", "egress": []}
    return {"defaultAction": "deny", "egress": [{"action": "allow", "target": h} for h in hosts]}


class EgressPolicy:
    """One sandbox's sidecar, at `url` with `headers` (its token)."""

    def __init__(self, url: str, headers: Mapping[str, str], bounds: Bounds) -> None:
        self.url = url
        self.bounds = bounds
        self._client = httpx.Client(
            headers=dict(headers), timeout=bounds.timeout(), follow_redirects=False
        )

    def close(self) -> None:
        self._client.close()

    def _call(self, method: str, doing: str, body: object = None) -> dict[str, Any]:
        def once() -> dict[str, Any]:
            try:
                response = self._client.request(
                    method, self.url + "/policy", content=None if body is None else json.dumps(body)
                )
            except httpx.HTTPError as error:
                raise ApiError(f"{doing}: {self.url} did not answer ({said(error)})") from None
            if response.status_code != 200:
                raise refusal(response, doing)
            try:
                answer = json.loads(response.content)
            except ValueError:
                raise ApiError(f"{doing}: the answer is not JSON", response.status_code) from None
            return answer if isinstance(answer, dict) else {}

        # Replacing the policy with the same one again is harmless: asked again too.
        return with_retries(once, self.bounds, doing)

    def enforcement(self) -> str:
        """How the sidecar enforces its policy (`dns`, `dns+nft`)."""
        return str(self._call("GET", "asking the egress sidecar its mode").get("enforcementMode"))

    def apply(self, policy: Mapping[str, Any]) -> None:
        self._call("POST", "setting the sandbox's egress policy", dict(policy))
