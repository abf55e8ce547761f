"""OpenSandbox's two HTTP APIs as the provider uses them: the lifecycle server (create,
get, list, delete, renew sandboxes; endpoints) and each sandbox's command daemon, execd
(commands as a stream of events, files in and out). Written from the APIs' documents and
the servers' behaviour; every reader of an answer is total: what it cannot read is an
error value or an ApiError, never a crash."""

from __future__ import annotations

import contextlib
import json
import math
import re
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

__all__ = [
    "EXECD_PORT",
    "ApiError",
    "CommandEnd",
    "Execd",
    "Lifecycle",
    "OutputSink",
    "SandboxRecord",
    "read_command_events",
]

#: The port execd listens on in every sandbox.
EXECD_PORT = 44772
#: How long one request to either API may take (a create pulls the image first: longer).
REQUEST_TIMEOUT_S = 60.0
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


def _refusal(response: httpx.Response, doing: str) -> ApiError:
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

    def __init__(self, domain: str, api_key: str) -> None:
        base = _base_url(domain)
        self.base = base if base.endswith("/v1") else f"{base}/v1"
        self._client = httpx.Client(
            headers={"OPEN-SANDBOX-API-KEY": api_key} if api_key else {},
            timeout=REQUEST_TIMEOUT_S,
            # The APIs are asked for what they hold; nothing here needs a redirect.
            follow_redirects=False,
        )

    def close(self) -> None:
        self._client.close()

    def _call(
        self, method: str, path: str, doing: str, *, timeout: float | None = None, **kwargs: Any
    ) -> httpx.Response:
        try:
            return self._client.request(
                method, self.base + path, timeout=timeout or REQUEST_TIMEOUT_S, **kwargs
            )
        except httpx.HTTPError as error:
            raise ApiError(f"{doing}: {self.base} did not answer ({error})") from None

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
            raise _refusal(response, doing)

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
        response = self._call("POST", "/sandboxes", doing, json=body, timeout=CREATE_TIMEOUT_S)
        if response.status_code not in (200, 201, 202):
            raise _refusal(response, doing)
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
            raise _refusal(response, doing)
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
                raise _refusal(response, doing)
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
            raise _refusal(response, doing)

    def renew(self, sandbox_id: str, lifetime_s: float) -> None:
        """The sandbox ends by itself `lifetime_s` from now."""
        doing = f"renewing sandbox {sandbox_id}"
        until = datetime.now(UTC) + timedelta(seconds=lifetime_s)
        body = {"expiresAt": until.isoformat().replace("+00:00", "Z")}
        response = self._call(
            "POST", f"/sandboxes/{_segment(sandbox_id)}/renew-expiration", doing, json=body
        )
        if response.status_code != 200:
            raise _refusal(response, doing)

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
            raise _refusal(response, doing)
        body = self._json(response, doing)
        address = body.get("endpoint") if isinstance(body, dict) else None
        if not isinstance(address, str) or not address:
            raise ApiError(f"{doing}: the answer has no endpoint", response.status_code)
        headers = body.get("headers")
        return _base_url(address), {
            str(key): str(value)
            for key, value in (headers.items() if isinstance(headers, dict) else ())
        }


def _segment(value: str) -> str:
    return urllib.parse.quote(value, safe="")


# ------------------------------------------------------------------------------- execd


@dataclass
class CommandEnd:
    """How a command streamed by execd ended, as its events said. `exit_code` None: the
    stream ended without saying (the connection broke, or the reader stopped it)."""

    command_id: str = ""
    exit_code: int | None = None
    #: The end was execd's: a signal ended the command (its deadline, most often).
    signalled: bool = False
    #: The start failed (execd's own error text).
    start_error: str = ""


#: Takes each line of output (`stdout` or `stderr`, the text); False stops the reading.
OutputSink = Callable[[str, str], bool]


def read_command_events(lines: Iterator[str], end: CommandEnd, sink: OutputSink) -> None:
    """Read execd's events for one command into `end` and `sink` until its last (a
    completion or an error), or until `sink` says stop. Each event is a JSON object on a
    line of its own, bare or after `data:`; blank lines, comments and lines that are not
    an event are skipped."""
    for line in lines:
        text = line.strip()
        if text.startswith("data:"):
            text = text[5:].strip()
        if not text.startswith("{"):
            continue
        try:
            event = json.loads(text)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        kind, said = event.get("type"), event.get("text")
        said = said if isinstance(said, str) else ""
        if kind == "init":
            end.command_id = said
        elif kind in ("stdout", "stderr"):
            if not sink(str(kind), said):
                return
        elif kind == "execution_complete":
            end.exit_code = 0
            return
        elif kind == "error":
            error = event.get("error")
            value = str(error.get("evalue", "")) if isinstance(error, dict) else ""
            if not re.fullmatch(r"-?[0-9]{1,9}", value.strip()):
                end.start_error = value or "execd reported an error"
                end.exit_code = 126
                return
            code = int(value.strip())
            # A signal's end is -1 (the process's own status is not told).
            end.signalled = code < 0
            end.exit_code = 137 if code < 0 else code
            return


class Execd:
    """One sandbox's execd, at `url` with `headers` (the endpoint's, and its access
    token)."""

    def __init__(self, url: str, headers: Mapping[str, str]) -> None:
        self.url = url
        self._client = httpx.Client(
            headers=dict(headers), timeout=REQUEST_TIMEOUT_S, follow_redirects=False
        )

    def close(self) -> None:
        self._client.close()

    def ping(self) -> bool:
        try:
            return self._client.get(self.url + "/ping", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    def run(
        self,
        command: str,
        sink: OutputSink,
        *,
        uid: int | None = None,
        gid: int | None = None,
        envs: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> CommandEnd:
        """Run `command` (a shell command line) in the foreground, its output to `sink`,
        up to its end; the connection is closed then (execd keeps it open a while
        longer). When `sink` stops the reading, the command is interrupted."""
        body: dict[str, Any] = {"command": command}
        if uid is not None:
            body["uid"] = uid
        if gid is not None:
            body["gid"] = gid
        if envs:
            body["envs"] = dict(envs)
        if timeout_s is not None:
            body["timeout"] = max(1, math.ceil(min(timeout_s, 2**31) * 1000))
        end = CommandEnd()
        doing = "running a command"
        try:
            # execd sends a ping every few seconds while a command runs.
            with self._client.stream("POST", self.url + "/command", json=body) as response:
                if response.status_code != 200:
                    response.read()
                    raise _refusal(response, doing)
                read_command_events(response.iter_lines(), end, sink)
        except httpx.HTTPError as error:
            if end.exit_code is None and not end.command_id:
                raise ApiError(f"{doing}: {self.url} did not answer ({error})") from None
        if end.exit_code is None and end.command_id:
            self.interrupt(end.command_id)
        return end

    def interrupt(self, command_id: str) -> None:
        """End a command execd runs (a client that goes away does not end it)."""
        with contextlib.suppress(httpx.HTTPError):
            self._client.delete(self.url + "/command", params={"id": command_id})

    def spawn(
        self,
        command: str,
        *,
        uid: int | None = None,
        gid: int | None = None,
        envs: Mapping[str, str] | None = None,
    ) -> str:
        """Start `command` in the background; its command id."""
        body: dict[str, Any] = {"command": command, "background": True, "envs": dict(envs or {})}
        if uid is not None:
            body["uid"] = uid
        if gid is not None:
            body["gid"] = gid
        end = CommandEnd()
        doing = "starting a command in the background"
        try:
            with self._client.stream("POST", self.url + "/command", json=body) as response:
                if response.status_code != 200:
                    response.read()
                    raise _refusal(response, doing)
                read_command_events(response.iter_lines(), end, lambda kind, text: True)
        except httpx.HTTPError as error:
            raise ApiError(f"{doing}: {self.url} did not answer ({error})") from None
        if not end.command_id:
            raise ApiError(f"{doing}: execd named no command")
        return end.command_id

    def status(self, command_id: str) -> tuple[bool, int | None] | None:
        """(running, exit code) of a command, None when execd does not know it (yet)."""
        try:
            response = self._client.get(f"{self.url}/command/status/{_segment(command_id)}")
            body = json.loads(response.content) if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        if not isinstance(body, dict):
            return None
        code = body.get("exit_code")
        return bool(body.get("running")), code if isinstance(code, int) else None

    def output(self, command_id: str, keep: int) -> str:
        """The last `keep` bytes of a background command's output (empty when execd
        has none to give)."""
        try:
            response = self._client.get(f"{self.url}/command/{_segment(command_id)}/logs")
        except httpx.HTTPError:
            return ""
        if response.status_code != 200:
            return ""
        return response.content[-keep:].decode("utf-8", "replace")

    def upload(self, files: Mapping[str, tuple[bytes, int]]) -> None:
        """Write each file (`path: (content, mode)`) in one request; execd makes the
        folders above them."""
        doing = "uploading files"
        parts: list[tuple[str, tuple[str, bytes, str]]] = []
        for path, (content, mode) in files.items():
            meta = json.dumps({"path": path, "mode": int(f"{mode:o}")}).encode()
            parts.append(("metadata", ("metadata", meta, "application/json")))
            parts.append(
                ("file", (path.rsplit("/", 1)[-1] or "file", content, "application/octet-stream"))
            )
        try:
            response = self._client.post(self.url + "/files/upload", files=parts)
        except httpx.HTTPError as error:
            raise ApiError(f"{doing}: {self.url} did not answer ({error})") from None
        if response.status_code != 200:
            raise _refusal(response, doing)

    def download(self, path: str) -> DownloadStream | None:
        """The file's bytes as they come; None when there is no such file."""
        doing = f"reading {path}"
        request = self._client.build_request(
            "GET", self.url + "/files/download", params={"path": path}
        )
        try:
            response = self._client.send(request, stream=True)
        except httpx.HTTPError as error:
            raise ApiError(f"{doing}: {self.url} did not answer ({error})") from None
        if response.status_code == 404:
            response.close()
            return None
        if response.status_code != 200:
            response.read()
            response.close()
            raise _refusal(response, doing)
        return DownloadStream(response)


class DownloadStream:
    """A download's bytes in chunks as they arrive; `close()` ends the transfer (the
    connection too), from another thread as well."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self._chunks = response.iter_bytes(65536)

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        try:
            return next(self._chunks)
        except httpx.HTTPError as error:
            raise ApiError(f"a download broke off ({error})") from None

    def close(self) -> None:
        self._response.close()
