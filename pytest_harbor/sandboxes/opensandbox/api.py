"""OpenSandbox's lifecycle server as the provider uses it (create, get, list, delete,
renew sandboxes; endpoints), and what both of its APIs share: the errors, the bounds on
every call. Written from the API's documents and the server's behaviour; every reader of
an answer is total: what it cannot read is an error value or an ApiError, never a crash.
The command daemon's API is in execd.py."""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import httpx

__all__ = [
    "EXECD_PORT",
    "ApiError",
    "Bounds",
    "Lifecycle",
    "SandboxRecord",
    "refusal",
    "said",
    "with_retries",
]

#: The port execd listens on in every sandbox.
EXECD_PORT = 44772
#: How long a create may take: the server pulls the image first.
CREATE_TIMEOUT_S = 600.0
#: The most sandboxes a list page holds (the server's own limit).
_PAGE_SIZE = 200


class ApiError(Exception):
    """An answer the provider cannot use: a refusal (`status`, the server's `code`), a
    broken connection (`status` 0), or a body it cannot read."""

    def __init__(self, message: str, status: int = 0, code: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.code = code

    @property
    def unreachable(self) -> bool:
        return self.status == 0


@dataclass(frozen=True)
class Bounds:
    """How long the provider waits on the server and on execd; nothing waits longer."""

    #: One call's answer (a create's: CREATE_TIMEOUT_S).
    request_s: float = 30.0
    #: A command's event stream, or a download, that sends nothing at all (execd pings a
    #: command's stream every 3 s): the command is then followed by asking execd.
    quiet_s: float = 15.0
    #: execd answering nothing at all, or the same call failing: the sandbox is lost.
    unanswered_s: float = 60.0

    def timeout(self, *, read: float | None = None) -> httpx.Timeout:
        return httpx.Timeout(self.request_s, read=read or self.request_s)


_T = TypeVar("_T")


def with_retries(call: Callable[[], _T], bounds: Bounds, doing: str) -> _T:
    """`call` (an idempotent request), again while it fails for want of an answer (an
    ApiError with status 0), up to `bounds.unanswered_s` from the first try; a refusal is
    raised at once."""
    given_up = time.monotonic() + bounds.unanswered_s
    delay = 0.2
    while True:
        try:
            return call()
        except ApiError as error:
            if not error.unreachable or time.monotonic() + delay > given_up:
                if error.unreachable:
                    raise ApiError(
                        f"{error} (no answer for {bounds.unanswered_s:g} s while {doing})"
                    ) from None
                raise
        time.sleep(delay)
        delay = min(delay * 2, 2.0)


def refusal(response: httpx.Response, doing: str) -> ApiError:
    """The server's refusal, with what it said (`code` and `message`, FastAPI's `detail`,
    execd's `error`, or the start of a plain body)."""
    code, said = "", ""
    try:
        body = json.loads(response.content[:65536])
    except ValueError:
        body = None
    if isinstance(body, dict):
        code = str(body.get("code") or "")
        said = str(body.get("message") or body.get("error") or body.get("detail") or "")
    if not said:
        said = response.content[:300].decode("utf-8", "replace").strip()
    return ApiError(
        f"{doing}: HTTP {response.status_code}" + (f" {code}" if code else "") + f": {said}",
        response.status_code,
        code,
    )


def _base_url(address: str) -> str:
    """An address as the APIs give it (no scheme: `host:port/path`) or as a user writes it
    (with one), as a URL without a trailing slash."""
    address = address.strip().rstrip("/")
    return address if "://" in address else f"http://{address}"


@dataclass(frozen=True)
class SandboxRecord:
    """A sandbox as the lifecycle server describes it."""

    id: str
    state: str
    metadata: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, body: Any) -> SandboxRecord | None:
        """The record in a body, None when it has no id or state."""
        if not isinstance(body, dict) or not isinstance(body.get("id"), str):
            return None
        status = body.get("status")
        status = status if isinstance(status, dict) else {}
        metadata = body.get("metadata")
        return cls(
            id=body["id"],
            state=str(status.get("state") or "Unknown"),
            metadata={
                str(key): str(value)
                for key, value in (metadata.items() if isinstance(metadata, dict) else ())
                if isinstance(value, str)
            },
        )


class Lifecycle:
    """The lifecycle server at `domain` (`host:port`, with a scheme or not), authenticated
    by `api_key`."""

    def __init__(self, domain: str, api_key: str, bounds: Bounds | None = None) -> None:
        base = _base_url(domain)
        self.base = base if base.endswith("/v1") else f"{base}/v1"
        self.bounds = bounds or Bounds()
        self._client = httpx.Client(
            headers={"OPEN-SANDBOX-API-KEY": api_key} if api_key else {},
            timeout=self.bounds.timeout(),
            # The APIs are asked for what they hold; nothing here needs a redirect.
            follow_redirects=False,
        )

    def close(self) -> None:
        self._client.close()

    def _call(
        self, method: str, path: str, doing: str, *, timeout: float | None = None, **kwargs: Any
    ) -> httpx.Response:
        def once() -> httpx.Response:
            try:
                return self._client.request(
                    method, self.base + path, timeout=timeout or self.bounds.request_s, **kwargs
                )
            except httpx.HTTPError as error:
                raise ApiError(f"{doing}: {self.base} did not answer ({said(error)})") from None

        # What only reads or removes is asked again; a create is not (it would make two).
        return with_retries(once, self.bounds, doing) if method != "POST" else once()

    def _json(self, response: httpx.Response, doing: str) -> Any:
        try:
            return json.loads(response.content)
        except ValueError:
            raise ApiError(f"{doing}: the answer is not JSON", response.status_code) from None

    def check(self) -> None:
        """The server answers and takes the key (one page of one sandbox)."""
        doing = f"asking {self.base} for its sandboxes"
        response = self._call("GET", "/sandboxes", doing, params={"pageSize": 1})
        if response.status_code != 200:
            raise refusal(response, doing)

    def create(
        self,
        *,
        image: str,
        entrypoint: Sequence[str],
        resources: Mapping[str, str],
        timeout_s: int | None,
        env: Mapping[str, str],
        metadata: Mapping[str, str],
        volumes: Sequence[Mapping[str, Any]] = (),
        network_policy: Mapping[str, Any] | None = None,
    ) -> SandboxRecord:
        doing = f"creating a sandbox from {image}"
        body: dict[str, Any] = {
            "image": {"uri": image},
            "entrypoint": list(entrypoint),
            "resourceLimits": dict(resources),
            "timeout": timeout_s,
            "env": dict(env),
            "metadata": dict(metadata),
        }
        if volumes:
            body["volumes"] = [dict(volume) for volume in volumes]
        if network_policy is not None:
            body["networkPolicy"] = dict(network_policy)
        response = self._call("POST", "/sandboxes", doing, json=body, timeout=CREATE_TIMEOUT_S)
        if response.status_code not in (200, 201, 202):
            raise refusal(response, doing)
        record = SandboxRecord.read(self._json(response, doing))
        if record is None:
            raise ApiError(f"{doing}: the answer names no sandbox", response.status_code)
        return record

    def get(self, sandbox_id: str) -> SandboxRecord | None:
        """The sandbox, or None when the server has none of that id."""
        doing = f"asking for sandbox {sandbox_id}"
        response = self._call("GET", f"/sandboxes/{_segment(sandbox_id)}", doing)
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise refusal(response, doing)
        record = SandboxRecord.read(self._json(response, doing))
        if record is None:
            raise ApiError(f"{doing}: the answer names no sandbox", response.status_code)
        return record

    def list(self, metadata: Mapping[str, str] | None = None) -> list[SandboxRecord]:
        """Every sandbox (carrying all of `metadata`), page by page."""
        doing = "listing sandboxes"
        found: list[SandboxRecord] = []
        params: dict[str, Any] = {"pageSize": _PAGE_SIZE}
        if metadata:
            # One query parameter holding a form-encoded `k=v&k2=v2` (encoded once more as a
            # query value, as the server reads it).
            params["metadata"] = urllib.parse.urlencode(dict(metadata))
        for page in range(1, 10_000):
            response = self._call("GET", "/sandboxes", doing, params={**params, "page": page})
            if response.status_code != 200:
                raise refusal(response, doing)
            body = self._json(response, doing)
            items = body.get("items") if isinstance(body, dict) else None
            if not isinstance(items, list):
                raise ApiError(f"{doing}: the answer has no items", response.status_code)
            found += [record for item in items if (record := SandboxRecord.read(item))]
            pagination = body.get("pagination")
            if not (isinstance(pagination, dict) and pagination.get("hasNextPage") is True):
                break
        return found

    def delete(self, sandbox_id: str) -> None:
        """Remove the sandbox at once; no error when it is gone."""
        doing = f"removing sandbox {sandbox_id}"
        response = self._call("DELETE", f"/sandboxes/{_segment(sandbox_id)}", doing)
        if response.status_code not in (200, 202, 204, 404):
            raise refusal(response, doing)

    def renew(self, sandbox_id: str, lifetime_s: float) -> None:
        """The sandbox ends by itself `lifetime_s` from now."""
        doing = f"renewing sandbox {sandbox_id}"
        until = datetime.now(UTC) + timedelta(seconds=lifetime_s)
        body = {"expiresAt": until.isoformat().replace("+00:00", "Z")}
        response = self._call(
            "POST", f"/sandboxes/{_segment(sandbox_id)}/renew-expiration", doing, json=body
        )
        if response.status_code != 200:
            raise refusal(response, doing)

    def endpoint(
        self, sandbox_id: str, port: int, server_proxy: bool
    ) -> tuple[str, dict[str, str]]:
        """The address of `port` in the sandbox (a URL) and the headers a request there
        carries."""
        doing = f"asking for the endpoint of port {port} of sandbox {sandbox_id}"
        params = {"use_server_proxy": "true"} if server_proxy else {}
        response = self._call(
            "GET", f"/sandboxes/{_segment(sandbox_id)}/endpoints/{port}", doing, params=params
        )
        if response.status_code != 200:
            raise refusal(response, doing)
        body = self._json(response, doing)
        address = body.get("endpoint") if isinstance(body, dict) else None
        if not isinstance(address, str) or not address:
            raise ApiError(f"{doing}: the answer has no endpoint", response.status_code)
        headers = body.get("headers")
        return _base_url(address), {
            str(key): str(value)
            for key, value in (headers.items() if isinstance(headers, dict) else ())
        }


def said(error: httpx.HTTPError) -> str:
    """What broke, never empty (a timeout's own text is)."""
    return str(error) or type(error).__name__


def _segment(value: str) -> str:
    return urllib.parse.quote(value, safe="")
