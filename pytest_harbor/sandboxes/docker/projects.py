"""Compose projects, through the real Docker Compose v2 CLI: one started as a sandbox's
`main` and its services, and removed whole."""

from __future__ import annotations

import contextlib
import json
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import docker
import docker.errors
import docker.tls

from pytest_harbor.display import harbor_logger
from pytest_harbor.labels import COMPOSE_PROJECT_LABEL, COMPOSE_SERVICE_LABEL
from pytest_harbor.sandboxes.base import (
    SandboxError,
    SandboxStartError,
)
from pytest_harbor.sandboxes.compose.cli import ComposeRun, ComposeUnavailable, compose
from pytest_harbor.sandboxes.docker.engine import (
    CONTROL_TIMEOUT_S,
    ENGINE_ERRORS,
    Endpoint,
    cli_environment,
    engine_for,
    explain,
    tail_lines,
)
from pytest_harbor.threads import join

log = harbor_logger()

#: How long `up --wait` may take when the spec sets no limit.
COMPOSE_UP_S = 900.0


#: How long `logs` of a project that did not come up may take.
_LOGS_S = 60.0


def start_project(
    name: str, config: Mapping[str, Any], *, timeout: float | None, endpoint: Endpoint | None
) -> str:
    """`docker compose up --wait` of the project `name` from its configuration (its
    services started as their depends_on conditions and health checks say), within
    `timeout` (None: COMPOSE_UP_S); the id of its `main` service's container.
    SandboxStartError, the project removed, when it does not come up."""
    with tempfile.TemporaryDirectory(prefix="harbor-compose-") as scratch:
        file = Path(scratch) / "compose.json"
        file.write_text(json.dumps(config))
        project = ["-p", name, "-f", str(file), "--project-directory", scratch]
        up = _compose(
            [*project, "up", "-d", "--wait"], timeout=timeout or COMPOSE_UP_S, endpoint=endpoint
        )
        if up.returncode != 0:
            logs = _compose(
                [*project, "logs", "--no-color", "--tail", "20"], timeout=_LOGS_S, endpoint=endpoint
            )
            remove_project(name, endpoint)
            raise SandboxStartError(
                f"the Compose project did not come up: {tail_lines(up.stderr.splitlines(), 8)}"
                f"\n{tail_lines(logs.stdout.splitlines(), 40)}"
            )
    found = engine_for(endpoint).api.containers(
        filters={"label": [f"{COMPOSE_PROJECT_LABEL}={name}", f"{COMPOSE_SERVICE_LABEL}=main"]}
    )
    if not found:
        remove_project(name, endpoint)
        raise SandboxStartError(f"the Compose project {name} came up without its main")
    return str(found[0]["Id"])


def _compose(arguments: list[str], *, timeout: float, endpoint: Endpoint | None) -> ComposeRun:
    """`docker compose ARGUMENTS` on the engine of `endpoint`."""
    try:
        return compose(
            arguments, env=cli_environment(endpoint), timeout=timeout, what=arguments[-1]
        )
    except ComposeUnavailable as error:
        raise SandboxStartError(str(error)) from None


def remove_project(project: str, endpoint: Endpoint | None = None) -> None:
    """Every container of the project at once (forced, no graceful stop), then its
    networks and volumes."""
    api = engine_for(endpoint).api
    selector = {"label": f"{COMPOSE_PROJECT_LABEL}={project}"}
    try:
        containers = api.containers(all=True, filters=selector)
    except ENGINE_ERRORS as error:
        raise SandboxError(f"cannot list the project {project}: {explain(error)}") from None
    threads = [
        threading.Thread(target=remove_container, args=(c["Id"], endpoint), daemon=True)
        for c in containers
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        join(thread, CONTROL_TIMEOUT_S)
    remove_networks_and_volumes(selector, endpoint)


def remove_container(container: str, endpoint: Endpoint | None = None) -> None:
    """Remove a container at once (no graceful stop) with its volumes; one already gone
    or already being removed is no error."""
    try:
        engine_for(endpoint).api.remove_container(container, force=True, v=True)
    except docker.errors.NotFound:
        pass
    except ENGINE_ERRORS as error:
        if "already in progress" not in str(error):
            raise SandboxError(
                f"sandbox {container[:12]}: removal failed: {explain(error)}"
            ) from None


def remove_networks_and_volumes(
    filters: Mapping[str, Any], endpoint: Endpoint | None = None
) -> None:
    api = engine_for(endpoint).api
    # In use, gone, or no engine to ask: what is left is the reaper's.
    with contextlib.suppress(*ENGINE_ERRORS):
        for network in api.networks(filters=filters):
            with contextlib.suppress(docker.errors.APIError):
                api.remove_network(network["Id"])
    with contextlib.suppress(*ENGINE_ERRORS):
        for volume in (api.volumes(filters=filters) or {}).get("Volumes") or []:
            with contextlib.suppress(docker.errors.APIError):
                api.remove_volume(volume["Name"], force=True)
