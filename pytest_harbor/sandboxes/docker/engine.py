"""The connection to one Docker engine: its address (a socket, TCP with TLS, ssh), the API
client made once per process, and the errors a call to it may raise."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import docker.tls
import requests
import urllib3

from pytest_harbor.display import harbor_logger
from pytest_harbor.sandboxes.base import (
    SandboxStartError,
)
from pytest_harbor.sandboxes.compose.cli import cli_variables

log = harbor_logger()


#: The oldest engine API pytest-harbor works with (Docker Engine 20.10).
MIN_API_VERSION = "1.41"
#: Control calls (create, inspect, remove) give up after this long.
CONTROL_TIMEOUT_S = 300
#: After a deadline kill, how long the output stream may take to end.
KILL_GRACE_S = 5.0
#: What a dropped or timed-out connection to the engine raises.
TRANSPORT_ERRORS = (OSError, requests.exceptions.RequestException, urllib3.exceptions.HTTPError)
#: What a call to the engine raises when the engine refuses it or cannot be reached.
ENGINE_ERRORS = (docker.errors.APIError, *TRANSPORT_ERRORS)


@dataclass(frozen=True)
class Endpoint:
    """A Docker engine by its address: `unix://PATH`, `tcp://HOST:PORT` (with TLS when
    `cert_path` names a folder holding Docker's ca.pem, cert.pem and key.pem) or
    `ssh://USER@HOST` (through the ssh client on PATH)."""

    url: str
    cert_path: str | None = None
    tls_verify: bool = True

    @property
    def key(self) -> str:
        """A short name of the address, for lock and marker files."""
        return hashlib.sha256(self.url.encode()).hexdigest()[:12]

    def client_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"base_url": self.url}
        if self.url.startswith("ssh://"):
            kwargs["use_ssh_client"] = True
        if self.cert_path is not None:
            folder = Path(self.cert_path)
            kwargs["tls"] = docker.tls.TLSConfig(
                client_cert=(str(folder / "cert.pem"), str(folder / "key.pem")),
                ca_cert=str(folder / "ca.pem") if self.tls_verify else None,
                verify=self.tls_verify,
            )
        return kwargs

    def client(self, *, version: str, timeout: float) -> docker.APIClient:
        return api_client(self.client_kwargs(), version=version, timeout=timeout)

    def cli_env(self) -> dict[str, str]:
        """The environment that points the docker CLI (Compose, buildx) at this engine."""
        return cli_environment(self)


def cli_environment(endpoint: Endpoint | None = None) -> dict[str, str]:
    """The docker CLI's environment: the variables it needs of this process's
    (compose/cli.py's CLI_VARIABLES; a `NAME` with no value in a Compose file's
    `environment` would otherwise take any variable of the host at `up`), pointed at
    `endpoint` when given."""
    env = cli_variables(extra=("SSH_AUTH_SOCK",))
    if endpoint is not None:
        env = {key: value for key, value in env.items() if not key.startswith("DOCKER_")}
        env["DOCKER_HOST"] = endpoint.url
        if endpoint.cert_path is not None:
            env["DOCKER_CERT_PATH"] = endpoint.cert_path
            if endpoint.tls_verify:
                env["DOCKER_TLS_VERIFY"] = "1"
    return env


def api_client(kwargs: Mapping[str, Any], *, version: str, timeout: float) -> docker.APIClient:
    """An API client. With TLS, the engine's CA is the TLS settings' alone: the
    environment's CA bundle (REQUESTS_CA_BUNDLE, which requests would put first) and its
    proxies are not used, whether the engine is named in the options or by DOCKER_HOST.
    Over a unix socket no proxy applies either: the environment is not read at each
    request (another thread, pytest's, changes it meanwhile, and reading it raised)."""
    if not kwargs.get("tls"):
        api = docker.APIClient(version=version, timeout=timeout, **kwargs)
        if api.base_url == "http+docker://localhost":
            api.trust_env = False
        return api
    # Asked for after trust_env is off: "auto" would ask at once, trusting it.
    api = docker.APIClient(
        version=MIN_API_VERSION if version == "auto" else version, timeout=timeout, **kwargs
    )
    api.trust_env = False
    if version == "auto":
        api._version = api._retrieve_server_version()
    return api


class Engine:
    """The per-process connection to one Docker engine."""

    def __init__(self, endpoint: Endpoint | None = None) -> None:
        try:
            self.api = api_client(
                endpoint.client_kwargs() if endpoint else _client_kwargs(),
                version="auto",
                timeout=CONTROL_TIMEOUT_S,
            )
        except docker.errors.DockerException as error:
            raise SandboxStartError(unreachable(endpoint, str(error))) from None
        self._cpus: int | None = None
        #: Reached over TLS or ssh (named in the options or by DOCKER_HOST alike), where
        #: an exec's connection cannot be half-closed to end the command's input.
        self.tunnelled = self.api.base_url.startswith(("https://", "http+docker://ssh"))

    @property
    def cpus(self) -> int:
        if self._cpus is None:
            self._cpus = int(self.api.info().get("NCPU") or os.cpu_count() or 1)
        return self._cpus


def describe_endpoint(endpoint: Endpoint | None) -> str:
    """An engine's address and where it came from, for a message."""
    if endpoint is not None:
        return f"{endpoint.url} (sandbox_provider_options.hosts)"
    if os.environ.get("DOCKER_HOST"):
        return f"{os.environ['DOCKER_HOST']} (DOCKER_HOST)"
    return "unix:///var/run/docker.sock (the default; DOCKER_HOST is not set)"


def unreachable(endpoint: Endpoint | None, why: str) -> str:
    """Why an engine does not answer: the address tried, where it came from, the fix."""
    where = describe_endpoint(endpoint)
    return (
        f"the Docker engine at {where} does not answer: {why}. Start it (as root, .ci/setup "
        "does: it installs and starts dockerd), or set DOCKER_HOST to an engine that answers"
    )


def _client_kwargs() -> dict[str, Any]:
    return docker.utils.kwargs_from_env()  # type: ignore[no-any-return]


_engines: dict[tuple[int, Endpoint | None], Engine] = {}
_engines_lock = threading.Lock()


def engine_for(endpoint: Endpoint | None = None) -> Engine:
    """The connection to `endpoint` (None: the engine the environment names)."""
    # Keyed by pid too: a forked process must not share the parent's connections.
    key = (os.getpid(), endpoint)
    with _engines_lock:
        if key not in _engines:
            _engines[key] = Engine(endpoint)
        return _engines[key]


def explain(error: BaseException) -> str:
    explanation = getattr(error, "explanation", None)
    return str(explanation or error).strip()


def tail_lines(lines: list[str], count: int = 20) -> str:
    return "\n".join(lines[-count:])
