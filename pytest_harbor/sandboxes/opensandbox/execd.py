"""A sandbox's command daemon, execd, as the provider drives it: commands as a stream of
events, their state asked for when the stream fails, files in and out.

Every call is bounded (`Bounds`). A command's stream that goes quiet or is cut does not
end the command (execd runs it on, whoever listens), so the stream's failure is handed to
the caller with the command's id, never taken for the command's end; `wait()` then asks
execd how the command ended. What only reads or writes a file is asked again while execd
does not answer, and a download that breaks goes on from the byte it reached."""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from pytest_harbor.sandboxes.opensandbox.api import ApiError, Bounds, refusal, said, with_retries

__all__ = ["CommandEnd", "DownloadStream", "Execd", "OutputSink", "read_command_events"]


@dataclass
class CommandEnd:
    """How a command streamed by execd ended, as its events (or, after a broken stream,
    its state) said. `exit_code` None: nothing has said yet."""

    command_id: str = ""
    exit_code: int | None = None
    #: The end was execd's: a signal ended the command (its deadline, most often).
    signalled: bool = False
    #: The start failed (execd's own error text).
    start_error: str = ""
    #: The reader stopped the stream (the command is interrupted).
    stopped: bool = False
    #: Why the stream failed before the command's end (it went quiet, or was cut): the
    #: command runs on, and its end is to be asked for (Execd.wait).
    broken: str = ""

    def ended_by(self, code: int) -> None:
        """The end execd tells as a number: a signal's is -1 (the process's own status is
        not told)."""
        self.signalled = code < 0
        self.exit_code = 137 if code < 0 else code


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
        kind, said_ = event.get("type"), event.get("text")
        said_ = said_ if isinstance(said_, str) else ""
        if kind == "init":
            end.command_id = said_
        elif kind in ("stdout", "stderr"):
            if not sink(str(kind), said_):
                end.stopped = True
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
            end.ended_by(int(value.strip()))
            return


class Execd:
    """One sandbox's execd, at `url` with `headers` (the endpoint's, and its access
    token), waited on within `bounds`."""

    def __init__(self, url: str, headers: Mapping[str, str], bounds: Bounds | None = None) -> None:
        self.url = url
        self.bounds = bounds or Bounds()
        self._client = httpx.Client(
            headers=dict(headers), timeout=self.bounds.timeout(), follow_redirects=False
        )

    def close(self) -> None:
        self._client.close()

    def ping(self) -> bool:
        try:
            wait = min(5.0, self.bounds.request_s)
            return self._client.get(self.url + "/ping", timeout=wait).status_code == 200
        except httpx.HTTPError:
            return False

    def _unanswered(self, doing: str, error: httpx.HTTPError) -> ApiError:
        return ApiError(f"{doing}: {self.url} did not answer ({said(error)})")

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
        longer). When `sink` stops the reading, the command is interrupted. A stream that
        fails once execd has named the command comes back with `broken` said: the
        command runs on. One that fails before is an ApiError (nothing says whether the
        command started)."""
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
        quiet = self.bounds.timeout(read=self.bounds.quiet_s)
        try:
            with self._client.stream(
                "POST", self.url + "/command", json=body, timeout=quiet
            ) as response:
                if response.status_code != 200:
                    response.read()
                    raise refusal(response, doing)
                read_command_events(response.iter_lines(), end, sink)
        except httpx.HTTPError as error:
            if not end.command_id:
                raise self._unanswered(doing, error) from None
            if end.exit_code is None and not end.stopped:
                end.broken = f"its stream failed ({said(error)})"
        if end.stopped:
            self.interrupt(end.command_id)
        elif end.exit_code is None and end.command_id and not end.broken:
            end.broken = "its stream ended before the command did"
        return end

    def wait(self, command_id: str, deadline: float | None) -> CommandEnd:
        """The command's end as execd's state of it says, asked until it has ended. Past
        its `deadline` (monotonic; execd ends it then) it is interrupted. An ApiError when
        execd answers nothing for `unanswered_s`, no longer knows the command, or still
        runs it `unanswered_s` past its deadline: its end cannot be known."""
        doing = f"following command {command_id}"
        answered = time.monotonic()
        delay = 0.02
        interrupted = False
        while True:
            state = self._state(command_id, doing)
            now = time.monotonic()
            if state is not None:
                answered = now
                if state.get("running") is False:
                    end = CommandEnd(command_id)
                    code = state.get("exit_code")
                    if isinstance(code, int) and not isinstance(code, bool):
                        end.ended_by(code)
                    return end
            if now - answered > self.bounds.unanswered_s:
                raise ApiError(
                    f"{doing}: {self.url} answered nothing for {self.bounds.unanswered_s:g} s"
                )
            if deadline is not None and now > deadline + 1.0:
                if now > deadline + self.bounds.unanswered_s:
                    raise ApiError(f"{doing}: execd still runs it long past its deadline")
                if not interrupted:
                    interrupted = True
                    self.interrupt(command_id)
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def _state(self, command_id: str, doing: str) -> dict[str, Any] | None:
        """execd's state of the command; None when execd did not answer (the caller asks
        again). An ApiError when execd answers that it does not know the command."""
        try:
            response = self._client.get(
                f"{self.url}/command/status/{_segment(command_id)}",
                timeout=self.bounds.request_s,
            )
        except httpx.HTTPError:
            return None
        if response.status_code in (400, 404):
            raise ApiError(f"{doing}: execd no longer knows the command ({response.text[:200]})")
        if response.status_code != 200:
            return None  # the server's proxy, not execd (a 502 while execd restarts)
        try:
            body = json.loads(response.content)
        except ValueError:
            return None
        return body if isinstance(body, dict) else None

    @property
    def headers(self) -> dict[str, str]:
        """What every request carries (the endpoint's headers and the access token)."""
        return dict(self._client.headers)

    def start_terminal(self) -> str:
        """A terminal session (`/pty`, execd 1.0.10 and later): its id. Its shell, root's,
        starts when its WebSocket is first joined."""
        doing = "opening a terminal session"
        try:
            response = self._client.post(self.url + "/pty", json={})
        except httpx.HTTPError as error:
            raise self._unanswered(doing, error) from None
        if response.status_code in (404, 405, 501):
            raise ApiError(
                f"{doing}: this execd has no terminal API (execd 1.0.10 and later have)",
                response.status_code,
            )
        if response.status_code not in (200, 201):
            raise refusal(response, doing)
        try:
            session = json.loads(response.content).get("session_id")
        except (ValueError, AttributeError):
            session = None
        if not isinstance(session, str) or not session:
            raise ApiError(f"{doing}: execd named no session")
        return session

    def end_terminal(self, session_id: str) -> None:
        """Delete a terminal session (its process group is killed); never fails."""
        with contextlib.suppress(httpx.HTTPError):
            self._client.delete(f"{self.url}/pty/{_segment(session_id)}")

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
                    raise refusal(response, doing)
                read_command_events(response.iter_lines(), end, lambda kind, text: True)
        except httpx.HTTPError as error:
            if not end.command_id:
                raise self._unanswered(doing, error) from None
        if not end.command_id:
            raise ApiError(f"{doing}: execd named no command")
        return end.command_id

    def status(self, command_id: str) -> tuple[bool, int | None] | None:
        """(running, exit code) of a command, None when execd does not know it (yet)."""
        try:
            state = self._state(command_id, "")
        except ApiError:
            return None
        if state is None:
            return None
        code = state.get("exit_code")
        return bool(state.get("running")), code if isinstance(code, int) else None

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
        folders above them. Asked again while execd does not answer (the same files are
        written again)."""
        doing = "uploading files"
        parts: list[tuple[str, tuple[str, bytes, str]]] = []
        for path, (content, mode) in files.items():
            meta = json.dumps({"path": path, "mode": int(f"{mode:o}")}).encode()
            parts.append(("metadata", ("metadata", meta, "application/json")))
            parts.append(
                ("file", (path.rsplit("/", 1)[-1] or "file", content, "application/octet-stream"))
            )

        def once() -> None:
            try:
                response = self._client.post(self.url + "/files/upload", files=parts)
            except httpx.HTTPError as error:
                raise self._unanswered(doing, error) from None
            if response.status_code != 200:
                raise refusal(response, doing)

        with_retries(once, self.bounds, doing)

    def download(self, path: str) -> DownloadStream | None:
        """The file's bytes as they come; None when there is no such file."""
        response = self._open(path, 0)
        return None if response is None else DownloadStream(self, path, response)

    def _open(self, path: str, offset: int) -> httpx.Response | None:
        """The download of `path` from byte `offset` on, under way (asked again while
        execd does not answer); None when there is no such file."""
        doing = f"reading {path}"
        headers = {"Range": f"bytes={offset}-"} if offset else {}

        def once() -> httpx.Response | None:
            request = self._client.build_request(
                "GET",
                self.url + "/files/download",
                params={"path": path},
                headers=headers,
                timeout=self.bounds.timeout(read=self.bounds.quiet_s),
            )
            try:
                response = self._client.send(request, stream=True)
            except httpx.HTTPError as error:
                raise self._unanswered(doing, error) from None
            if response.status_code == 404:
                response.close()
                return None
            if response.status_code == 416 and offset:
                return response  # the break came at the very end: nothing more to read
            if response.status_code not in (200, 206) or (offset and response.status_code != 206):
                with contextlib.suppress(httpx.HTTPError):
                    response.read()
                response.close()
                raise refusal(response, doing)
            return response

        return with_retries(once, self.bounds, doing)


class DownloadStream:
    """A download's bytes in chunks as they arrive, from where a broken transfer left off
    when it breaks; `close()` ends the transfer (the connection too), from another thread
    as well."""

    def __init__(self, execd: Execd, path: str, response: httpx.Response) -> None:
        self._execd = execd
        self._path = path
        self._response = response
        self._chunks = self._body(response)
        self._closed = False
        #: How many bytes have come.
        self.offset = 0

    @staticmethod
    def _body(response: httpx.Response) -> Iterator[bytes]:
        return iter(()) if response.status_code == 416 else response.iter_bytes(65536)

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        broke_at = time.monotonic()
        while True:
            try:
                chunk = next(self._chunks)
            except httpx.HTTPError as error:
                if self._closed:
                    raise ApiError(f"a download of {self._path} was ended") from None
                if time.monotonic() - broke_at > self._execd.bounds.unanswered_s:
                    raise ApiError(
                        f"a download of {self._path} broke off ({said(error)})"
                    ) from None
                self._response.close()
                resumed = self._execd._open(self._path, self.offset)
                if resumed is None:
                    raise ApiError(f"{self._path} went away while it was read") from None
                self._response, self._chunks = resumed, self._body(resumed)
                continue
            self.offset += len(chunk)
            return chunk

    def close(self) -> None:
        self._closed = True
        self._response.close()


def _segment(value: str) -> str:
    return urllib.parse.quote(value, safe="")
