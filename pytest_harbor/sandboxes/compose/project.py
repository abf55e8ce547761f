"""Compose tasks: a task's `environment/` Compose file, read through the real Docker Compose
v2 (`docker compose config`), checked, and turned into the project one episode starts.

The `main` service is the agent's sandbox; the others are sidecars that start first (their
`depends_on` conditions and health checks honoured by `up --wait`). As in Harbor, `main`
comes from `environment/Dockerfile` or `[environment].docker_image` unless the file gives
it an image or a build of its own. A service's `build` is built by the provider, with the
options its builder can honour; the others are refused.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pytest_harbor.sandboxes.compose.builds import ServiceBuild, service_build
from pytest_harbor.sandboxes.compose.cli import cli_variables, compose_config
from pytest_harbor.sandboxes.compose.model import (
    RESERVED_NAME_PREFIX,
    ComposeRefused,
    read_project,
)
from pytest_harbor.sandboxes.compose.source import check_source
from pytest_harbor.sandboxes.images import image_tag_for
from pytest_harbor.sandboxes.routes import BRIDGE_NAME_OPTION, bridge_name
from pytest_harbor.tasks.registries import registry_problem

__all__ = [
    "ComposeRefused",
    "ComposeSpec",
    "EgressLink",
    "ServiceBuild",
    "check_config",
    "episode_project",
    "project_name",
    "read_compose",
]

#: The key an allow-list's egress network has in an episode's project.
EGRESS_KEY = RESERVED_NAME_PREFIX + "-egress"
#: The bridge option that keeps an address for this machine off a network: a service on
#: an internal network would reach this machine's own services at the bridge's address.
NO_HOST_ADDRESS = "com.docker.network.bridge.inhibit_ipv4"


@dataclass(frozen=True)
class EgressLink:
    """An allow-list's egress, as a Compose project joins it: its network (internal, no
    address on this machine) and its address there, which every service's names are
    resolved by."""

    network: str
    address: str


def project_name(episode: str, unique: str) -> str:
    """A Compose project name: lowercase letters, digits, `-` and `_`, a letter first."""
    cleaned = re.sub(r"[^a-z0-9_-]", "-", episode.lower())[:40].strip("-_") or "episode"
    return f"hb-{cleaned}-{unique}"


@dataclass(frozen=True)
class ComposeSpec:
    """A checked Compose project for a task: the canonical configuration (`config`) with
    `main`'s image left to the episode, and the builds of services (made by the provider,
    once per content hash of the context and options, then named by `image`)."""

    file: Path
    config: Mapping[str, Any]
    #: Service -> its build.
    builds: Mapping[str, ServiceBuild]

    def images(self) -> dict[str, str]:
        """Services with a prebuilt image (no build): service -> image."""
        return {
            name: str(service["image"])
            for name, service in self.config["services"].items()
            if name not in self.builds and service.get("image")
        }


def read_compose(
    task_path: Path,
    file: Path | None,
    *,
    main_build: Path | None,
    main_image: str | None,
    task_env: Mapping[str, str],
    variables: Mapping[str, str],
    overlays: list[Path],
    host: Mapping[str, str] | None = None,
    allow_remote_add: bool = False,
) -> ComposeSpec:
    """Read and check a task's Compose file (with the run's overlay files after it; or
    those alone, around the task's own image); ComposeRefused names what cannot run.
    Its `${NAME}`s read `host` (the host variables the run allows), never the rest of
    this process's environment; `allow_remote_add` lets a build's `ADD` fetch a URL."""
    environment_dir = task_path / "environment"
    if not environment_dir.is_dir():
        environment_dir = task_path
    files = [path for path in (file, *overlays) if path is not None]
    named = files[0]
    if file is not None:
        # Before Compose reads what the file names (another file, an env_file).
        check_source(task_path, file)
    with tempfile.TemporaryDirectory(prefix="harbor-compose-") as scratch:
        # Harbor's base file: `main` from the task's Dockerfile or prebuilt image.
        base: dict[str, Any] = {}
        if main_build is not None:
            base = {"services": {"main": {"build": {"context": str(main_build)}}}}
        elif main_image is not None:
            base = {"services": {"main": {"image": main_image}}}
        base_file = Path(scratch) / "base.json"
        base_file.write_text(json.dumps(base or {"services": {}}))
        env = _interpolation_env(
            environment_dir, task_env, variables, main_build, main_image, host or {}
        )
        try:
            config = compose_config([base_file, *files], environment_dir, env)
        except ValueError as error:
            raise ComposeRefused(named, f"does not parse as Compose: {error}") from None
    return check_config(
        task_path,
        named,
        config,
        allow_remote_add=allow_remote_add,
        users_images=overlay_images(overlays),
    )


def overlay_images(overlays: list[Path]) -> frozenset[str]:
    """The images the run's own overlay files name for their services, as written: the
    user's choice, pulled from wherever the user's engine reaches (a task's are judged)."""
    named: set[str] = set()
    for path in overlays:
        try:
            loaded = yaml.safe_load(path.read_text(errors="replace"))
        except (OSError, yaml.YAMLError):
            continue  # Compose says what is wrong with it
        services = loaded.get("services") if isinstance(loaded, dict) else None
        for service in (services or {}).values() if isinstance(services, dict) else []:
            if isinstance(service, dict) and isinstance(service.get("image"), str):
                named.add(service["image"])
    return frozenset(named)


def _interpolation_env(
    environment_dir: Path,
    task_env: Mapping[str, str],
    variables: Mapping[str, str],
    main_build: Path | None,
    main_image: str | None,
    host: Mapping[str, str],
) -> dict[str, str]:
    """Harbor's precedence: infrastructure variables, then the task's env, then the host
    variables the run allows (`host`: of this process's environment, only those and what
    the docker CLI needs to run, CLI_VARIABLES), then `environment/.env` (Compose reads it
    itself); `compose_variables` only fill names none of those set."""
    dotenv = environment_dir / ".env"
    in_dotenv = set()
    if dotenv.is_file():
        for line in dotenv.read_text(errors="replace").splitlines():
            name = line.split("=", 1)[0].strip().removeprefix("export ").strip()
            if name and not name.startswith("#"):
                in_dotenv.add(name)
    infra = {"CONTEXT_DIR": str(environment_dir)}
    if main_build is not None:
        infra["MAIN_IMAGE_NAME"] = image_tag_for(main_build)
    if main_image is not None:
        infra["PREBUILT_IMAGE_NAME"] = main_image
    process = cli_variables()
    process.update(host)
    env = {
        name: value
        for name, value in variables.items()
        if name not in process and name not in task_env and name not in in_dotenv
    }
    return {**env, **process, **task_env, **infra}


def check_config(
    task_path: Path,
    file: Path,
    config: Mapping[str, Any],
    *,
    allow_remote_add: bool = False,
    users_images: frozenset[str] = frozenset(),
) -> ComposeSpec:
    """The canonical configuration of the task at `task_path` read into the model of what
    a Compose file may hold (compose_model.py) and written out from it: ComposeRefused
    names the first key of `file` that cannot run here. A service's image is pulled by
    the engine (from no registry of this machine or a private network); a build's
    Dockerfile is checked (dockerfiles.py), its `ADD` of a URL let through when
    `allow_remote_add`; `users_images` (the run's overlay's) are the user's to pull."""
    project = read_project(task_path, file, config)
    services: dict[str, Any] = project.get("services") or {}
    if "main" not in services:
        raise ComposeRefused(
            file,
            "no `main` service (the agent's sandbox): name one, or give the task an "
            "environment/Dockerfile or [environment].docker_image",
            "services.main",
        )
    root = task_path.resolve()
    builds: dict[str, ServiceBuild] = {}
    for name, service in services.items():
        where = f"services.{name}"
        build = service.get("build")
        if build:
            builds[name] = service_build(file, root, f"{where}.build", build, allow_remote_add)
        elif not service.get("image"):
            raise ComposeRefused(file, "has neither an image nor a build", where)
        else:
            # Pulled by the engine (beside a build, `image` would only name what is built).
            image = str(service["image"])
            problem = None if image in users_images else registry_problem(image)
            if problem is not None:
                raise ComposeRefused(file, f"{service['image']} {problem}", f"{where}.image")
    return ComposeSpec(file, project, builds)


def episode_project(
    canonical: Mapping[str, Any],
    *,
    name: str,
    main_image: str,
    built: Mapping[str, str],
    labels: Mapping[str, str],
    main: Mapping[str, Any],
    internal: bool,
    egress: EgressLink | None = None,
) -> dict[str, Any]:
    """The project one episode starts, made from the `canonical` configuration: `main`
    runs `main_image` with what `main` says (entrypoint, command, environment,
    working_dir, volumes, limits); built services run
    their built images; every container, network and volume carries `labels`; published
    host ports become ports the engine picks (parallel episodes never collide), and
    `container_name`s go (they would too). `internal`: no network beyond the project (and
    no address on this machine). `egress`: the project's networks are internal, and every
    service with a network of its own also joins the egress's network and has its names
    resolved by the egress, so what the egress's policy lists is all it reaches beyond the
    project."""
    config: dict[str, Any] = json.loads(json.dumps(canonical))
    config["name"] = name
    services: dict[str, Any] = config["services"]
    for service_name, service in services.items():
        _episode_service(service, built.get(service_name), labels)
    _episode_main(services["main"], main_image, main)
    # Networks and named volumes are the episode's own (named after its project), never
    # shared with a parallel episode of the same task.
    networks = config.setdefault("networks", {})
    networks.setdefault("default", {})
    isolated = internal or egress is not None
    for key, network in _own(networks):
        _name_own(network, f"{name}_{key}", labels)
        # The border knows the project's bridges by their names; one with no route out
        # and no address here is enclosed (`e`), as an egress's network is.
        kind = "e" if isolated else "c"
        network["driver_opts"] = {BRIDGE_NAME_OPTION: bridge_name(kind, f"{name}_{key}")}
        if isolated:
            network["internal"] = True
            network["driver_opts"][NO_HOST_ADDRESS] = "true"
    if egress is not None:
        _join_egress(services, networks, egress)
    for key, volume in _own(config.get("volumes") or {}):
        _name_own(volume, f"{name}_{key}", labels)
    return config


def _episode_service(service: dict[str, Any], image: str | None, labels: Mapping[str, str]) -> None:
    """A service as the episode runs it: its built `image` (when it was built), its own
    labels and `labels`, nothing pulled, no fixed name, no fixed host port."""
    if image is not None:
        service.pop("build", None)
        service["image"] = image
    service.pop("container_name", None)
    service["labels"] = {**(service.get("labels") or {}), **labels}
    service["pull_policy"] = "never"
    for port in service.get("ports") or []:
        port.pop("published", None)
        port.pop("host_ip", None)


def _episode_main(target: dict[str, Any], image: str, main: Mapping[str, Any]) -> None:
    """`main` runs `image` with what `main` says: its environment and volumes join the
    service's own, every other key replaces the service's."""
    target.pop("build", None)
    target["image"] = image
    for key, value in main.items():
        if key == "environment":
            target["environment"] = {**(target.get("environment") or {}), **value}
        elif key == "volumes":
            target["volumes"] = [*(target.get("volumes") or []), *value]
        else:
            target[key] = value


def _own(declared: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The networks or volumes the project makes itself (not `external`)."""
    return [(key, entry) for key, entry in declared.items() if not entry.get("external")]


def _name_own(entry: dict[str, Any], name: str, labels: Mapping[str, str]) -> None:
    entry["name"] = name
    entry["labels"] = {**(entry.get("labels") or {}), **labels}


def _join_egress(services: dict[str, Any], networks: dict[str, Any], egress: EgressLink) -> None:
    """Every service with a network namespace of its own joins the egress's network (as
    well as its own: naming networks takes a service off `default` unless it is named)
    and resolves names through the egress. A service in another's namespace
    (`network_mode: service:x`) has x's; one with `network_mode: none` has none."""
    networks[EGRESS_KEY] = {"external": True, "name": egress.network}
    for service in services.values():
        if "network_mode" in service:
            continue
        joined = service.get("networks") or {"default": None}
        service["networks"] = {**joined, EGRESS_KEY: None}
        service["dns"] = [egress.address]
