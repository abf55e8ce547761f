"""Compose tasks: a task's `environment/` Compose file, read through the real Docker Compose
v2 (`docker compose config`), checked, and turned into the project one episode starts.

The `main` service is the agent's sandbox; the others are sidecars that start first (their
`depends_on` conditions and health checks honoured by `up --wait`). As in Harbor, `main`
comes from `environment/Dockerfile` or `[environment].docker_image` unless the file gives
it an image or a build of its own.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_harbor.sandboxes.images import image_tag_for

__all__ = [
    "ComposeRefused",
    "ComposeSpec",
    "episode_project",
    "project_name",
    "read_compose",
    "run_config",
]

#: Compose runs get this long for `config`; `up` has the sandbox's own start limit.
CONFIG_TIMEOUT_S = 60.0


class ComposeRefused(ValueError):
    """A Compose file that cannot run here; `key` names the place in it."""

    def __init__(self, file: Path, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.file = file
        self.key = key


def project_name(episode: str, unique: str) -> str:
    """A Compose project name: lowercase letters, digits, `-` and `_`, a letter first."""
    cleaned = re.sub(r"[^a-z0-9_-]", "-", episode.lower())[:40].strip("-_") or "episode"
    return f"hb-{cleaned}-{unique}"


@dataclass(frozen=True)
class ComposeSpec:
    """A checked Compose project for a task: the canonical configuration (`config`) with
    `main`'s image left to the episode, and the build contexts of services (built by the
    provider, once per content hash, then named by `image`)."""

    file: Path
    config: Mapping[str, Any]
    #: Service -> its build context (a folder of the task).
    builds: Mapping[str, Path]

    def images(self) -> dict[str, str]:
        """Services with a prebuilt image (no build): service -> image."""
        return {
            name: str(service["image"])
            for name, service in self.config["services"].items()
            if name not in self.builds and service.get("image")
        }


def run_config(files: list[Path], project_dir: Path, env: Mapping[str, str]) -> dict[str, Any]:
    """`docker compose config` of `files`: merged, interpolated, in canonical form."""
    command = ["docker", "compose", "--project-directory", str(project_dir)]
    for file in files:
        command += ["-f", str(file)]
    command += ["config", "--format", "json"]
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            env=dict(env),
            timeout=CONFIG_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError:
        raise RuntimeError("the docker CLI is not installed (Compose tasks need it)") from None
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"docker compose config took over {CONFIG_TIMEOUT_S:g} s") from None
    if done.returncode != 0:
        message = done.stderr.strip() or done.stdout.strip()
        if "is not a docker command" in message or "unknown shorthand flag" in message:
            raise RuntimeError(
                "Docker Compose v2 is not installed (`docker compose`); .ci/setup shows how"
            )
        raise ValueError(message.splitlines()[-1] if message else "docker compose config failed")
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def read_compose(
    task_path: Path,
    file: Path | None,
    *,
    main_build: Path | None,
    main_image: str | None,
    task_env: Mapping[str, str],
    variables: Mapping[str, str],
    overlays: list[Path],
) -> ComposeSpec:
    """Read and check a task's Compose file (with the run's overlay files after it; or
    those alone, around the task's own image); ComposeRefused names what cannot run."""
    environment_dir = task_path / "environment"
    if not environment_dir.is_dir():
        environment_dir = task_path
    files = [path for path in (file, *overlays) if path is not None]
    named = files[0]
    with tempfile.TemporaryDirectory(prefix="harbor-compose-") as scratch:
        # Harbor's base file: `main` from the task's Dockerfile or prebuilt image.
        base: dict[str, Any] = {}
        if main_build is not None:
            base = {"services": {"main": {"build": {"context": str(main_build)}}}}
        elif main_image is not None:
            base = {"services": {"main": {"image": main_image}}}
        base_file = Path(scratch) / "base.json"
        base_file.write_text(json.dumps(base or {"services": {}}))
        env = _interpolation_env(environment_dir, task_env, variables, main_build, main_image)
        try:
            config = run_config([base_file, *files], environment_dir, env)
        except ValueError as error:
            raise ComposeRefused(named, f"does not parse as Compose: {error}") from None
    return _check(task_path, named, config)


def _interpolation_env(
    environment_dir: Path,
    task_env: Mapping[str, str],
    variables: Mapping[str, str],
    main_build: Path | None,
    main_image: str | None,
) -> dict[str, str]:
    """Harbor's precedence: infrastructure variables, then the task's env, then this
    process's, then `environment/.env` (Compose reads it itself); `compose_variables` only
    fill names none of those set."""
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
    env = {
        name: value
        for name, value in variables.items()
        if name not in os.environ and name not in task_env and name not in in_dotenv
    }
    return {**env, **os.environ, **task_env, **infra}


def _check(task_path: Path, file: Path, config: dict[str, Any]) -> ComposeSpec:
    services: dict[str, Any] = config.get("services") or {}
    if "main" not in services:
        raise ComposeRefused(
            file,
            "no `main` service (the agent's sandbox): name one, or give the task an "
            "environment/Dockerfile or [environment].docker_image",
            "services.main",
        )
    for kind in ("networks", "volumes"):
        for key, value in (config.get(kind) or {}).items():
            if (value or {}).get("external"):
                raise ComposeRefused(
                    file,
                    f"external {kind[:-1]} {key!r} would be shared with other episodes; refused",
                    f"{kind}.{key}.external",
                )
    root = task_path.resolve()
    builds: dict[str, Path] = {}
    for name, service in services.items():
        where = f"services.{name}"
        for key, refused in (
            ("privileged", service.get("privileged") is True),
            ("network_mode", str(service.get("network_mode", "")) == "host"),
            ("pid", service.get("pid") == "host"),
            ("ipc", service.get("ipc") == "host"),
            ("userns_mode", service.get("userns_mode") == "host"),
        ):
            if refused:
                raise ComposeRefused(
                    file, f"{key}: {service[key]} reaches the host; refused", f"{where}.{key}"
                )
        for index, volume in enumerate(service.get("volumes") or []):
            if volume.get("type") == "bind":
                source = Path(str(volume.get("source", ""))).resolve()
                if source != root and root not in source.parents:
                    raise ComposeRefused(
                        file,
                        f"binds {volume.get('source')}, outside the task folder",
                        f"{where}.volumes[{index}]",
                    )
        build = service.get("build")
        if build:
            context = Path(str(build.get("context", "."))).resolve()
            if context != root and root not in context.parents:
                raise ComposeRefused(
                    file, f"builds {context}, outside the task folder", f"{where}.build"
                )
            unsupported = sorted(set(build) - {"context", "dockerfile"})
            if unsupported or build.get("dockerfile", "Dockerfile") != "Dockerfile":
                raise ComposeRefused(
                    file,
                    "only build.context (with its Dockerfile) is supported, not "
                    + ", ".join(unsupported or ["dockerfile"]),
                    f"{where}.build",
                )
            if not (context / "Dockerfile").is_file():
                raise ComposeRefused(file, f"{context}/Dockerfile is missing", f"{where}.build")
            builds[name] = context
        elif not service.get("image"):
            raise ComposeRefused(file, "has neither an image nor a build", where)
    return ComposeSpec(file, config, builds)


def episode_project(
    canonical: Mapping[str, Any],
    *,
    name: str,
    main_image: str,
    built: Mapping[str, str],
    labels: Mapping[str, str],
    main: Mapping[str, Any],
    internal: bool,
) -> dict[str, Any]:
    """The project one episode starts, made from the `canonical` configuration: `main`
    runs `main_image` with what `main` says (entrypoint, command, environment,
    working_dir, volumes, limits); built services run
    their built images; every container, network and volume carries `labels`; published
    host ports become ports the engine picks (parallel episodes never collide), and
    `container_name`s go (they would too). `internal`: no network beyond the project."""
    config: dict[str, Any] = json.loads(json.dumps(canonical))
    config["name"] = name
    services: dict[str, Any] = config["services"]
    for service_name, service in services.items():
        if service_name in built:
            service.pop("build", None)
            service["image"] = built[service_name]
        service.pop("container_name", None)
        service["labels"] = {**(service.get("labels") or {}), **labels}
        service["pull_policy"] = "never"
        for port in service.get("ports") or []:
            port.pop("published", None)
            port.pop("host_ip", None)
    target = services["main"]
    target.pop("build", None)
    target["image"] = main_image
    for key, value in main.items():
        if key == "environment":
            target["environment"] = {**(target.get("environment") or {}), **value}
        elif key == "volumes":
            target["volumes"] = [*(target.get("volumes") or []), *value]
        else:
            target[key] = value
    # Networks and named volumes are the episode's own (named after its project), never
    # shared with a parallel episode of the same task.
    networks = config.setdefault("networks", {})
    networks.setdefault("default", {})
    for key, network in networks.items():
        if not network.get("external"):
            network["name"] = f"{name}_{key}"
            network["labels"] = {**(network.get("labels") or {}), **labels}
            if internal:
                network["internal"] = True
    for key, volume in (config.get("volumes") or {}).items():
        if not volume.get("external"):
            volume["name"] = f"{name}_{key}"
            volume["labels"] = {**(volume.get("labels") or {}), **labels}
    return config
