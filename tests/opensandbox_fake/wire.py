"""HTTP as the fake speaks it: the request handler, errors, times, JSON and execd's
event stream, multipart bodies."""

from __future__ import annotations

import codecs
import contextlib
import json
import re
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import Message
from email.parser import BytesHeaderParser
from email.utils import collapse_rfc2231_value
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any, ClassVar

from tests.opensandbox_fake.faults import Fault, Holding, cut

if TYPE_CHECKING:
    from tests.opensandbox_fake.server import FakeOpenSandbox

#: execd pings every 3 s while a command's stream is open (sse.go).
PING_INTERVAL_S = 3.0
#: What the fake reads of a request body at most.
MAX_BODY = 64 * 1024 * 1024
#: The Content-Type of gin's JSON answers.
GO_JSON = "application/json; charset=utf-8"


class _HttpError(Exception):
    """An answer that is not a success: its status and body (JSON, or text for a str)."""

    def __init__(self, status: int, body: object) -> None:
        super().__init__(status, body)
        self.status = status
        self.body = body


class _SandboxGone(Exception):
    """The container went away under a running command: execd died with it."""


def _error(status: int, code: str, message: str) -> _HttpError:
    return _HttpError(status, {"code": code, "message": message})


def _not_found(sandbox_id: str) -> _HttpError:
    return _error(404, "DOCKER::SANDBOX_NOT_FOUND", f"Sandbox {sandbox_id} not found.")


def _invalid_body(message: str) -> _HttpError:
    return _error(400, "INVALID_REQUEST_BODY", message)


def _starlette_json(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


# ---------------------------------------------------------------------------------------
# Times in the forms the real services write
# ---------------------------------------------------------------------------------------


def _now() -> datetime:
    return datetime.now(UTC)


def _pydantic_time(moment: datetime) -> str:
    """An aware datetime as pydantic v2 writes it: ISO 8601, UTC as Z."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _go_time(moment: datetime) -> str:
    """A time as Go's time.Time marshals it in UTC: RFC 3339, fraction without zeros."""
    moment = moment.astimezone(UTC)
    fraction = f"{moment.microsecond:06d}".rstrip("0")
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + (f".{fraction}" if fraction else "") + "Z"


_DOCKER_TIME = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$")


def _docker_time(text: str | None) -> datetime:
    """A time the engine wrote (nanoseconds), cut to microseconds; now when absent."""
    match = _DOCKER_TIME.match(text or "")
    if not match or text == "0001-01-01T00:00:00Z":
        return _now()
    fraction = (match[2] or "")[:6]
    zone = "+00:00" if match[3] == "Z" else match[3]
    return datetime.fromisoformat(f"{match[1]}{'.' + fraction if fraction else ''}{zone}")


_STAT_TIME = re.compile(r"(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d)(?:\.(\d+))? ([+-]\d\d)(\d\d)$")


def _stat_time(text: str) -> str:
    """`stat -c %y` output ("2026-01-02 03:04:05.123456789 +0000") as Go writes it."""
    match = _STAT_TIME.match(text.strip())
    if not match:
        return text
    fraction = (match[3] or "").rstrip("0")
    zone = "Z" if match[4] + match[5] in ("+0000", "-0000") else f"{match[4]}:{match[5]}"
    return f"{match[1]}T{match[2]}{'.' + fraction if fraction else ''}{zone}"


# ---------------------------------------------------------------------------------------
# execd's output framing
# ---------------------------------------------------------------------------------------


def _replace_one_byte(error: UnicodeError) -> tuple[str, int]:
    """Go's JSON encoder replaces each invalid UTF-8 byte by one U+FFFD."""
    assert isinstance(error, UnicodeDecodeError)
    return "\ufffd", error.start + 1


_GO_REPLACE = "opensandbox-fake-go-replace"
codecs.register_error(_GO_REPLACE, _replace_one_byte)
_TERMINATOR = re.compile(rb"[\r\n]")


class _LineSplitter:
    """execd's tailing of an output file: lines end at \\n or \\r (\\r\\n is one end), the
    end is removed, a blank line is sent as "\\n", a partial line waits for its end or for
    the process's exit."""

    def __init__(self) -> None:
        self._partial = b""
        self._after_cr = False

    def feed(self, data: bytes) -> list[str]:
        lines: list[str] = []
        start = 0
        for match in _TERMINATOR.finditer(data):
            segment = self._partial + data[start : match.start()]
            self._partial = b""
            end = match.group()
            if segment:
                lines.append(segment.decode("utf-8", _GO_REPLACE))
            elif not (end == b"\n" and self._after_cr):
                lines.append("\n")
            self._after_cr = end == b"\r"
            start = match.end()
        if start < len(data):
            self._partial += data[start:]
            self._after_cr = False
        return lines

    def flush(self) -> list[str]:
        partial, self._partial = self._partial, b""
        return [partial.decode("utf-8", _GO_REPLACE)] if partial else []


class _PidLine:
    """Takes the wrapper's first stderr line, its pid, off the stream."""

    def __init__(self, on_pid: Callable[[int], None]) -> None:
        self._on_pid = on_pid
        self._head = b""
        self._done = False

    def strip(self, data: bytes) -> bytes:
        if self._done:
            return data
        self._head += data
        head, newline, rest = self._head.partition(b"\n")
        if not newline:
            return b""
        self._done = True
        with contextlib.suppress(ValueError):
            self._on_pid(int(head))
        return rest


def _go_json(value: object) -> bytes:
    """JSON as Go's encoding/json writes it: compact, <, > and & escaped."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(raw, escaped)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029").encode()


def _event(
    kind: str, *, text: str = "", execution_time: int = 0, error: dict[str, object] | None = None
) -> dict[str, object]:
    """One stream event, fields in execd's order, empty ones left out (omitempty)."""
    event: dict[str, object] = {"type": kind}
    if text:
        event["text"] = text
    if execution_time:
        event["execution_time"] = execution_time
    event["timestamp"] = int(time.time() * 1000)
    if error is not None:
        event["error"] = error
    return event


def _exec_error(value: str, trace: str) -> dict[str, object]:
    return {"ename": "CommandExecError", "evalue": value, "traceback": [trace]}


class _EventStream:
    """The body of a /command answer: bare JSON events, each followed by a blank line, in
    HTTP chunks; headers go with the first event, as execd commits them lazily."""

    def __init__(self, handler: _Handler, fault: Fault | None = None) -> None:
        self._handler = handler
        self._holding = Holding(fault)
        self._lock = threading.Lock()
        self._started = False
        self._stopped = threading.Event()
        self._pinger: threading.Thread | None = None
        #: False once the client is gone; later events are dropped.
        self.open = True

    def send(self, event: dict[str, object]) -> None:
        self.write(_go_json(event) + b"\n\n")

    def write(self, data: bytes) -> None:
        with self._lock:
            if not self.open:
                return
            if self._holding.cuts_now():
                cut(self._handler.connection)
                self.open = False
                self._handler.close_connection = True
                return
            if self._holding.holds(data):
                return
            self._send([*self._holding.release(), data])

    def _send(self, pieces: list[bytes]) -> None:
        """Each piece as a chunk of the body (the headers first); the stream is closed
        when the client has gone."""
        for data in pieces:
            try:
                if not self._started:
                    self._started = True
                    handler = self._handler
                    handler.send_response(200)
                    handler.send_header("Content-Type", "text/event-stream")
                    handler.send_header("Cache-Control", "no-cache")
                    handler.send_header("Connection", "keep-alive")
                    handler.send_header("X-Accel-Buffering", "no")
                    handler.send_header("Transfer-Encoding", "chunked")
                    handler.end_headers()
                self._handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self._handler.wfile.flush()
            except OSError:
                self.open = False
                return

    def start_pings(self) -> None:
        """A ping now, then every 3 s until finish()."""

        def ping() -> None:
            while not self._stopped.wait(PING_INTERVAL_S) and self.open:
                self.send(_event("ping", text="pong"))

        self.send(_event("ping", text="pong"))

        self._pinger = threading.Thread(target=ping, daemon=True)
        self._pinger.start()

    def finish(self) -> None:
        """Stops the pings and ends the body (the connection is closed if the client left)."""
        self._stopped.set()
        if self._pinger is not None:
            self._pinger.join()
        with self._lock:
            if self.open and self._holding.held:
                self._send(self._holding.release())
            if self.open and self._started:
                try:
                    self._handler.wfile.write(b"0\r\n\r\n")
                except OSError:
                    self.open = False
            if not self.open:
                self._handler.close_connection = True

    def abort(self) -> None:
        """Ends the connection without ending the body, as a dying execd does."""
        self._stopped.set()
        with self._lock:
            self.open = False
            self._handler.close_connection = True


# ---------------------------------------------------------------------------------------
# Multipart bodies (Go's multipart.ReadForm, in the parts execd reads)
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Part:
    name: str
    filename: str
    data: bytes


def _disposition_param(headers: Message, name: str) -> str:
    value = headers.get_param(name, header="content-disposition")
    if value is None:
        return ""
    return collapse_rfc2231_value(value)


def _parse_multipart(content_type: str, body: bytes) -> list[_Part] | None:
    """The parts of a multipart/form-data body; None when it is not one."""
    header = Message()
    header["Content-Type"] = content_type
    boundary = header.get_param("boundary")
    if header.get_content_type() != "multipart/form-data" or not isinstance(boundary, str):
        return None
    delimiter = b"--" + boundary.encode("latin-1")
    position = body.find(delimiter)
    if position < 0:
        return None
    parts: list[_Part] = []
    position += len(delimiter)
    while not body.startswith(b"--", position):
        line_end = body.find(b"\r\n", position)
        if line_end < 0:
            return None
        start = line_end + 2
        end = body.find(b"\r\n" + delimiter, start)
        if end < 0:
            return None
        if body.startswith(b"\r\n", start):
            raw_headers, content = b"", start + 2
        else:
            split = body.find(b"\r\n\r\n", start, end + 2)
            if split < 0:
                return None
            raw_headers, content = body[start:split], split + 4
        headers = BytesHeaderParser().parsebytes(raw_headers + b"\r\n\r\n")
        name = _disposition_param(headers, "name")
        filename = _disposition_param(headers, "filename")
        parts.append(_Part(name, filename, body[content:end]))
        position = end + 2 + len(delimiter)
    return parts


# ---------------------------------------------------------------------------------------
# The HTTP handler
# ---------------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    """Reads a request (body bounded), lets the fake answer it, and turns any failure into
    an answer: a JSON error, or a plain-text 500; never a hung connection."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    timeout = 300
    fake: ClassVar[FakeOpenSandbox]
    answered = False

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def end_headers(self) -> None:
        self.answered = True
        super().end_headers()

    def do_GET(self) -> None:
        self.answered = False
        try:
            body = self._read_body()
        except _HttpError as error:
            self.close_connection = True
            self.reply_error(error)
            return
        try:
            self.fake._serve(self, body)
        except _HttpError as error:
            if self.answered:
                self.close_connection = True
            else:
                self.reply_error(error)
        except Exception:
            self.close_connection = True
            if not self.answered:
                text = "Internal Server Error\n\n" + traceback.format_exc()
                self.reply(500, text.encode(), "text/plain; charset=utf-8")

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def _read_body(self) -> bytes:
        """The request body, chunked or not; 413 past MAX_BODY, 400 when malformed."""
        try:
            if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY:
                    raise _HttpError(413, "request body over 64 MiB")
                return self.rfile.read(length) if length > 0 else b""
            pieces: list[bytes] = []
            total = 0
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                total += size
                if total > MAX_BODY:
                    raise _HttpError(413, "request body over 64 MiB")
                pieces.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(pieces)
        except ValueError:
            raise _HttpError(400, "malformed request body framing") from None

    def reply(
        self,
        status: int,
        body: bytes = b"",
        kind: str | None = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        try:
            self.send_response(status)
            if status != 204:
                if kind:
                    self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            if status != 204:
                self.wfile.write(body)
        except OSError:
            self.close_connection = True

    def reply_error(self, error: _HttpError) -> None:
        if isinstance(error.body, str):
            self.reply(error.status, error.body.encode(), "text/plain; charset=utf-8")
        else:
            self.reply(error.status, json.dumps(error.body, separators=(",", ":")).encode())
