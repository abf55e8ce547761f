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
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_harbor.sandboxes.base import BuildOptions
from pytest_harbor.sandboxes.compose_model import (
    RESERVED_LABEL_PREFIXES,
    RESERVED_NAME_PREFIX,
    ComposeRefused,
    read_project,
)
from pytest_harbor.sandboxes.compose_source import check_source
from pytest_harbor.sandboxes.docker.engine import CLI_VARIABLES
from pytest_harbor.sandboxes.images import image_tag_for
from pytest_harbor.tasks.dockerfiles import MAX_DOCKERFILE_BYTES, check_dockerfile_text

__all__ = [
    "ComposeRefused",
    "ComposeSpec",
    "EgressLink",
    "ServiceBuild",
    "check_config",
    "episode_project",
    "project_name",
    "read_compose",
    "run_config",
]

#: Compose runs get this long for `config`; `up` has the sandbox's own start limit.
CONFIG_TIMEOUT_S = 60.0
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
class ServiceBuild:
    """A service's `build`: its context (a folder of the task) and its options."""

    context: Path
    options: BuildOptions = field(default_factory=BuildOptions)


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
                "Docker Compose v2 is not installed (`docker compose`); "
                ".ci/setup --tests installs it"
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
    host: Mapping[str, str] | None = None,
) -> ComposeSpec:
    """Read and check a task's Compose file (with the run's overlay files after it; or
    those alone, around the task's own image); ComposeRefused names what cannot run.
    Its `${NAME}`s read `host` (the host variables the run allows), never the rest of
    this process's environment."""
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
            config = run_config([base_file, *files], environment_dir, env)
        except ValueError as error:
            raise ComposeRefused(named, f"does not parse as Compose: {error}") from None
    return check_config(task_path, named, config)


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
    process = {name: os.environ[name] for name in CLI_VARIABLES if name in os.environ}
    process.update(host)
    env = {
        name: value
        for name, value in variables.items()
        if name not in process and name not in task_env and name not in in_dotenv
    }
    return {**env, **process, **task_env, **infra}


def check_config(task_path: Path, file: Path, config: Mapping[str, Any]) -> ComposeSpec:
    """The canonical configuration of the task at `task_path` read into the model of what
    a Compose file may hold (compose_model.py) and written out from it: ComposeRefused
    names the first key of `file` that cannot run here."""
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
            builds[name] = _service_build(file, root, f"{where}.build", build)
        elif not service.get("image"):
            raise ComposeRefused(file, "has neither an image nor a build", where)
    return ComposeSpec(file, project, builds)


#: Build keys that cannot change the image and that this builder leaves aside: a cache to
#: read from (the engine's own cache and the content hash serve) and further names for
#: the image (the service runs it by its content hash).
_BUILD_KEYS_IGNORED = frozenset({"cache_from", "tags", "provenance", "sbom"})
#: Build keys refused when set, with why: each reaches beyond the task folder and the
#: engine's own build, or cannot be given to both builders (BuildKit and the classic one)
#: alike.
_BUILD_KEYS_REFUSED = {
    "ssh": "hands this machine's SSH agent or keys to the build",
    "secrets": "mounts secrets into the build, which the classic builder cannot",
    "additional_contexts": "adds named contexts, which the classic builder cannot take",
    "cache_to": "writes the build cache outside the engine",
    "privileged": "runs the build's steps privileged, which reaches the host",
    "entitlements": "grants the build's steps host privileges",
    "ulimits": "sets limits on the build's steps, which the classic builder cannot",
    "shm_size": "sizes /dev/shm for the build's steps, which BuildKit ignores on some engines",
}


def _service_build(file: Path, root: Path, where: str, build: Mapping[str, Any]) -> ServiceBuild:
    """A service's canonical `build` (as `docker compose config` writes it; `where` is its
    key path) as a context and options, checked: ComposeRefused names the key that cannot
    be honoured here. Compose has already resolved an argument given without a value (from
    the environment and `.env`) or left it out when none set it."""
    context = Path(str(build.get("context", "."))).resolve()
    if context != root and root not in context.parents:
        raise ComposeRefused(file, f"builds {context}, outside the task folder", f"{where}.context")
    options: dict[str, Any] = {}
    for key, value in build.items():
        if key in _BUILD_KEYS_REFUSED and value:
            raise ComposeRefused(
                file, f"{key} {_BUILD_KEYS_REFUSED[key]}; refused (remove it)", f"{where}.{key}"
            )
        # An empty or false option is the default; `x-` keys are extensions.
        read_apart = key in ("context", "dockerfile") or key in _BUILD_KEYS_IGNORED
        if not value or read_apart or key.startswith("x-"):
            continue
        if key in ("dockerfile_inline", "target"):
            options[key] = str(value)
        elif key == "args":
            options[key] = _pairs(value)
            for name, _ in options[key]:
                if name.upper().startswith("BUILDKIT_"):
                    raise ComposeRefused(
                        file,
                        f"the build argument {name} sets how BuildKit builds (its frontend, "
                        "its cache); a task may not set it",
                        f"{where}.args.{name}",
                    )
        elif key == "labels":
            options[key] = _pairs(value)
            for label, _ in options[key]:
                if label.startswith(RESERVED_LABEL_PREFIXES):
                    raise ComposeRefused(
                        file,
                        f"the label {label} is the engine's own; a task may not set it",
                        f"{where}.labels.{label}",
                    )
        elif key == "extra_hosts":
            options[key] = _hosts(value)
        elif key in ("no_cache", "pull"):
            options[key] = True
        elif key == "network":
            options[key] = _build_network(file, f"{where}.{key}", str(value))
        elif key == "platforms":
            options["platform"] = _one_platform(file, f"{where}.{key}", list(value or []))
        elif key == "isolation":
            if str(value) != "default":
                raise ComposeRefused(
                    file,
                    f"isolation {value} is for Windows containers, which are refused",
                    f"{where}.{key}",
                )
        else:
            raise ComposeRefused(
                file,
                f"build option {key} is not supported (remove it; supported: context, "
                "dockerfile, dockerfile_inline, args, target, labels, extra_hosts, "
                "network, platforms, no_cache, pull)",
                f"{where}.{key}",
            )
    dockerfile = _dockerfile(file, root, where, context, build, "dockerfile_inline" in options)
    named = dockerfile or context / "Dockerfile"
    text = options.get("dockerfile_inline")
    if text is None and named.stat().st_size > MAX_DOCKERFILE_BYTES:
        raise ComposeRefused(file, f"{named} is over {MAX_DOCKERFILE_BYTES} bytes", f"{where}")
    problem = check_dockerfile_text(text or named.read_text(errors="replace"))
    if problem is not None:
        shown = "its dockerfile_inline" if text is not None else str(named)
        raise ComposeRefused(file, f"{shown}, {problem}", f"{where}.dockerfile")
    return ServiceBuild(context, BuildOptions(dockerfile=dockerfile, **options))


def _dockerfile(
    file: Path,
    root: Path,
    where: str,
    context: Path,
    build: Mapping[str, Any],
    inline: bool,
) -> Path | None:
    """The Dockerfile a build names, when not the context's own `Dockerfile`: a file in
    the task folder (a path is from the context)."""
    named = build.get("dockerfile")
    if inline:
        if named not in (None, "Dockerfile"):
            raise ComposeRefused(
                file, "names both a dockerfile and a dockerfile_inline", f"{where}.dockerfile"
            )
        return None
    path = (context / str(named or "Dockerfile")).resolve()
    if path != root and root not in path.parents:
        raise ComposeRefused(
            file, f"names the Dockerfile {path}, outside the task folder", f"{where}.dockerfile"
        )
    if not path.is_file():
        raise ComposeRefused(file, f"{path} is missing", f"{where}.dockerfile")
    return None if path == (context / "Dockerfile").resolve() else path


def _pairs(value: Any) -> tuple[tuple[str, str], ...]:
    """A Compose map or list (`["A=1", "B"]`) as sorted `(name, value)` pairs. An entry
    with no value is left out: Compose's rule for a build argument nothing sets."""
    if isinstance(value, Mapping):
        entries = [(str(name), item) for name, item in value.items()]
    else:
        entries = [
            (name, item if found else None)
            for name, found, item in (str(entry).partition("=") for entry in value or [])
        ]
    return tuple(sorted((name, str(item)) for name, item in entries if item is not None))


def _hosts(value: Any) -> tuple[tuple[str, str], ...]:
    """`extra_hosts` as sorted `(host, address)` pairs: a map, or a list of `host=address`
    (Compose's canonical form) or `host:address` (an IPv6 address keeps its colons)."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(host), str(address)) for host, address in value.items()))
    pairs = []
    for entry in value or []:
        text = str(entry)
        host, _, address = text.partition("=" if "=" in text else ":")
        pairs.append((host, address))
    return tuple(sorted(pairs))


def _build_network(file: Path, key: str, network: str) -> str | None:
    if network == "default":
        return None
    if network == "none":
        return network
    if network == "host":
        raise ComposeRefused(file, "network: host reaches the host; refused", key)
    raise ComposeRefused(
        file,
        f"network {network!r}: a build joins none of the project's networks (they exist "
        "once the episode starts); use default or none",
        key,
    )


def _one_platform(file: Path, key: str, platforms: list[Any]) -> str | None:
    if len(platforms) > 1:
        raise ComposeRefused(
            file, "names several platforms; an engine holds one image per name", key
        )
    return str(platforms[0]) if platforms else None


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
            if internal or egress is not None:
                network["internal"] = True
                network["driver_opts"] = {NO_HOST_ADDRESS: "true"}
    if egress is not None:
        _join_egress(services, networks, egress)
    for key, volume in (config.get("volumes") or {}).items():
        if not volume.get("external"):
            volume["name"] = f"{name}_{key}"
            volume["labels"] = {**(volume.get("labels") or {}), **labels}
    return config


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
