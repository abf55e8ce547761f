"""A fake OpenSandbox server for tests: a real HTTP server on 127.0.0.1 that speaks the
lifecycle API (at /v1 and at the root) and, behind its proxy path, the API of the
in-sandbox daemon execd, backed by the real Docker engine.

It copies the real server's Docker runtime and execd, quirks included (the behaviour
digest, /tmp/osb/DIGEST.md, gives the evidence): creation is synchronous, deleted and
expired sandboxes are gone, command output comes as bare JSON lines split on newlines,
exit codes only through `error.evalue`. What it does not do (snapshots, egress policies,
volumes, platforms) it refuses with the real server's kind of error; routes it does not
have (metadata patches, /code, /session, /pty, file search and moves) answer 404."""

from __future__ import annotations

import codecs
import contextlib
import io
import json
import posixpath
import queue
import re
import socket
import tarfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.message import Message
from email.parser import BytesHeaderParser
from email.utils import collapse_rfc2231_value, formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar
from urllib.parse import parse_qsl, unquote, urlsplit

import docker
import docker.errors
import docker.utils.socket

__all__ = ["FakeOpenSandbox"]

#: The Docker SDK has no type hints; its objects are `Any` here under readable names.
Container = Any

# Labels the real Docker runtime writes (srv/services/constants.py) and the fake's own.
ID_LABEL = "opensandbox.io/id"
EXPIRES_LABEL = "opensandbox.io/expires-at"
MANUAL_LABEL = "opensandbox.io/manual-cleanup"
INSTANCE_LABEL = "opensandbox-fake.instance"
#: On a container whose run label the fake added itself: metadata does not show that label.
ADDED_RUN_LABEL = "opensandbox-fake.run-label-added"
RUN_LABEL = "pytest-harbor.run"
RESERVED_PREFIX = "opensandbox.io/"
#: Label prefixes the real server leaves out of metadata, plus the fake's own.
HIDDEN_PREFIXES = (
    RESERVED_PREFIX,
    "org.opencontainers.image.",
    "com.docker.",
    "desktop.docker.",
    "opensandbox-fake.",
)

API_KEY_HEADER = "OPEN-SANDBOX-API-KEY"
EXECD_TOKEN_HEADER = "X-EXECD-ACCESS-TOKEN"
EXECD_TOKEN_ENV = "EXECD_ACCESS_TOKEN"
EXECD_PORT = 44772
#: The env file bootstrap.sh exports to execd (its KEY=VALUE lines are not read here).
EXECD_ENVS_FILE = "/opt/opensandbox/.env"
#: The real defaults of `[docker]` (config.py): dropped capabilities and the pids limit.
CAP_DROP = [
    "AUDIT_WRITE",
    "MKNOD",
    "NET_ADMIN",
    "NET_RAW",
    "SYS_ADMIN",
    "SYS_MODULE",
    "SYS_PTRACE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
]
PIDS_LIMIT = 4096
#: execd pings every 3 s while a command's stream is open (sse.go).
PING_INTERVAL_S = 3.0
#: execd's interrupt: SIGTERM to the group, SIGKILL if it still lives 3 s later.
INTERRUPT_GRACE_S = 3.0
#: How often the fake asks the engine whether a command's process has ended.
EXIT_POLL_S = 0.1
#: What the fake reads of a request body at most.
MAX_BODY = 64 * 1024 * 1024
SIGKILL = 9
SIGTERM = 15
#: The Content-Type of gin's JSON answers.
GO_JSON = "application/json; charset=utf-8"

#: The bootstrap the container runs as its entrypoint (the real one is execd's
#: bootstrap.sh, minus execd itself): it makes execd's env file, runs the request's
#: entrypoint in the background, forwards TERM to it and then ends with 0, else the
#: container ends with the entrypoint's code.
BOOTSTRAP = """\
EXECD_ENVS=${EXECD_ENVS:-/opt/opensandbox/.env}
mkdir -p "$(dirname "$EXECD_ENVS")" 2>/dev/null
touch "$EXECD_ENVS" 2>/dev/null
export EXECD_ENVS
cmd=""
if [ -n "${BOOTSTRAP_CMD:-}" ]; then
  cmd=$BOOTSTRAP_CMD
elif [ "$#" -ge 1 ] && [ "$1" = "-c" ]; then
  shift
  cmd=$*
fi
shell=$(command -v bash 2>/dev/null || command -v sh)
if [ -n "$cmd" ]; then
  "$shell" -c "$cmd" &
elif [ "$#" -eq 0 ]; then
  "$shell" &
else
  "$@" &
fi
child=$!
trap 'kill -TERM "$child" 2>/dev/null; wait "$child" 2>/dev/null; exit 0' TERM
wait "$child"
exit $?
"""

#: Runs a command as execd does ($0 the command, $1 the shell, $2 a background command's
#: output file, $3 where to note a death by signal): `$1 -c $0` in a session and process
#: group of its own, stdin from null, its pid first on stderr so the fake can signal the
#: group. The engine reports a death by signal N as exit code 128+N, Go (so execd) as -1;
#: bash tells the two apart by its "Killed"-like notice, which a ( ) subshell inside $( )
#: prints (not $( ) alone), so a note says which signal. (bash prints no notice for
#: SIGINT or SIGPIPE: those stay 130 and 141.)
NOTING_WRAPPER = """\
start='echo "$$" >&2; exec "$1" -c "$0"'
[ -z "$2" ] || start='echo "$$" >&2; exec "$1" -c "$0" >"$2" 2>&1'
exec 3>&2 4>&1
notice=$( (setsid /bin/sh -c "$start" "$0" "$1" "$2" </dev/null 2>&3 >&4 3>&- 4>&-
  code=$?; exit "$code") 2>&1 )
code=$?
if [ -n "$notice" ] && [ "$code" -gt 128 ]; then
  case $notice in *"core dumped"*) core=1 ;; *) core=0 ;; esac
  echo "$((code - 128)) $core" >"$3" 2>/dev/null
fi
exit "$code"
"""
#: Without bash or setsid: the exec'd process is the command itself (docker exec makes it
#: a session leader), so a death by signal N is only known as 128+N.
PLAIN_WRAPPER = [
    "/bin/sh",
    "-c",
    'echo "$$" >&2\n[ -z "$2" ] || exec "$1" -c "$0" >"$2" 2>&1 </dev/null\n'
    'exec "$1" -c "$0" </dev/null\n',
]
#: What Go's syscall.Signal.String() says of each signal (ExitError: "signal: killed").
GO_SIGNALS = {
    1: "hangup",
    2: "interrupt",
    3: "quit",
    4: "illegal instruction",
    5: "trace/breakpoint trap",
    6: "aborted",
    7: "bus error",
    8: "floating point exception",
    9: "killed",
    10: "user defined signal 1",
    11: "segmentation fault",
    12: "user defined signal 2",
    13: "broken pipe",
    14: "alarm clock",
    15: "terminated",
    16: "stack fault",
    24: "CPU time limit exceeded",
    25: "file size limit exceeded",
    26: "virtual timer expired",
    27: "profiling timer expired",
    29: "I/O possible",
    30: "power failure",
    31: "bad system call",
}


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
# Request validation of the lifecycle API (pydantic's 422 and the service's 400)
# ---------------------------------------------------------------------------------------


def _detail(kind: str, loc: list[str | int], msg: str, given: object) -> dict[str, object]:
    return {"type": kind, "loc": loc, "msg": msg, "input": given}


def _unprocessable(details: list[dict[str, object]]) -> _HttpError:
    return _HttpError(422, {"detail": details})


@dataclass(frozen=True)
class _CreateRequest:
    image_uri: str
    image_auth: dict[str, str] | None
    entrypoint: list[str]
    timeout: int | None
    resource_limits: dict[str, str]
    env: dict[str, str | None]
    metadata: dict[str, str] | None


def _string_map(
    body: dict[str, Any], name: str, errors: list[dict[str, object]], *, nullable: bool = False
) -> dict[str, Any] | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, dict):
        errors.append(
            _detail("dict_type", ["body", name], "Input should be a valid dictionary", value)
        )
        return None
    for key, item in value.items():
        if item is None and nullable:
            continue
        if not isinstance(item, str):
            msg = "Input should be a valid string"
            errors.append(_detail("string_type", ["body", name, key], msg, item))
    return value


def _timeout(value: object, minimum: int, errors: list[dict[str, object]]) -> int | None:
    """pydantic's lax int: an int, an integral float or a string of digits; at least minimum."""
    if value is None:
        return None
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif (isinstance(value, float) and value.is_integer()) or (
        isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value)
    ):
        number = int(value)
    if number is None:
        msg = "Input should be a valid integer"
        errors.append(_detail("int_type", ["body", "timeout"], msg, value))
        return None
    if number < minimum:
        msg = f"Input should be greater than or equal to {minimum}"
        detail = _detail("greater_than_equal", ["body", "timeout"], msg, value)
        detail["ctx"] = {"ge": minimum}
        errors.append(detail)
        return None
    return number


def _parse_create(body: object, min_timeout_s: int) -> _CreateRequest:
    """The checks of CreateSandboxRequest (schema.py) and of create_sandbox, in their order."""
    if not isinstance(body, dict):
        msg = "Input should be a valid dictionary or object to extract fields from"
        raise _unprocessable([_detail("model_attributes_type", ["body"], msg, body)])
    errors: list[dict[str, object]] = []
    uri = ""
    auth: dict[str, str] | None = None
    image = body.get("image")
    if image is not None:
        if not isinstance(image, dict):
            msg = "Input should be a valid dictionary or object to extract fields from"
            errors.append(_detail("model_attributes_type", ["body", "image"], msg, image))
        elif "uri" not in image:
            errors.append(_detail("missing", ["body", "image", "uri"], "Field required", image))
        elif not isinstance(image["uri"], str):
            msg = "Input should be a valid string"
            errors.append(_detail("string_type", ["body", "image", "uri"], msg, image["uri"]))
        else:
            uri = image["uri"]
            if isinstance(image.get("auth"), dict):
                auth = {
                    k: str(v) for k, v in image["auth"].items() if k in ("username", "password")
                }
    snapshot = body.get("snapshotId")
    if snapshot is not None and not isinstance(snapshot, str):
        msg = "Input should be a valid string"
        errors.append(_detail("string_type", ["body", "snapshotId"], msg, snapshot))
    timeout = _timeout(body.get("timeout"), min_timeout_s, errors)
    limits = _string_map(body, "resourceLimits", errors)
    env = _string_map(body, "env", errors, nullable=True)
    metadata = _string_map(body, "metadata", errors)
    extensions = _string_map(body, "extensions", errors)
    entrypoint = body.get("entrypoint")
    if entrypoint is not None:
        if not isinstance(entrypoint, list):
            msg = "Input should be a valid list"
            errors.append(_detail("list_type", ["body", "entrypoint"], msg, entrypoint))
        elif not entrypoint:
            msg = "List should have at least 1 item after validation, not 0"
            errors.append(_detail("too_short", ["body", "entrypoint"], msg, entrypoint))
        else:
            for index, item in enumerate(entrypoint):
                if not isinstance(item, str):
                    msg = "Input should be a valid string"
                    errors.append(_detail("string_type", ["body", "entrypoint", index], msg, item))
    if errors:
        raise _unprocessable(errors)

    pool_ref = str((extensions or {}).get("poolRef") or "").strip()
    if pool_ref:
        raise _error(
            400,
            "SANDBOX::UNSUPPORTED_POOL_REF",
            "poolRef is not supported by the Docker provider. "
            "Use Kubernetes BatchSandbox provider instead.",
        )
    has_image = bool(uri.strip())
    has_snapshot = bool((snapshot or "").strip())
    for broken, message in (
        (has_image == has_snapshot, "Exactly one of image or snapshotId must be provided."),
        (has_image and not entrypoint, "Entrypoint is required when image is provided."),
        (limits is None, "resourceLimits is required when poolRef is not provided."),
    ):
        if broken:
            detail = _detail("value_error", ["body"], f"Value error, {message}", body)
            detail["ctx"] = {"error": {}}
            raise _unprocessable([detail])
    if has_snapshot:
        raise _error(
            400, "SANDBOX::API_NOT_SUPPORTED", "snapshotId is not supported by this server."
        )
    _check_metadata(metadata)
    if body.get("platform") is not None:
        raise _error(400, "SANDBOX::INVALID_PARAMETER", "platform is not supported by this server.")
    if body.get("secureAccess"):
        raise _error(
            400,
            "SANDBOX::INVALID_PARAMETER",
            "secureAccess is only supported by the Kubernetes runtime with gateway ingress.",
        )
    if body.get("networkPolicy"):
        raise _error(
            400,
            "SANDBOX::INVALID_PARAMETER",
            "egress.image must be configured when networkPolicy is provided.",
        )
    if body.get("volumes"):
        raise _error(
            400, "VOLUME::UNSUPPORTED_BACKEND", "volumes are not supported by this server."
        )
    assert isinstance(entrypoint, list)
    return _CreateRequest(
        image_uri=uri,
        image_auth=auth,
        entrypoint=[str(item) for item in entrypoint],
        timeout=timeout,
        resource_limits=dict(limits or {}),
        env=dict(env or {}),
        metadata=None if metadata is None else dict(metadata),
    )


_DNS_SUBDOMAIN = re.compile(r"^(?:[a-z0-9]([-a-z0-9]*[a-z0-9])?\.)*[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


def _valid_label_key(key: str) -> bool:
    name = key
    if "/" in key:
        prefix, name = key.split("/", 1)
        if not prefix or not name or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix):
            return False
    return len(name) <= 63 and bool(_LABEL_NAME.match(name))


def _check_metadata(metadata: dict[str, str] | None) -> None:
    """Kubernetes label syntax for keys and values; the opensandbox.io/ prefix is reserved."""
    code = "SANDBOX::INVALID_METADATA_LABEL"
    for key, value in (metadata or {}).items():
        if key.startswith(RESERVED_PREFIX):
            raise _error(
                400,
                code,
                f"Metadata key '{key}' uses the reserved prefix '{RESERVED_PREFIX}'. Keys under "
                "this prefix are managed by the system and cannot be set via metadata.",
            )
        if not _valid_label_key(key):
            raise _error(400, code, f"Metadata key '{key}' is invalid.")
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            raise _error(400, code, f"Metadata value '{value}' is invalid.")


_MEMORY = re.compile(r"^\s*(\d+)([kmgti]i?|[kmgti]?b)?\s*$", re.IGNORECASE)
_MEMORY_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "ki": 2**10, "m": 10**6, "mb": 10**6}
_MEMORY_UNITS |= {"mi": 2**20, "g": 10**9, "gb": 10**9, "gi": 2**30, "t": 10**12}
_MEMORY_UNITS |= {"tb": 10**12, "ti": 2**40}


def _memory_bytes(value: str | None) -> int | None:
    """Memory ("512Mi", "1Gi", "1000M") as bytes; what does not parse is ignored."""
    match = _MEMORY.match(value or "")
    if not match:
        return None
    return int(match[1]) * _MEMORY_UNITS[(match[2] or "").lower()]


def _nano_cpus(value: str | None) -> int | None:
    """CPUs as nano CPUs ("500m" → 5e8, "2" → 2e9); what does not parse is ignored."""
    text = (value or "").strip().lower()
    if not text:
        return None
    try:
        cpus = float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    except ValueError:
        return None
    return int(cpus * 1_000_000_000) if cpus > 0 else None


def _names_a_registry(uri: str) -> bool:
    """Whether the image reference starts with a registry host (has "." or ":", or is
    localhost), as Docker reads references."""
    first, slash, _ = uri.partition("/")
    return bool(slash) and ("." in first or ":" in first or first == "localhost")


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

    def __init__(self, handler: _Handler) -> None:
        self._handler = handler
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


class _ChunkReader(io.RawIOBase):
    """A readable file over an iterator of byte chunks (the engine's archive stream)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._chunk = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._chunk:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._chunk = memoryview(chunk)
        size = min(len(buffer), len(self._chunk))
        buffer[:size] = self._chunk[:size]
        self._chunk = self._chunk[size:]
        return size


# ---------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Probe:
    """What execd knows of its own process, found by asking the container once."""

    shell: str  # full path of bash, else of sh (execd's getShell, through PATH)
    home: str
    uid: int
    notes_signals: bool  # NOTING_WRAPPER works here (else PLAIN_WRAPPER)


@dataclass
class _Sandbox:
    id: str
    container_id: str
    env: dict[str, str]  # the container's Config.Env: what execd inherits
    workdir: str
    probe: _Probe | None = None


@dataclass
class _Command:
    """execd's commandKernel: the status a command id answers with."""

    id: str
    content: str
    background: bool
    started_at: datetime
    output_path: str = ""
    pid: int = 0
    pid_known: threading.Event = field(default_factory=threading.Event)
    running: bool = True
    exit_code: int | None = None
    error: str = ""
    finished_at: datetime | None = None
    #: Set when the fake signalled the group (timeout, interrupt): 128+n then means -1.
    signalled: bool = False

    def set_pid(self, pid: int) -> None:
        self.pid = pid
        self.pid_known.set()

    def finish(self, code: int, signal: int = 0, core: bool = False) -> None:
        """Records the exit as Go reports it: -1 and "signal: …" for a death by signal."""
        if not signal and self.signalled and code in (128 + SIGKILL, 128 + SIGTERM):
            signal = code - 128  # no note from the wrapper: the fake's own signal, surely
        if signal:
            self.exit_code = -1
            name = GO_SIGNALS.get(signal, f"signal {signal}")
            self.error = f"signal: {name}" + (" (core dumped)" if core else "")
        else:
            self.exit_code = code
            self.error = f"exit status {code}" if code else ""
        self.finished_at = _now()
        self.running = False

    def status(self) -> dict[str, object]:
        answer: dict[str, object] = {"id": self.id, "content": self.content}
        answer["running"] = self.running
        if self.exit_code is not None:
            answer["exit_code"] = self.exit_code
        if self.error:
            answer["error"] = self.error
        answer["started_at"] = _go_time(self.started_at)
        if self.finished_at is not None:
            answer["finished_at"] = _go_time(self.finished_at)
        return answer


@dataclass(frozen=True)
class _RunRequest:
    command: str
    cwd: str
    background: bool
    timeout_ms: int
    uid: int | None
    gid: int | None
    envs: dict[str, str]


def _invalid_body(message: str) -> _HttpError:
    return _error(400, "INVALID_REQUEST_BODY", message)


def _parse_run(body: bytes) -> _RunRequest:
    """RunCommandRequest as Go's JSON binding and validator read it."""
    try:
        data = json.loads(body or b"null")
    except ValueError as error:
        raise _invalid_body(f"error parsing request, MAYBE invalid body format. {error}") from None
    if not isinstance(data, dict):
        raise _invalid_body("error parsing request, MAYBE invalid body format. not an object")

    def field_of(name: str, kind: type, default: Any) -> Any:
        value = data.get(name)
        if value is None:
            return default
        if (kind is int and (isinstance(value, bool) or not isinstance(value, int))) or (
            kind is not int and not isinstance(value, kind)
        ):
            value = None
        if value is None:
            raise _invalid_body(
                f"error parsing request, MAYBE invalid body format. field {name} has a wrong type"
            )
        return value

    command = field_of("command", str, "")
    cwd = field_of("cwd", str, "")
    background = field_of("background", bool, False)
    timeout_ms = field_of("timeout", int, 0)
    uid = field_of("uid", int, None)
    gid = field_of("gid", int, None)
    envs = field_of("envs", dict, {})
    for name, value in (("uid", uid), ("gid", gid)):
        if value is not None and not 0 <= value < 2**32:
            raise _invalid_body(f"error parsing request, MAYBE invalid body format. bad {name}")
    if not all(isinstance(value, str) for value in envs.values()):
        raise _invalid_body("error parsing request, MAYBE invalid body format. envs")
    if not command:
        raise _invalid_body(
            "invalid request, validation error Key: 'RunCommandRequest.Command' Error:Field "
            "validation for 'Command' failed on the 'required' tag"
        )
    if timeout_ms < 0:
        raise _invalid_body(
            "invalid request, validation error Key: 'RunCommandRequest.TimeoutMs' Error:Field "
            "validation for 'TimeoutMs' failed on the 'gte' tag"
        )
    if gid is not None and uid is None:
        raise _invalid_body(
            "invalid request, validation error uid is required when gid is provided"
        )
    return _RunRequest(command, cwd, background, timeout_ms, uid, gid, dict(envs))


_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def _expand(path: str, env: dict[str, str], home: str) -> str:
    """execd's ExpandPathWithEnv: $VAR and ${VAR} (an undefined one is an error), then ~."""
    missing = sorted(
        {m[1] or m[2] for m in _ENV_REFERENCE.finditer(path) if (m[1] or m[2]) not in env}
    )
    if missing:
        raise ValueError(f"path references undefined environment variables: {','.join(missing)}")
    expanded = _ENV_REFERENCE.sub(lambda m: env[m[1] or m[2]], path)
    if expanded == "~":
        return home
    if expanded.startswith("~/"):
        return posixpath.normpath(posixpath.join(home, expanded[2:]))
    return expanded


def _absolute(path: str, workdir: str) -> str:
    """filepath.Abs relative to execd's working directory, cleaned."""
    joined = posixpath.normpath(posixpath.join(workdir or "/", path))
    return "/" + joined.lstrip("/")


def _octal_mode(mode: int) -> int:
    """The upload's mode: decimal digits read as octal (755 → 0o755); Go keeps only the
    permission bits. Digits 8 or 9, or a sign, raise ValueError."""
    text = str(mode)
    if not re.fullmatch(r"[0-7]+", text):
        raise ValueError(f'strconv.ParseUint: parsing "{text}": invalid syntax')
    return int(text, 8) & 0o777


def _next(chunks: queue.Queue[tuple[bytes, bytes] | None], wait_s: float) -> Any:
    """The next item of a queue, or None when none comes within wait_s."""
    try:
        return chunks.get(timeout=wait_s)
    except queue.Empty:
        return None


class _Execution:
    """One command's docker exec, read through its raw socket (the engine's multiplexed
    stdout/stderr frames), which the fake closes once the process has ended."""

    def __init__(self, exec_id: str, sock: Any) -> None:
        self.exec_id = exec_id
        self._socket = sock
        # The one place that reaches under docker's socket object: exec_start(socket=True)
        # gives a SocketIO over a unix socket, or the socket itself (TLS).
        self._raw = getattr(sock, "_sock", sock)
        self._raw.settimeout(None)  # a silent command is not a dead connection

    def frames(self) -> Iterator[tuple[int, bytes]]:
        frames: Iterator[tuple[int, bytes]] = docker.utils.socket.frames_iter(
            self._socket, tty=False
        )
        return frames

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._raw.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._raw.close()


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


_PROXY_PATH = re.compile(r"^(?:/v1)?/sandboxes/([^/]+)/proxy/(\d+)(/.*)?$")
_SANDBOXES = re.compile(r"^(?:/v1)?/sandboxes$")
_SANDBOX = re.compile(r"^(?:/v1)?/sandboxes/([^/]+)$")
_RENEW = re.compile(r"^(?:/v1)?/sandboxes/([^/]+)/renew-expiration$")
_PAUSE = re.compile(r"^(?:/v1)?/sandboxes/([^/]+)/pause$")
_RESUME = re.compile(r"^(?:/v1)?/sandboxes/([^/]+)/resume$")
_ENDPOINT = re.compile(r"^(?:/v1)?/sandboxes/([^/]+)/endpoints/([^/]+)$")
_COMMAND_STATUS = re.compile(r"^/command/status/([^/]+)$")
_COMMAND_LOGS = re.compile(r"^/command/([^/]+)/logs$")

#: What execd would know of itself, asked as the container's user: the shell it runs
#: commands with, its HOME, its uid; and whether NOTING_WRAPPER's setsid is there.
_PROBE_SCRIPT = """\
command -v bash || command -v sh
printf '%s\\n' "$HOME"
id -u || echo 0
command -v setsid >/dev/null && echo setsid
"""
#: One line per path: "-" when missing, else mode (hex), size, mtime, ctime, uid, gid.
_INFO_SCRIPT = """\
for p in "$@"; do
  if [ -e "$p" ] || [ -L "$p" ]; then stat -c '%f|%s|%y|%z|%u|%g' -- "$p" || echo '?'
  else echo '-'; fi
done
echo '=== passwd'; cat /etc/passwd 2>/dev/null; echo '=== group'; cat /etc/group 2>/dev/null
"""
#: Creates the parent ($1) and tells what the target ($2) is: "dir", "new", or
#: "old MODE UID GID" for a file (through a symlink); then /etc/passwd and /etc/group.
_UPLOAD_SCRIPT = """\
mkdir -p -- "$1" 2>&1 || { echo 'mkdir-failed'; exit 0; }
if [ -d "$2" ]; then echo dir
elif [ -e "$2" ]; then stat -L -c 'old %f %u %g' -- "$2"; readlink -f -- "$2"
else echo new; fi
echo '=== passwd'; cat /etc/passwd 2>/dev/null; echo '=== group'; cat /etc/group 2>/dev/null
"""


class FakeOpenSandbox:
    """An OpenSandbox server (Docker runtime, bridge network, server-proxied execd) on
    127.0.0.1, serving from a thread of its own between start() and stop().

    `min_timeout_s` is the smallest `timeout` create accepts: 60 on the real server; a
    test lowers it to see expiry happen without waiting a minute."""

    def __init__(
        self,
        client: docker.DockerClient,
        *,
        api_key: str = "test-key",
        grace_s: float = 1.0,
        min_timeout_s: int = 60,
    ) -> None:
        self.domain = ""
        self.requests: list[tuple[str, str]] = []
        self._client = client
        self._api_key = api_key
        self._grace_s = grace_s
        self._min_timeout_s = min_timeout_s
        self._instance = uuid.uuid4().hex[:12]
        self._lock = threading.Lock()
        self._sandboxes: dict[str, _Sandbox] = {}
        self._commands: dict[str, _Command] = {}
        self._expirations: dict[str, datetime] = {}
        self._timers: dict[str, threading.Timer] = {}
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- life of the fake ----------------------------------------------------------------

    def start(self) -> None:
        """Serves on a free port of 127.0.0.1 from a background thread."""

        class Handler(_Handler):
            pass

        Handler.fake = self
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.domain = f"127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stops serving, cancels the expiry timers and removes every container it made."""
        with self._lock:
            timers = list(self._timers.values())
            self._timers.clear()
        for timer in timers:
            timer.cancel()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        for container in self.sandbox_containers():
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                container.remove(force=True)
        self._sandboxes.clear()

    def sandbox_containers(self) -> list[Container]:
        """The containers this fake made that still exist."""
        label = f"{INSTANCE_LABEL}={self._instance}"
        containers: list[Container] = self._client.containers.list(
            all=True, filters={"label": label}
        )
        return containers

    # -- routing ---------------------------------------------------------------------------

    def _serve(self, handler: _Handler, body: bytes) -> None:
        url = urlsplit(handler.path)
        path = unquote(url.path)
        query = parse_qsl(url.query, keep_blank_values=True)
        method = handler.command
        self.requests.append((method, path))
        proxy = _PROXY_PATH.match(path)
        # The proxy route is exempt from the API key (middleware/auth.py), unless it tries "..".
        if proxy and ".." not in path:
            self._serve_execd(handler, proxy[1], int(proxy[2]), proxy[3] or "/", query, body)
            return
        if path.startswith("/health"):
            if path == "/health" and method == "GET":
                handler.reply(200, b'{"status":"healthy"}')
            else:
                handler.reply(404, b'{"detail":"Not Found"}')
            return
        request_id = {"X-Request-ID": uuid.uuid4().hex}
        try:
            self._check_api_key(handler)
            status, answer = self._route_lifecycle(method, path, query, body)
        except _HttpError as error:
            payload = error.body if isinstance(error.body, dict) else {"detail": error.body}
            handler.reply(error.status, _starlette_json(payload), headers=request_id)
            return
        encoded = b"" if answer is None else _starlette_json(answer)
        handler.reply(status, encoded, headers=request_id)

    def _check_api_key(self, handler: _Handler) -> None:
        given = handler.headers.get(API_KEY_HEADER)
        if not given:
            raise _error(
                401,
                "MISSING_API_KEY",
                "Authentication credentials are missing. "
                f"Provide API key via {API_KEY_HEADER} header.",
            )
        if given != self._api_key:
            raise _error(
                401,
                "INVALID_API_KEY",
                "Authentication credentials are invalid. Check your API key and try again.",
            )

    def _route_lifecycle(
        self, method: str, path: str, query: list[tuple[str, str]], body: bytes
    ) -> tuple[int, object]:
        routes: list[tuple[re.Pattern[str], dict[str, Callable[..., tuple[int, object]]]]] = [
            (_SANDBOXES, {"POST": self._create, "GET": self._list}),
            (_SANDBOX, {"GET": self._get, "DELETE": self._delete}),
            (_RENEW, {"POST": self._renew}),
            (_PAUSE, {"POST": self._pause}),
            (_RESUME, {"POST": self._resume}),
            (_ENDPOINT, {"GET": self._endpoint}),
        ]
        for pattern, methods in routes:
            match = pattern.match(path)
            if match is None:
                continue
            if method not in methods:
                raise _HttpError(405, "Method Not Allowed")
            return methods[method](*match.groups(), query=query, body=body)
        raise _HttpError(404, "Not Found")

    # -- lifecycle -------------------------------------------------------------------------

    def _create(self, *, query: list[tuple[str, str]], body: bytes) -> tuple[int, object]:
        if not body.strip():
            raise _unprocessable([_detail("missing", ["body"], "Field required", None)])
        try:
            data = json.loads(body)
        except ValueError as error:
            detail = _detail("json_invalid", ["body", 0], "JSON decode error", {})
            detail["ctx"] = {"error": str(error)}
            raise _unprocessable([detail]) from None
        request = _parse_create(data, self._min_timeout_s)
        sandbox_id = str(uuid.uuid4())
        created_at = _now()
        expires_at = None
        if request.timeout is not None:
            expires_at = created_at + timedelta(seconds=request.timeout)
        labels = dict(request.metadata or {})
        labels[ID_LABEL] = sandbox_id
        if expires_at is None:
            labels[MANUAL_LABEL] = "true"
        else:
            labels[EXPIRES_LABEL] = expires_at.isoformat()
        labels[INSTANCE_LABEL] = self._instance
        if RUN_LABEL not in labels:
            labels[RUN_LABEL] = f"opensandbox-fake-{self._instance}"
            labels[ADDED_RUN_LABEL] = "true"
        self._ensure_image(request.image_uri, request.image_auth)
        options: dict[str, Any] = {}
        mem_limit = _memory_bytes(request.resource_limits.get("memory"))
        if mem_limit:
            options["mem_limit"] = mem_limit
        nano_cpus = _nano_cpus(request.resource_limits.get("cpu"))
        if nano_cpus:
            options["nano_cpus"] = nano_cpus
        container = None
        try:
            container = self._client.containers.create(
                image=request.image_uri,
                entrypoint=["/bin/sh", "-c", BOOTSTRAP, "bootstrap"],
                command=request.entrypoint,
                name=f"sandbox-{sandbox_id}",
                environment=[f"{k}={v}" for k, v in request.env.items() if v is not None],
                labels=labels,
                security_opt=["no-new-privileges:true"],
                cap_drop=CAP_DROP,
                pids_limit=PIDS_LIMIT,
                network_mode="bridge",
                **options,
            )
            container.start()
            container.reload()
        except docker.errors.DockerException as error:
            if container is not None:
                with contextlib.suppress(docker.errors.DockerException):
                    container.remove(force=True)
            raise _error(
                500, "DOCKER::SANDBOX_START_FAILED", f"Failed to start sandbox container: {error}"
            ) from None
        config = container.attrs.get("Config") or {}
        env = dict(item.split("=", 1) for item in config.get("Env") or [] if "=" in item)
        self._sandboxes[sandbox_id] = _Sandbox(
            sandbox_id, container.id, env, config.get("WorkingDir") or "/"
        )
        if expires_at is not None:
            self._schedule_expiry(sandbox_id, expires_at)
        answer: dict[str, object] = {
            "id": sandbox_id,
            "status": {
                "state": "Running",
                "reason": "CONTAINER_RUNNING",
                "message": "Sandbox container started successfully.",
                "lastTransitionAt": _pydantic_time(created_at),
            },
        }
        if request.metadata is not None:
            answer["metadata"] = request.metadata
        if expires_at is not None:
            answer["expiresAt"] = _pydantic_time(expires_at)
        answer["createdAt"] = _pydantic_time(created_at)
        answer["entrypoint"] = request.entrypoint
        return 202, answer

    def _ensure_image(self, uri: str, auth: dict[str, str] | None) -> None:
        """A registry reference is always pulled (the pull proves the registry has it); any
        other must be local, since this machine has no way to the internet."""
        try:
            if _names_a_registry(uri):
                self._client.images.pull(uri, auth_config=auth)
            else:
                self._client.images.get(uri)
        except docker.errors.DockerException as error:
            raise _error(
                500, "DOCKER::SANDBOX_IMAGE_PULL_FAILED", f"Failed to pull image {uri}: {error}"
            ) from None

    def _container(self, sandbox_id: str) -> Container:
        """The sandbox's container; 404 when it is gone or was never this fake's."""
        try:
            found = self._client.containers.list(
                all=True,
                filters={
                    "label": [f"{ID_LABEL}={sandbox_id}", f"{INSTANCE_LABEL}={self._instance}"]
                },
            )
        except docker.errors.DockerException as error:
            raise _error(
                500, "DOCKER::SANDBOX_QUERY_FAILED", f"Failed to query sandbox containers: {error}"
            ) from None
        if not found:
            raise _not_found(sandbox_id)
        return found[0]

    def _describe(self, container: Container) -> dict[str, object]:
        """The Sandbox model of a container (docker_service.py's _container_to_sandbox)."""
        attrs = container.attrs
        config = attrs.get("Config") or {}
        labels: dict[str, str] = config.get("Labels") or {}
        sandbox_id = labels[ID_LABEL]
        state = attrs.get("State") or {}
        status_value = (state.get("Status") or "").lower()
        exit_code = state.get("ExitCode")
        if state.get("Running") and not state.get("Paused"):
            phase = ("Running", "CONTAINER_RUNNING", "Sandbox container is running.")
        elif state.get("Paused"):
            phase = ("Paused", "CONTAINER_PAUSED", "Sandbox container is paused.")
        elif state.get("Restarting"):
            phase = ("Running", "CONTAINER_RESTARTING", "Sandbox container is restarting.")
        elif status_value in ("created", "starting"):
            phase = ("Pending", "CONTAINER_STARTING", "Sandbox container is starting.")
        elif status_value in ("exited", "dead") and exit_code == 0:
            phase = ("Terminated", "CONTAINER_EXITED", "Sandbox container exited successfully.")
        elif status_value in ("exited", "dead"):
            message = f"Sandbox container exited with code {exit_code}."
            phase = ("Failed", "CONTAINER_EXITED_ERROR", message)
        else:
            message = f"Sandbox container is in state '{status_value or 'unknown'}'."
            phase = ("Unknown", "CONTAINER_STATE_UNKNOWN", message)
        created_at = _docker_time(attrs.get("Created"))
        finished = state.get("FinishedAt")
        changed_at = (
            _docker_time(finished)
            if finished and finished != "0001-01-01T00:00:00Z"
            else created_at
        )
        try:
            tags = self._client.images.get(attrs["Image"]).tags
        except docker.errors.DockerException:
            tags = []
        image_id = str(attrs.get("Image") or "")
        uri = (
            tags[0] if tags else image_id[:17] if image_id.startswith("sha256:") else image_id[:10]
        )
        hide_run = labels.get(ADDED_RUN_LABEL) == "true"
        metadata = {
            key: value
            for key, value in labels.items()
            if not key.startswith(HIDDEN_PREFIXES) and not (hide_run and key == RUN_LABEL)
        }
        answer: dict[str, object] = {
            "id": sandbox_id,
            "image": {"uri": uri},
            "status": {
                "state": phase[0],
                "reason": phase[1],
                "message": phase[2],
                "lastTransitionAt": _pydantic_time(changed_at),
            },
            "metadata": metadata,
            "entrypoint": config.get("Cmd") or [],
        }
        expires_at = self._expiry_of(sandbox_id, labels)
        if expires_at is not None:
            answer["expiresAt"] = _pydantic_time(expires_at)
        answer["createdAt"] = _pydantic_time(created_at)
        return answer

    def _expiry_of(self, sandbox_id: str, labels: dict[str, str]) -> datetime | None:
        tracked = self._expirations.get(sandbox_id)
        if tracked is not None:
            return tracked
        if MANUAL_LABEL in labels or EXPIRES_LABEL not in labels:
            return None
        try:
            return datetime.fromisoformat(labels[EXPIRES_LABEL]).astimezone(UTC)
        except ValueError:
            return None

    def _get(self, sandbox_id: str, **_: object) -> tuple[int, object]:
        return 200, self._describe(self._container(sandbox_id))

    def _list(self, *, query: list[tuple[str, str]], body: bytes) -> tuple[int, object]:
        states = {value.lower() for key, value in query if key == "state"}
        values = dict(query)  # the framework keeps the last of a repeated scalar parameter
        wanted: dict[str, str] = {}
        if values.get("metadata"):
            try:
                pairs = parse_qsl(values["metadata"], keep_blank_values=True, strict_parsing=True)
            except ValueError as error:
                raise _error(
                    400, "INVALID_METADATA_FORMAT", f"Invalid metadata format: {error}"
                ) from None
            wanted = dict(pairs)
        page = _query_int(values, "page", 1, 1, None)
        page_size = _query_int(values, "pageSize", 20, 1, 200)
        items = []
        for container in self.sandbox_containers():
            described = self._describe(container)
            status = described["status"]
            assert isinstance(status, dict)
            if states and str(status["state"]).lower() not in states:
                continue
            metadata = described["metadata"]
            assert isinstance(metadata, dict)
            if any(metadata.get(key) != value for key, value in wanted.items()):
                continue
            items.append(described)
        items.sort(key=lambda item: datetime.fromisoformat(str(item["createdAt"])), reverse=True)
        total = len(items)
        pages = -(-total // page_size)
        start = (page - 1) * page_size
        pagination = {
            "page": page,
            "pageSize": page_size,
            "totalItems": total,
            "totalPages": pages,
            "hasNextPage": page < pages,
        }
        return 200, {"items": items[start : start + page_size], "pagination": pagination}

    def _delete(self, sandbox_id: str, **_: object) -> tuple[int, object]:
        container = self._container(sandbox_id)
        self._forget(sandbox_id)
        try:
            with contextlib.suppress(docker.errors.APIError):
                container.kill()
            container.remove(force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.DockerException as error:
            raise _error(
                500, "DOCKER::SANDBOX_DELETE_FAILED", f"Failed to delete sandbox: {error}"
            ) from None
        return 204, None

    def _renew(self, sandbox_id: str, *, body: bytes, **_: object) -> tuple[int, object]:
        container = self._container(sandbox_id)
        try:
            data = json.loads(body)
        except ValueError as error:
            detail = _detail("json_invalid", ["body", 0], "JSON decode error", {})
            detail["ctx"] = {"error": str(error)}
            raise _unprocessable([detail]) from None
        value = data.get("expiresAt") if isinstance(data, dict) else None
        if value is None:
            raise _unprocessable(
                [_detail("missing", ["body", "expiresAt"], "Field required", data)]
            )
        try:
            if not isinstance(value, str):
                raise ValueError(value)
            moment = datetime.fromisoformat(value)
        except ValueError:
            msg = "Input should be a valid datetime"
            raise _unprocessable(
                [_detail("datetime_from_date_parsing", ["body", "expiresAt"], msg, value)]
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        moment = moment.astimezone(UTC)
        if moment <= _now():
            raise _error(
                400, "DOCKER::INVALID_EXPIRATION", "New expiration time must be in the future."
            )
        labels = (container.attrs.get("Config") or {}).get("Labels") or {}
        if labels.get(MANUAL_LABEL) == "true":
            raise _error(
                409,
                "DOCKER::INVALID_EXPIRATION",
                f"Sandbox {sandbox_id} does not have automatic expiration enabled.",
            )
        if self._expiry_of(sandbox_id, labels) is None:
            raise _error(
                409,
                "DOCKER::INVALID_EXPIRATION",
                f"Sandbox {sandbox_id} is missing expiration metadata and cannot be renewed "
                "safely.",
            )
        # Like the real server, the new time lives in memory only: the label keeps the first.
        self._schedule_expiry(sandbox_id, moment)
        return 200, {"expiresAt": _pydantic_time(moment)}

    def _pause(self, sandbox_id: str, **_: object) -> tuple[int, object]:
        """docker pause, synchronous; 202 with no body."""
        container = self._container(sandbox_id)
        if container.status != "running":
            message = f"Sandbox {sandbox_id} is not running (state: {container.status})."
            raise _error(409, "DOCKER::SANDBOX_NOT_RUNNING", message)
        try:
            container.pause()
        except docker.errors.DockerException as error:
            message = f"Failed to pause sandbox: {error}"
            raise _error(500, "DOCKER::SANDBOX_PAUSE_FAILED", message) from None
        return 202, None

    def _resume(self, sandbox_id: str, **_: object) -> tuple[int, object]:
        """docker unpause, synchronous; 202 with no body."""
        container = self._container(sandbox_id)
        if container.status != "paused":
            message = f"Sandbox {sandbox_id} is not paused (state: {container.status})."
            raise _error(409, "DOCKER::SANDBOX_NOT_PAUSED", message)
        try:
            container.unpause()
        except docker.errors.DockerException as error:
            message = f"Failed to resume sandbox: {error}"
            raise _error(500, "DOCKER::SANDBOX_RESUME_FAILED", message) from None
        return 202, None

    def _endpoint(
        self, sandbox_id: str, port_text: str, *, query: list[tuple[str, str]], **_: object
    ) -> tuple[int, object]:
        try:
            port = int(port_text)
        except ValueError:
            msg = "Input should be a valid integer, unable to parse string as an integer"
            raise _unprocessable(
                [_detail("int_parsing", ["path", "port"], msg, port_text)]
            ) from None
        if any(key == "expires" for key, _ in query):
            raise _error(
                400,
                "SANDBOX::API_NOT_SUPPORTED",
                "Signed routes (expires parameter) are not supported when runtime.type='docker'.",
            )
        if not 1 <= port <= 65535:
            raise _error(400, "DOCKER::INVALID_PORT", "Port must be between 1 and 65535.")
        self._container(sandbox_id)
        return 200, {"endpoint": f"{self.domain}/sandboxes/{sandbox_id}/proxy/{port}"}

    def _schedule_expiry(self, sandbox_id: str, moment: datetime) -> None:
        delay = max(0.0, (moment - _now()).total_seconds())
        timer = threading.Timer(delay, self._expire, (sandbox_id,))
        timer.daemon = True
        with self._lock:
            previous = self._timers.pop(sandbox_id, None)
            self._timers[sandbox_id] = timer
            self._expirations[sandbox_id] = moment
        if previous is not None:
            previous.cancel()
        timer.start()

    def _expire(self, sandbox_id: str) -> None:
        """The expiry timer's end: the container is killed and removed, as on delete."""
        with self._lock:
            if self._timers.get(sandbox_id) is not threading.current_thread():
                return
        self._forget(sandbox_id)
        with contextlib.suppress(docker.errors.DockerException):
            for container in self._client.containers.list(
                all=True,
                filters={
                    "label": [f"{ID_LABEL}={sandbox_id}", f"{INSTANCE_LABEL}={self._instance}"]
                },
            ):
                with contextlib.suppress(docker.errors.APIError):
                    container.kill()
                container.remove(force=True)

    def _forget(self, sandbox_id: str) -> None:
        with self._lock:
            timer = self._timers.pop(sandbox_id, None)
            self._expirations.pop(sandbox_id, None)
            self._sandboxes.pop(sandbox_id, None)
        if timer is not None and timer is not threading.current_thread():
            timer.cancel()

    # -- execd -----------------------------------------------------------------------------

    def _serve_execd(
        self,
        handler: _Handler,
        sandbox_id: str,
        port: int,
        rest: str,
        query: list[tuple[str, str]],
        body: bytes,
    ) -> None:
        sandbox = self._sandboxes.get(sandbox_id)
        try:
            container = self._client.containers.get(sandbox.container_id) if sandbox else None
        except docker.errors.NotFound:
            container = None
        if sandbox is None or container is None:
            raise _not_found(sandbox_id)
        if port != EXECD_PORT or container.status != "running":
            address = (container.attrs.get("NetworkSettings") or {}).get("IPAddress") or ""
            raise _error(
                502,
                "GENERAL::UNKNOWN_ERROR",
                f"Could not connect to the backend sandbox {address}:{port}: "
                "All connection attempts failed",
            )
        token = sandbox.env.get(EXECD_TOKEN_ENV, "")
        if token and handler.headers.get(EXECD_TOKEN_HEADER) != token:
            message = f"Unauthorized: invalid or missing header {EXECD_TOKEN_HEADER}"
            handler.reply(401, _go_json({"error": message}), GO_JSON)
            return
        method = handler.command
        try:
            self._route_execd(handler, sandbox, method, rest, query, body)
        except _SandboxGone:
            # The container went away under the request: execd died with it.
            handler.close_connection = True
            if not handler.answered:
                message = f"Could not connect to the backend sandbox {sandbox_id}"
                handler.reply(
                    502, _starlette_json({"code": "GENERAL::UNKNOWN_ERROR", "message": message})
                )
        except _HttpError as error:
            if handler.answered:
                raise
            if isinstance(error.body, str):
                handler.reply(error.status, error.body.encode(), "text/plain; charset=utf-8")
            else:
                handler.reply(error.status, _go_json(error.body), GO_JSON)

    def _route_execd(
        self,
        handler: _Handler,
        sandbox: _Sandbox,
        method: str,
        path: str,
        query: list[tuple[str, str]],
        body: bytes,
    ) -> None:
        simple: dict[tuple[str, str], Callable[[], bytes | None]] = {
            ("GET", "/ping"): lambda: None,
            ("DELETE", "/command"): lambda: self._interrupt(sandbox, query),
            ("GET", "/files/info"): lambda: self._files_info(sandbox, query),
            ("DELETE", "/files"): lambda: self._delete_files(sandbox, query),
            ("POST", "/directories"): lambda: self._make_directories(sandbox, body),
            ("DELETE", "/directories"): lambda: self._delete_directories(sandbox, query),
            ("POST", "/files/upload"): lambda: self._upload(sandbox, handler, body),
        }
        if (method, path) in simple:
            answer = simple[method, path]()
            handler.reply(200, answer or b"", GO_JSON if answer else None)
            return
        status = _COMMAND_STATUS.match(path)
        logs = _COMMAND_LOGS.match(path)
        if (method, path) == ("POST", "/command"):
            self._run(handler, sandbox, body)
        elif (method, path) == ("GET", "/files/download"):
            self._download(handler, sandbox, query)
        elif method == "GET" and status:
            command = self._commands.get(status[1])
            if command is None:
                raise _invalid_body_404(status[1])
            handler.reply(200, _go_json(command.status()), GO_JSON)
        elif method == "GET" and logs:
            self._logs(handler, sandbox, logs[1], query)
        else:
            handler.reply(404, b"404 page not found", "text/plain")

    # -- execd: running things in the container ---------------------------------------------

    def _shell(
        self, sandbox: _Sandbox, script: str, *args: str, user: str = "0"
    ) -> tuple[int, bytes, bytes]:
        """Runs a /bin/sh script in the container (as root unless told), to its end."""
        api = self._client.api
        try:
            exec_id = api.exec_create(
                sandbox.container_id, ["/bin/sh", "-c", script, "sh", *args], user=user
            )["Id"]
            stdout, stderr = api.exec_start(exec_id, demux=True)
            code = api.exec_inspect(exec_id)["ExitCode"]
        except docker.errors.NotFound:
            raise _SandboxGone() from None
        except docker.errors.APIError as error:
            if error.status_code == 409 or "is not running" in str(error):
                raise _SandboxGone() from None
            raise
        return int(code or 0), stdout or b"", stderr or b""

    def _probe(self, sandbox: _Sandbox) -> _Probe:
        if sandbox.probe is None:
            _, out, _ = self._shell(sandbox, _PROBE_SCRIPT, user="")
            lines = [*out.decode(errors="replace").splitlines(), "", "", "", ""]
            uid = int(lines[2]) if lines[2].strip().isdigit() else 0
            shell, home = lines[0] or "/bin/sh", lines[1] or "/root"
            notes = shell.endswith("/bash") and lines[3] == "setsid"
            sandbox.probe = _Probe(shell, home, uid, notes)
        return sandbox.probe

    def _execd_env(self, sandbox: _Sandbox) -> dict[str, str]:
        """execd's own environment: the container's, with the HOME its process got and
        what bootstrap.sh exports."""
        home = self._probe(sandbox).home
        return {"EXECD_ENVS": EXECD_ENVS_FILE, **sandbox.env, "HOME": home}

    def _signal_group(self, sandbox: _Sandbox, command: _Command, signal: int) -> None:
        if not command.pid_known.wait(10) or not command.running:
            return
        command.signalled = True
        with contextlib.suppress(_SandboxGone, docker.errors.DockerException):
            self._shell(sandbox, f"kill -{signal} -{command.pid} 2>/dev/null")

    def _group_alive(self, sandbox: _Sandbox, pid: int) -> bool:
        try:
            code, _, _ = self._shell(sandbox, f"kill -0 -{pid} 2>/dev/null")
        except (_SandboxGone, docker.errors.DockerException):
            return False
        return code == 0

    def _pump(self, execution: _Execution, on_chunk: Callable[[bytes, bytes], None]) -> int:
        """Passes a command's output on until its process ends; returns the engine's exit
        code.

        The engine holds the stream open up to 2 s after the exit while children keep its
        pipes; execd reads files and stops at the exit, so the fake asks the engine whether
        the process still runs and then stops reading."""
        chunks: queue.Queue[tuple[bytes, bytes] | None] = queue.Queue()

        def read() -> None:
            try:
                for stream_id, data in execution.frames():
                    chunks.put((data, b"") if stream_id == 1 else (b"", data))
            except Exception:
                pass  # the socket closed under the reader: the fake is done with it
            finally:
                chunks.put(None)

        threading.Thread(target=read, daemon=True).start()
        try:
            check_at = time.monotonic() + EXIT_POLL_S
            while True:
                try:
                    item = chunks.get(timeout=EXIT_POLL_S)
                except queue.Empty:
                    item = (b"", b"")
                if item is None:
                    break
                on_chunk(*item)
                if time.monotonic() < check_at:
                    continue
                if not self._exec_state(execution.exec_id)[0]:
                    while (item := _next(chunks, 0.05)) is not None:
                        on_chunk(*item)  # what the engine still had in flight
                    break
                check_at = time.monotonic() + EXIT_POLL_S
            while True:
                running, code = self._exec_state(execution.exec_id)
                if not running:
                    return code
                time.sleep(EXIT_POLL_S)
        finally:
            execution.close()

    def _container_running(self, sandbox: _Sandbox) -> bool:
        try:
            return bool(self._client.containers.get(sandbox.container_id).status == "running")
        except docker.errors.NotFound:
            return False

    def _exec_state(self, exec_id: str) -> tuple[bool, int]:
        try:
            state = self._client.api.exec_inspect(exec_id)
        except docker.errors.NotFound:
            raise _SandboxGone() from None
        return bool(state["Running"]), int(state["ExitCode"] or 0)

    # -- execd: /command ---------------------------------------------------------------------

    def _run(self, handler: _Handler, sandbox: _Sandbox, body: bytes) -> None:
        request = _parse_run(body)
        probe = self._probe(sandbox)
        env = self._execd_env(sandbox)
        workdir = None
        if request.cwd:
            try:
                resolved = _expand(request.cwd, env, probe.home)
            except ValueError as error:
                message = f"cannot resolve working directory {request.cwd!r}: {error}"
                raise _invalid_body(f"invalid request, validation error {message}") from None
            workdir = _absolute(resolved, sandbox.workdir)
            _, out, _ = self._shell(
                sandbox, 'if [ -d "$1" ]; then echo d; elif [ -e "$1" ]; then echo f; fi', workdir
            )
            kind = out.strip()
            if kind != b"d":
                reason = (
                    f"working directory path is not a directory: {request.cwd}"
                    if kind
                    else f"working directory does not exist: {request.cwd}: "
                    f"stat {resolved}: no such file or directory"
                )
                raise _invalid_body(f"invalid request, validation error {reason}")
        user = ""
        if request.uid is not None:
            user = str(request.uid) if request.gid is None else f"{request.uid}:{request.gid}"
        command = _Command(uuid.uuid4().hex, request.command, request.background, _now())
        stream = _EventStream(handler)
        if request.uid is not None and probe.uid != 0:
            # execd is not root: setting a user's credentials fails at fork.
            failure = f"fork/exec {probe.shell}: operation not permitted"
            stream.send(_event("init", text=command.id))
            if request.background:
                message = f"error running commands failed to start commands: {failure}"
                stream.write(_go_json({"code": "RUNTIME_ERROR", "message": message}))
            else:
                stream.start_pings()
                stream.send(_event("error", error=_exec_error(failure, failure)))
            time.sleep(self._grace_s)
            stream.finish()
            return
        tmp = sandbox.env.get("TMPDIR") or "/tmp"
        if request.background:
            command.output_path = posixpath.join(tmp, f"{command.id}.output")
            stream.send(_event("init", text=command.id))  # execd: before the start
            stream.start_pings()
        mark = posixpath.join(tmp, f".opensandbox-fake-{command.id}.signal")
        wrapper = [probe.shell, "-c", NOTING_WRAPPER] if probe.notes_signals else PLAIN_WRAPPER
        argv = [*wrapper, request.command, probe.shell, command.output_path, mark]
        own = {"EXECD_ENVS": env["EXECD_ENVS"], "HOME": probe.home}
        environment = [f"{k}={v}" for k, v in {**own, **request.envs}.items()]
        started = time.monotonic()
        api = self._client.api
        try:
            exec_id = api.exec_create(
                sandbox.container_id,
                argv,
                user=user,
                workdir=workdir,
                environment=environment,
            )["Id"]
            execution = _Execution(exec_id, api.exec_start(exec_id, socket=True))
        except docker.errors.DockerException as error:
            if not request.background:
                stream.send(_event("init", text=command.id))
                stream.start_pings()
            stream.send(_event("error", error=_exec_error(str(error), str(error))))
            time.sleep(self._grace_s)
            stream.finish()
            return
        self._commands[command.id] = command
        if request.background:
            threading.Thread(
                target=self._follow,
                args=(sandbox, command, execution, request.timeout_ms, mark),
                daemon=True,
            ).start()
            elapsed = int((time.monotonic() - started) * 1000)
            stream.send(_event("execution_complete", execution_time=elapsed))
        else:
            stream.send(_event("init", text=command.id))
            stream.start_pings()
            try:
                self._run_foreground(sandbox, command, execution, request, stream, started, mark)
            except _SandboxGone:
                stream.abort()
                return
        if stream.open:
            time.sleep(self._grace_s)
        stream.finish()

    def _run_foreground(
        self,
        sandbox: _Sandbox,
        command: _Command,
        execution: _Execution,
        request: _RunRequest,
        stream: _EventStream,
        started: float,
        mark: str,
    ) -> None:
        stdout, stderr = _LineSplitter(), _LineSplitter()
        pid_line = _PidLine(command.set_pid)

        def on_chunk(out: bytes, err: bytes) -> None:
            for line in stdout.feed(out):
                stream.send(_event("stdout", text=line))
            for line in stderr.feed(pid_line.strip(err)):
                stream.send(_event("stderr", text=line))

        timer = self._timeout_timer(sandbox, command, request.timeout_ms)
        try:
            code = self._pump(execution, on_chunk)
            if not self._container_running(sandbox):
                raise _SandboxGone()  # killed with its container: execd died with it
            self._finish(sandbox, command, code, mark)
        except _SandboxGone:
            command.finish(-1, SIGKILL)
            raise
        finally:
            if timer is not None:
                timer.cancel()
        for line in stdout.flush():
            stream.send(_event("stdout", text=line))
        for line in stderr.flush():
            stream.send(_event("stderr", text=line))
        if command.exit_code:
            error = _exec_error(str(command.exit_code), command.error)
            stream.send(_event("error", error=error))
        else:
            elapsed = int((time.monotonic() - started) * 1000)
            stream.send(_event("execution_complete", execution_time=elapsed))

    def _follow(
        self,
        sandbox: _Sandbox,
        command: _Command,
        execution: _Execution,
        timeout_ms: int,
        mark: str,
    ) -> None:
        """Watches a background command to its end, for its status."""
        pid_line = _PidLine(command.set_pid)

        def on_chunk(out: bytes, err: bytes) -> None:
            pid_line.strip(err)  # the output itself goes to the command's file

        timer = self._timeout_timer(sandbox, command, timeout_ms)
        try:
            self._finish(sandbox, command, self._pump(execution, on_chunk), mark)
        except (_SandboxGone, docker.errors.DockerException):
            command.finish(-1, SIGKILL)
        finally:
            if timer is not None:
                timer.cancel()

    def _finish(self, sandbox: _Sandbox, command: _Command, code: int, mark: str) -> None:
        """Records how the command ended; for 128+N, the wrapper's note (written only
        then) says that signal N ended it."""
        signal, core = 0, False
        if code > 128:
            _, note, _ = self._shell(sandbox, 'cat -- "$1" 2>/dev/null; rm -f -- "$1"', mark)
            fields = note.split()
            if len(fields) == 2 and fields[0].isdigit():
                signal, core = int(fields[0]), fields[1] != b"0"
        command.finish(code, signal, core)

    def _timeout_timer(
        self, sandbox: _Sandbox, command: _Command, timeout_ms: int
    ) -> threading.Timer | None:
        """At the timeout, SIGKILL to the whole group, as execd's context does."""
        if timeout_ms <= 0:
            return None
        timer = threading.Timer(timeout_ms / 1000, self._signal_group, (sandbox, command, SIGKILL))
        timer.daemon = True
        timer.start()
        return timer

    def _interrupt(self, sandbox: _Sandbox, query: list[tuple[str, str]]) -> None:
        command_id = dict(query).get("id", "")
        if not command_id:
            raise _error(400, "MISSING_QUERY", "missing query parameter 'id'")
        command = self._commands.get(command_id)
        prefix = "error interruptting code context. "
        if command is None:
            raise _error(500, "RUNTIME_ERROR", prefix + "no such session")
        # execd knows the pid microseconds after the start; the fake reads it off the stream.
        command.pid_known.wait(2)
        if not command.running or command.pid <= 0:
            raise _error(
                500, "RUNTIME_ERROR", prefix + f"command session {command_id} is not running"
            )
        self._signal_group(sandbox, command, SIGTERM)
        deadline = time.monotonic() + INTERRUPT_GRACE_S
        while time.monotonic() < deadline:
            if not self._group_alive(sandbox, command.pid):
                return
            time.sleep(0.05)
        with contextlib.suppress(_SandboxGone, docker.errors.DockerException):
            self._shell(sandbox, f"kill -9 -{command.pid} 2>/dev/null")

    def _logs(
        self, handler: _Handler, sandbox: _Sandbox, command_id: str, query: list[tuple[str, str]]
    ) -> None:
        command = self._commands.get(command_id)
        if command is None:
            raise _invalid_body(f"command not found: {command_id}")
        if not command.background:
            raise _invalid_body(f"command {command_id} is not running in background")
        try:
            cursor = max(0, int(dict(query).get("cursor", "0")))
        except ValueError:
            cursor = 0
        code, out, err = self._shell(
            sandbox, 'tail -c "+$2" -- "$1"', command.output_path, str(cursor + 1)
        )
        if code != 0:
            message = err.decode(errors="replace").strip()
            raise _invalid_body(
                f"error open combined output file for command {command_id}: {message}"
            )
        handler.reply(
            200,
            out,
            "text/plain; charset=utf-8",
            {"EXECD-COMMANDS-TAIL-CURSOR": str(cursor + len(out))},
        )

    # -- execd: files ------------------------------------------------------------------------

    def _resolve(self, sandbox: _Sandbox, path: str) -> str:
        """A path as execd resolves it (variables, ~), made absolute from its working dir."""
        env = self._execd_env(sandbox)
        return _absolute(_expand(path, env, env["HOME"]), sandbox.workdir)

    def _files_info(self, sandbox: _Sandbox, query: list[tuple[str, str]]) -> bytes:
        paths = [value for key, value in query if key == "path"]
        if not paths:
            return b"{}"
        resolved = []
        for path in paths:
            try:
                resolved.append(self._resolve(sandbox, path))
            except ValueError as error:
                message = f"error accessing file: invalid path {path}: {error}"
                raise _error(500, "RUNTIME_ERROR", message) from None
        _, out, _ = self._shell(sandbox, _INFO_SCRIPT, *resolved)
        lines, users, groups = _split_with_ids(out.decode(errors="replace"))
        answer: dict[str, object] = {}
        for path, absolute, line in zip(paths, resolved, lines, strict=False):
            fields = line.split("|")
            if len(fields) != 6:
                raise _error(
                    404,
                    "FILE_NOT_FOUND",
                    f"file not found. file not found: {path}: lstat {absolute}: "
                    "no such file or directory",
                )
            raw_mode = int(fields[0], 16)
            kind = {0o120000: "symlink", 0o040000: "directory", 0o100000: "file"}
            answer[path] = {
                "path": absolute,
                "type": kind.get(raw_mode & 0o170000, "other"),
                "size": int(fields[1]),
                "modified_at": _stat_time(fields[2]),
                "created_at": _stat_time(fields[3]),
                "owner": users.get(fields[4], fields[4]),
                "group": groups.get(fields[5], fields[5]),
                "mode": int(oct(raw_mode & 0o777)[2:]),
            }
        return _go_json(dict(sorted(answer.items())))

    def _delete_files(self, sandbox: _Sandbox, query: list[tuple[str, str]]) -> None:
        for path in (value for key, value in query if key == "path"):
            try:
                target = self._resolve(sandbox, path)
            except ValueError as error:
                message = f"error removing file {path}. invalid path: {error}"
                raise _error(500, "RUNTIME_ERROR", message) from None
            script = 'if [ -d "$1" ]; then echo dir; elif [ -e "$1" ]; then rm -f -- "$1" 2>&1; fi'
            _, out, _ = self._shell(sandbox, script, target)
            if out.strip() == b"dir":
                message = f"error removing file {path}. path is a directory: {path}"
                raise _error(500, "RUNTIME_ERROR", message)
            if out.strip():
                message = (
                    f"error removing file {path}. failed to remove file: {out.decode().strip()}"
                )
                raise _error(500, "RUNTIME_ERROR", message)

    def _make_directories(self, sandbox: _Sandbox, body: bytes) -> None:
        try:
            request = json.loads(body or b"null")
            if not isinstance(request, dict) or not all(
                isinstance(item, dict) for item in request.values()
            ):
                raise ValueError("want an object of objects")
        except ValueError as error:
            message = f"error parsing request, MAYBE invalid body format. {error}"
            raise _invalid_body(message) from None
        for path, permission in request.items():
            try:
                target = self._resolve(sandbox, path)
            except ValueError as error:
                raise _error(500, "RUNTIME_ERROR", f"error accessing file: {error}") from None
            script = (
                'if [ -d "$1" ]; then echo existed; elif [ -e "$1" ]; then echo notdir; '
                'else mkdir -p -- "$1" 2>&1 && echo created; fi'
            )
            _, out, _ = self._shell(sandbox, script, target)
            result = out.decode(errors="replace").strip()
            if result == "notdir":
                message = f"error accessing file: mkdir {target}: not a directory"
                raise _error(500, "RUNTIME_ERROR", message)
            if result.endswith("created"):
                self._apply_permission(sandbox, target, permission, None)
            elif result != "existed":
                raise _error(500, "RUNTIME_ERROR", f"error accessing file: {result}")

    def _delete_directories(self, sandbox: _Sandbox, query: list[tuple[str, str]]) -> None:
        for path in (value for key, value in query if key == "path"):
            try:
                target = self._resolve(sandbox, path)
            except ValueError as error:
                message = f"error resolving directory {path}. {error}"
                raise _error(500, "RUNTIME_ERROR", message) from None
            code, out, _ = self._shell(sandbox, 'rm -rf -- "$1" 2>&1', target)
            if code != 0:
                message = f"error removing directory {path}. {out.decode(errors='replace').strip()}"
                raise _error(500, "RUNTIME_ERROR", message)

    def _apply_permission(
        self,
        sandbox: _Sandbox,
        target: str,
        permission: dict[str, Any],
        ids: tuple[dict[str, str], dict[str, str]] | None,
    ) -> None:
        """execd's ChmodFile: the mode (digits read as octal) if not 0, then the owner and
        group, which are names looked up in the container's /etc/passwd and /etc/group."""
        mode = permission.get("mode") or 0
        owner = permission.get("owner") or ""
        group = permission.get("group") or ""
        if mode:
            try:
                bits = _octal_mode(int(mode))
            except ValueError as error:
                raise _error(500, "RUNTIME_ERROR", f"error accessing file: {error}") from None
            self._shell(sandbox, f'chmod {bits:o} -- "$1"', target)
        if not owner and not group:
            return
        if ids is None:
            _, out, _ = self._shell(
                sandbox, "echo '=== passwd'; cat /etc/passwd; echo '=== group'; cat /etc/group"
            )
            _, users, groups = _split_with_ids(out.decode(errors="replace"), by_name=True)
        else:
            users, groups = ids
        uid, gid = _owner_ids(owner, group, users, groups)
        spec = f":{gid}" if uid < 0 else f"{uid}" if gid < 0 else f"{uid}:{gid}"
        self._shell(sandbox, f'chown {spec} -- "$1"', target)

    def _upload(self, sandbox: _Sandbox, handler: _Handler, body: bytes) -> None:
        parts = _parse_multipart(handler.headers.get("Content-Type", ""), body)
        if parts is None:
            raise _error(400, "INVALID_FILE", "multipart form is empty")
        # Go's ReadForm files only parts with a filename; the rest are plain values.
        metas = [part for part in parts if part.name == "metadata" and part.filename]
        files = [part for part in parts if part.name == "file" and part.filename]
        if not metas:
            raise _error(400, "INVALID_FILE_METADATA", "metadata file is missing")
        if not files:
            raise _error(400, "INVALID_FILE_CONTENT", "file is missing")
        if len(metas) != len(files):
            message = f"metadata and file count mismatch: {len(metas)} vs {len(files)}"
            raise _error(400, "INVALID_FILE", message)
        for meta, content in zip(metas, files, strict=True):
            self._upload_one(sandbox, meta.data, content.data)

    def _upload_one(self, sandbox: _Sandbox, meta_bytes: bytes, content: bytes) -> None:
        try:
            meta = json.loads(meta_bytes)
            if not isinstance(meta, dict):
                raise ValueError("want an object")
            for name, kind in (("path", str), ("owner", str), ("group", str), ("mode", int)):
                value = meta.get(name)
                if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
                    raise ValueError(f"cannot unmarshal {name}")
        except ValueError as error:
            message = f"invalid metadata format. {error}"
            raise _error(400, "INVALID_FILE_METADATA", message) from None
        path = meta.get("path") or ""
        if not path:
            raise _error(400, "INVALID_FILE_METADATA", "metadata path is empty")
        try:
            target = self._resolve(sandbox, path)
        except ValueError as error:
            message = f"error resolving target path {path}. {error}"
            raise _error(500, "RUNTIME_ERROR", message) from None
        parent = posixpath.dirname(target)
        _, out, _ = self._shell(sandbox, _UPLOAD_SCRIPT, parent, target)
        lines, users, groups = _split_with_ids(out.decode(errors="replace"), by_name=True)
        first = lines[0] if lines else ""
        if first.startswith("mkdir-failed") or first.startswith("mkdir:"):
            message = f"error creating target directory {parent}. {first}"
            raise _error(500, "RUNTIME_ERROR", message)
        if first == "dir":
            message = f"error opening destination file {target}. open {target}: is a directory"
            raise _error(500, "RUNTIME_ERROR", message)
        # A new file gets 0777 & umask (0755) and root; an old one keeps both (O_TRUNC).
        mode, uid, gid = 0o755, 0, 0
        if first.startswith("old ") and len(lines) > 1:
            _, raw_mode, old_uid, old_gid = first.split()
            mode, uid, gid = int(raw_mode, 16) & 0o7777, int(old_uid), int(old_gid)
            target = lines[1]
        failure: _HttpError | None = None
        try:
            if meta.get("mode"):
                mode = _octal_mode(meta["mode"])
            if meta.get("owner") or meta.get("group"):
                new_uid, new_gid = _owner_ids(
                    meta.get("owner") or "", meta.get("group") or "", users, groups
                )
                uid = uid if new_uid < 0 else new_uid
                gid = gid if new_gid < 0 else new_gid
        except (ValueError, _HttpError) as error:
            detail = error.body if isinstance(error, _HttpError) else str(error)
            if isinstance(detail, dict):
                detail = detail.get("message", "")
            failure = _error(500, "RUNTIME_ERROR", f"error chmoding file {target}. {detail}")
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            entry = tarfile.TarInfo(posixpath.basename(target))
            entry.size, entry.mode, entry.uid, entry.gid = len(content), mode, uid, gid
            entry.mtime = int(time.time())
            tar.addfile(entry, io.BytesIO(content))
        try:
            self._client.api.put_archive(
                sandbox.container_id, posixpath.dirname(target), archive.getvalue()
            )
        except docker.errors.APIError as error:
            message = f"error opening destination file {target}. {error}"
            raise _error(500, "RUNTIME_ERROR", message) from None
        if failure is not None:
            raise failure

    def _download(self, handler: _Handler, sandbox: _Sandbox, query: list[tuple[str, str]]) -> None:
        path = dict(query).get("path", "")
        if not path:
            raise _error(400, "MISSING_QUERY", "missing query parameter 'path'")
        try:
            target = self._resolve(sandbox, path)
        except ValueError as error:
            message = f"error resolving file path: {path}. {error}"
            raise _error(500, "RUNTIME_ERROR", message) from None
        script = (
            'if [ -e "$1" ]; then readlink -f -- "$1"; '
            'if [ -d "$1" ]; then echo dir; else echo file; fi; else echo missing; fi'
        )
        _, out, _ = self._shell(sandbox, script, target)
        lines = out.decode(errors="replace").splitlines()
        if not lines or lines[0] == "missing":
            message = f"file not found. open {target}: no such file or directory"
            raise _error(404, "FILE_NOT_FOUND", message)
        real_path, kind = lines[0], lines[-1]
        name = posixpath.basename(target)
        headers = {
            "Content-Disposition": f'attachment; filename="{name}"',
            "Accept-Ranges": "bytes",
        }
        if kind == "dir":
            # execd opens a directory, announces its size and fails while copying it.
            handler.send_response(200)
            handler.send_header("Content-Type", "application/octet-stream")
            handler.send_header("Content-Length", "4096")
            handler.end_headers()
            handler.close_connection = True
            return
        chunks, _ = self._client.api.get_archive(sandbox.container_id, real_path)
        with tarfile.open(fileobj=_ChunkReader(iter(chunks)), mode="r|") as archive:
            member = archive.next()
            source = archive.extractfile(member) if member is not None else None
            if member is None or source is None:
                raise _error(500, "RUNTIME_ERROR", f"error reading {target}")
            size = member.size
            start, length, status = 0, size, 200
            wanted = handler.headers.get("Range")
            if wanted:
                span = _byte_range(wanted, size)
                if span is None:
                    raise _HttpError(416, {"code": "UNKNOWN"})
                start, length, status = span[0], span[1], 206
                headers["Content-Range"] = f"bytes {start}-{start + length - 1}/{size}"
            handler.send_response(status)
            handler.send_header("Content-Type", "application/octet-stream")
            handler.send_header("Content-Length", str(length))
            handler.send_header("Last-Modified", formatdate(member.mtime, usegmt=True))
            for header, value in headers.items():
                handler.send_header(header, value)
            handler.end_headers()
            skip = start
            while skip:
                skip -= len(source.read(min(skip, 1 << 16)))
            remaining = length
            try:
                while remaining:
                    block = source.read(min(remaining, 1 << 16))
                    if not block:
                        break
                    handler.wfile.write(block)
                    remaining -= len(block)
            except OSError:
                handler.close_connection = True
            if remaining:
                handler.close_connection = True


def _invalid_body_404(command_id: str) -> _HttpError:
    return _error(404, "INVALID_REQUEST_BODY", f"command not found: {command_id}")


def _query_int(values: dict[str, str], name: str, default: int, low: int, high: int | None) -> int:
    """A FastAPI integer query parameter with bounds: 422 when it is not one or is outside."""
    if name not in values:
        return default
    text = values[name]
    try:
        number = int(text)
    except ValueError:
        msg = "Input should be a valid integer, unable to parse string as an integer"
        raise _unprocessable([_detail("int_parsing", ["query", name], msg, text)]) from None
    if number < low:
        detail = _detail(
            "greater_than_equal",
            ["query", name],
            f"Input should be greater than or equal to {low}",
            text,
        )
        detail["ctx"] = {"ge": low}
        raise _unprocessable([detail])
    if high is not None and number > high:
        detail = _detail(
            "less_than_equal",
            ["query", name],
            f"Input should be less than or equal to {high}",
            text,
        )
        detail["ctx"] = {"le": high}
        raise _unprocessable([detail])
    return number


def _starlette_json(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def _split_with_ids(
    text: str, *, by_name: bool = False
) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """A script's own lines, then the users and groups of its /etc/passwd and /etc/group
    tails: id → name, or name → id with `by_name` (the first entry wins, as in Go)."""
    own, _, rest = text.partition("=== passwd\n")
    passwd, _, group = rest.partition("=== group\n")
    tables: list[dict[str, str]] = []
    for table in (passwd, group):
        entries: dict[str, str] = {}
        for line in table.splitlines():
            fields = line.split(":")
            if len(fields) >= 3 and fields[2].isdigit():
                key, value = (fields[0], fields[2]) if by_name else (fields[2], fields[0])
                entries.setdefault(key, value)
        tables.append(entries)
    return own.splitlines(), tables[0], tables[1]


def _owner_ids(
    owner: str, group: str, users: dict[str, str], groups: dict[str, str]
) -> tuple[int, int]:
    """Names to ids (-1: unchanged), as Go's user.Lookup and LookupGroup: a number that is
    not a name is unknown."""
    uid = gid = -1
    if owner:
        if owner not in users:
            message = f"failed to lookup user {owner}: user: unknown user {owner}"
            raise _error(500, "RUNTIME_ERROR", message)
        uid = int(users[owner])
    if group:
        if group not in groups:
            message = f"failed to lookup group {group}: group: unknown group {group}"
            raise _error(500, "RUNTIME_ERROR", message)
        gid = int(groups[group])
    return uid, gid


def _byte_range(header: str, size: int) -> tuple[int, int] | None:
    """The first range of a Range header as (start, length); None when it cannot be met."""
    match = re.fullmatch(r"\s*bytes=\s*(\d*)\s*-\s*(\d*)\s*(?:,.*)?", header)
    if not match or (not match[1] and not match[2]):
        return None
    if not match[1]:
        length = min(int(match[2]), size)
        return (size - length, length) if length else None
    start = int(match[1])
    if start >= size:
        return None
    end = min(int(match[2]), size - 1) if match[2] else size - 1
    return (start, end - start + 1) if end >= start else None
