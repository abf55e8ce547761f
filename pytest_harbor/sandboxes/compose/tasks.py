"""Which tasks run as a Compose project, and their checked Compose configuration: read
once per process for each task folder and settings (through `docker compose config`)."""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_harbor.settings import HarborSettings
from pytest_harbor.tasks.errors import TaskLoadError
from pytest_harbor.tasks.task import Task, Turn

if TYPE_CHECKING:
    from pytest_harbor.sandboxes.compose.project import ComposeSpec

__all__ = ["compose_spec", "overlay_files", "prompted", "refuse_compose", "with_overlay"]

_cache: dict[str, ComposeSpec] = {}
_lock = threading.Lock()


def overlay_files(settings: HarborSettings) -> list[Path]:
    overlay = settings.compose_overlay
    return [Path(name).resolve() for name in (overlay.files if overlay else [])]


def prompted(turn: Turn, settings: HarborSettings) -> Turn:
    """`turn` with its instruction inside `compose_overlay.prompt_template`, when there
    is one."""
    overlay = settings.compose_overlay
    if overlay is None or overlay.prompt_template is None:
        return turn
    return dataclasses.replace(
        turn, instruction=overlay.prompt_template.replace("{instruction}", turn.instruction)
    )


def compose_spec(task: Task, settings: HarborSettings) -> ComposeSpec | None:
    """The task's Compose project, or None when it runs as one container (no Compose file
    and no overlay files). Raises TaskLoadError naming the file and key it refuses."""
    overlays = overlay_files(settings)
    if task.compose_file is None and not overlays:
        return None
    environment = task.config.environment
    dockerfile = task.environment_dir / "Dockerfile"
    key = json.dumps(
        [
            str(task.path),
            task.digest,
            settings.compose_variables,
            settings.host_env,
            settings.allow_remote_add,
            [str(p) for p in overlays],
        ],
        sort_keys=True,
    )
    with _lock:
        found = _cache.get(key)
    if found is not None:
        return found
    # Loaded by the first Compose task: a run of single-container tasks never needs it.
    from pytest_harbor.sandboxes.compose.project import ComposeRefused, read_compose

    for path in overlays:
        if not path.is_file():
            raise TaskLoadError(path, "missing: named by compose_overlay.files")
    try:
        spec = read_compose(
            task.path,
            task.compose_file,
            main_build=dockerfile.parent
            if environment.docker_image is None and dockerfile.is_file()
            else None,
            main_image=environment.docker_image,
            task_env=environment.env,
            variables=settings.compose_variables,
            overlays=overlays,
            host=settings.host_variables(),
            allow_remote_add=settings.allow_remote_add,
        )
    except ComposeRefused as error:
        raise TaskLoadError(error.file, str(error), key=error.key) from None
    except RuntimeError as error:
        raise TaskLoadError(task.compose_file or overlays[0], str(error)) from None
    with _lock:
        _cache[key] = spec
    return spec


def refuse_compose(task: Task, settings: HarborSettings) -> None:
    """At planning: a Compose task whose file (or settings) cannot run is refused."""
    spec = compose_spec(task, settings)
    if spec is None:
        return
    task_file = task.path / "task.toml"
    if settings.verify_from_snapshot:
        raise TaskLoadError(
            task_file,
            "verify_from_snapshot verifies in a lone container, without the Compose "
            "project's other services",
        )
    _refuse_phase_networks(task, task_file)
    services = set(spec.config["services"])
    for index, hook in enumerate(task.config.verifier.collect):
        if hook.service not in services:
            raise TaskLoadError(
                task_file,
                f"no service {hook.service!r} in {spec.file.name}",
                key=f"verifier.collect[{index}].service",
            )
    for index, artifact in enumerate(task.config.artifacts):
        if artifact.service is not None and artifact.service not in services:
            raise TaskLoadError(
                task_file,
                f"no service {artifact.service!r} in {spec.file.name}",
                key=f"artifacts[{index}].service",
            )


def with_overlay(task: Task, settings: HarborSettings) -> Task:
    """The task as its harness sees it: `compose_overlay.mcp_servers` merged into its own
    MCP servers by name (the overlay's entry wins)."""
    overlay = settings.compose_overlay
    if overlay is None or not overlay.mcp_servers:
        return task
    servers = {server.name: server for server in task.config.environment.mcp_servers}
    servers.update({server.name: server for server in overlay.mcp_servers})
    environment = task.config.environment.model_copy(update={"mcp_servers": list(servers.values())})
    config = task.config.model_copy(update={"environment": environment})
    return dataclasses.replace(task, config=config)


def _refuse_phase_networks(task: Task, task_file: Path) -> None:
    """A Compose project keeps its networks for every phase. Without an allow-list every
    phase has the network or none does; with one, the project is behind its egress from
    the start and no phase (the environment's included) may have the whole network."""
    phases = [(turn.agent_network, turn.agent_hosts) for turn in task.turns] + [
        (turn.verifier_network, turn.verifier_hosts) for turn in task.turns
    ]
    if not task.filtered:
        if len({network for network, _ in phases}) > 1:
            raise TaskLoadError(
                task_file,
                "a Compose project keeps one network for all its phases; this task's "
                "phases differ (network_mode)",
                key="environment.network_mode",
            )
        return
    if task.config.environment.network_mode == "public" or any(
        network and hosts is None for network, hosts in phases
    ):
        raise TaskLoadError(
            task_file,
            'a Compose task with network_mode = "allowlist" keeps its services behind the '
            "allow-list in every phase; a phase with the whole network (public) cannot "
            'follow or precede it: make each phase "allowlist" or "no-network"',
            key="environment.network_mode",
        )
