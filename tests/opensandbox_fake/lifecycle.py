"""The lifecycle API: sandboxes as containers (created, described, listed, paused,
deleted), their expiry timers and their metadata."""

from __future__ import annotations

import contextlib
import json
import re
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl

import docker.errors

from tests.opensandbox_fake.egress import EGRESS_AUTH_HEADER, EGRESS_PORT, _Egress
from tests.opensandbox_fake.labels import (
    ADDED_RUN_LABEL,
    EXPIRES_LABEL,
    HIDDEN_PREFIXES,
    ID_LABEL,
    INSTANCE_LABEL,
    MANUAL_LABEL,
    RUN_LABEL,
)
from tests.opensandbox_fake.records import _Sandbox
from tests.opensandbox_fake.validation import (
    _detail,
    _memory_bytes,
    _names_a_registry,
    _nano_cpus,
    _parse_create,
    _query_int,
    _unprocessable,
)
from tests.opensandbox_fake.wire import (
    _docker_time,
    _error,
    _HttpError,
    _not_found,
    _now,
    _pydantic_time,
)

#: The Docker SDK has no type hints; its objects are `Any` here under readable names.
Container = Any

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

_SANDBOXES = re.compile(r"^(?:/v1)?/sandboxes$")
_SANDBOX = re.compile(r"^(?:/v1)?/sandboxes/([^/]+)$")
_RENEW = re.compile(r"^(?:/v1)?/sandboxes/([^/]+)/renew-expiration$")
_PAUSE = re.compile(r"^(?:/v1)?/sandboxes/([^/]+)/pause$")
_RESUME = re.compile(r"^(?:/v1)?/sandboxes/([^/]+)/resume$")
_ENDPOINT = re.compile(r"^(?:/v1)?/sandboxes/([^/]+)/endpoints/([^/]+)$")


class _Lifecycle(_Egress):
    """The lifecycle API's routes, over the engine's containers."""

    def sandbox_containers(self) -> list[Container]:
        """The containers this fake made that still exist."""
        label = f"{INSTANCE_LABEL}={self._instance}"
        containers: list[Container] = self._client.containers.list(
            all=True, filters={"label": label}
        )
        return containers

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
        """A create, refused with 429 while `max_creating` are under way (a hosted
        server's limit; the real Docker runtime has none)."""
        with self._lock:
            if self.max_creating is not None and self.creating >= self.max_creating:
                self.refused_creates += 1
                raise _error(
                    429, "SANDBOX::TOO_MANY_REQUESTS", "too many sandboxes are being created"
                )
            self.creating += 1
            self.most_creating = max(self.most_creating, self.creating)
        try:
            return self._create_now(body)
        finally:
            with self._lock:
                self.creating -= 1

    def _create_now(self, body: bytes) -> tuple[int, object]:
        if not body.strip():
            raise _unprocessable([_detail("missing", ["body"], "Field required", None)])
        try:
            data = json.loads(body)
        except ValueError as error:
            detail = _detail("json_invalid", ["body", 0], "JSON decode error", {})
            detail["ctx"] = {"error": str(error)}
            raise _unprocessable([detail]) from None
        request = _parse_create(data, self._min_timeout_s, egress=self.egress_mode is not None)
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
        sandbox = _Sandbox(sandbox_id, container.id, env, config.get("WorkingDir") or "/")
        if request.network_policy is not None:
            sandbox.policy = request.network_policy
            resolv = container.exec_run(["cat", "/etc/resolv.conf"]).output.decode(errors="replace")
            nameservers = [
                line.split()[1]
                for line in resolv.splitlines()
                if line.startswith("nameserver") and len(line.split()) > 1
            ]
            self._egress_start(sandbox, int(container.attrs["State"]["Pid"]), nameservers)
        self._sandboxes[sandbox_id] = sandbox
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
        answer: dict[str, object] = {
            "endpoint": f"{self.domain}/sandboxes/{sandbox_id}/proxy/{port}"
        }
        sandbox = self._sandboxes.get(sandbox_id)
        if port == EGRESS_PORT and sandbox is not None and sandbox.egress_token:
            answer["headers"] = {EGRESS_AUTH_HEADER: sandbox.egress_token}
        return 200, answer

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
