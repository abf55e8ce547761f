"""What a task's Compose file may hold: every supported key with the check of its value.

A Compose file is read into this model and the project written out from it, so a key or a
value outside it never reaches the engine; it is refused, naming the file and the key. A
dataset fetched by reference is a stranger's code: nothing it writes may reach the host
(its files, devices, namespaces, kernel settings), the engine's own resources, or another
episode's.

`read_project` reads the canonical configuration `docker compose config` writes;
compose_source.py reads the task's own file before Compose does, for what Compose would
resolve and so hide (`include`, `extends` of another file, `env_file` paths).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from pytest_harbor.labels import LABEL_PREFIX

__all__ = [
    "RESERVED_LABEL_PREFIXES",
    "RESERVED_NAME_PREFIX",
    "SERVICE",
    "TOOLS_KEY",
    "ComposeRefused",
    "read_project",
]

#: Label keys a task may not set: ours (the reaper and the sweeps read them) and Compose's
#: (the engine finds a project's containers and its `main` by them).
RESERVED_LABEL_PREFIXES = (LABEL_PREFIX, "com.docker.compose.", "com.docker.")
#: Names of services, volumes, networks, secrets and configs a task may not give: the
#: engine adds its own under them (the trusted tools' volume is TOOLS_KEY).
RESERVED_NAME_PREFIX = "pytest-harbor"
TOOLS_KEY = RESERVED_NAME_PREFIX + "-tools"


class ComposeRefused(ValueError):
    """A Compose file that cannot run here; `key` names the place in it."""

    def __init__(self, file: Path, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.file = file
        self.key = key


@dataclass(frozen=True)
class Reading:
    """One file being read: where it is, the task folder every path must stay in, and the
    names the project declares (a reference to anything else is refused)."""

    file: Path
    root: Path
    services: frozenset[str] = frozenset()
    volumes: frozenset[str] = frozenset()
    networks: frozenset[str] = frozenset()
    secrets: frozenset[str] = frozenset()
    configs: frozenset[str] = frozenset()

    def refuse(self, key: str, message: str) -> NoReturn:
        raise ComposeRefused(self.file, message, key)

    def inside(self, key: str, value: Any, what: str, base: Path | None = None) -> str:
        """A path (from `base`, if relative) inside the task folder, symlinks followed;
        else refused."""
        if not isinstance(value, str) or not value:
            self.refuse(key, f"{what} must be a path, not {value!r}")
        path = ((base or Path.cwd()) / value).resolve()
        if path != self.root and self.root not in path.parents:
            self.refuse(key, f"{what} {value}, outside the task folder")
        return str(path)


Check = Callable[[Reading, Any, str], Any]
#: What a check returns for a key that is read and left out of the project.
_DROP = object()


# ---------------------------------------------------------------- leaves


def _scalar(reading: Reading, value: Any, key: str) -> Any:
    if isinstance(value, str | int | float | bool):
        return value
    reading.refuse(key, f"must be a single value, not {type(value).__name__}")


def _optional(check: Check) -> Check:
    def read(reading: Reading, value: Any, key: str) -> Any:
        return None if value is None else check(reading, value, key)

    return read


def _scalars(reading: Reading, value: Any, key: str) -> Any:
    """A single value or a list of them (`command`, `dns`, `tmpfs`, ...)."""
    if isinstance(value, list):
        return [_scalar(reading, item, f"{key}[{index}]") for index, item in enumerate(value)]
    return _scalar(reading, value, key)


def _boolean(reading: Reading, value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    reading.refuse(key, f"must be true or false, not {value!r}")


def _only(*allowed: Any, why: str = "") -> Check:
    def read(reading: Reading, value: Any, key: str) -> Any:
        if value in allowed:
            return value
        shown = ", ".join(repr(item) for item in allowed)
        reading.refuse(key, f"{value!r} is not supported (only {shown}){why}")

    return read


def _drop(reading: Reading, value: Any, key: str) -> Any:
    return _DROP


def _string_map(reading: Reading, value: Any, key: str) -> dict[str, Any]:
    """Names to values (`environment`, `extra_hosts` as a map); a value may be null."""
    if not isinstance(value, Mapping):
        reading.refuse(key, f"must be a mapping, not {type(value).__name__}")
    return {
        str(name): _optional(_scalar)(reading, item, f"{key}.{name}")
        for name, item in value.items()
    }


def _environment(reading: Reading, value: Any, key: str) -> dict[str, Any]:
    """`environment`: a name with no value is left out. Compose would fill it at `up`
    from its own environment; the file's `${NAME}`s have read all a task may."""
    entries = _string_map(reading, value, key)
    return {name: item for name, item in entries.items() if item is not None}


def _labels(reading: Reading, value: Any, key: str) -> dict[str, Any]:
    labels = _string_map(reading, value, key)
    for name in labels:
        if name.startswith(RESERVED_LABEL_PREFIXES):
            reading.refuse(
                f"{key}.{name}",
                f"the label {name} is the engine's own (what it cleans up and finds by); "
                "a task may not set it",
            )
    return labels


# ---------------------------------------------------------------- structure


def fields(table: Mapping[str, Check], refused: Mapping[str, str] | None = None) -> Check:
    """A mapping whose keys are those of `table` (each read by its check) or extensions
    (`x-`, left out); a key of `refused` is refused with its reason, any other as not
    supported."""

    def read(reading: Reading, value: Any, key: str) -> dict[str, Any]:
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            reading.refuse(key, f"must be a mapping, not {type(value).__name__}")
        out: dict[str, Any] = {}
        for name, item in value.items():
            name = str(name)
            where = f"{key}.{name}" if key else name
            if name in table:
                checked = table[name](reading, item, where)
                if checked is not _DROP:
                    out[name] = checked
            elif name.startswith("x-"):
                continue
            elif refused is not None and name in refused:
                reading.refuse(where, f"{name} {refused[name]}; refused")
            else:
                reading.refuse(
                    where,
                    f"{name} is not supported here (supported: {', '.join(sorted(table))})",
                )
        return out

    return read


def _map_of(check: Check) -> Check:
    def read(reading: Reading, value: Any, key: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            reading.refuse(key, f"must be a mapping, not {type(value).__name__}")
        return {str(name): check(reading, item, f"{key}.{name}") for name, item in value.items()}

    return read


def _named(check: Check) -> Check:
    """The project's own services, volumes, networks, secrets or configs: none named
    like what the engine adds (RESERVED_NAME_PREFIX)."""

    def read(reading: Reading, value: Any, key: str) -> dict[str, Any]:
        for name in value if isinstance(value, Mapping) else ():
            if str(name).lower().startswith(RESERVED_NAME_PREFIX):
                reading.refuse(
                    f"{key}.{name}",
                    f"the name {name} is the engine's own (it adds its trusted tools' "
                    f"volume as {TOOLS_KEY}); a task may not use a name beginning "
                    f"{RESERVED_NAME_PREFIX}",
                )
        entries: dict[str, Any] = _map_of(check)(reading, value, key)
        return entries

    return read


def _list_of(check: Check) -> Check:
    def read(reading: Reading, value: Any, key: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            reading.refuse(key, f"must be a list, not {type(value).__name__}")
        return [check(reading, item, f"{key}[{index}]") for index, item in enumerate(value)]

    return read


def _declared(kind: str) -> Check:
    """A name the project declares at its top level (`services`, `volumes`, ...)."""

    def read(reading: Reading, value: Any, key: str) -> str:
        if not isinstance(value, str) or value not in getattr(reading, kind):
            reading.refuse(key, f"{value!r} is not one of the project's own {kind}")
        return value

    return read


def _keyed_by(kind: str, check: Check) -> Check:
    """A mapping from names the project declares (`depends_on`, a service's `networks`)."""

    def read(reading: Reading, value: Any, key: str) -> dict[str, Any]:
        entries: dict[str, Any] = _map_of(check)(reading, value, key)
        for name in entries:
            _declared(kind)(reading, name, f"{key}.{name}")
        return entries

    return read


def _namespace(*own: str) -> Check:
    """`network_mode`, `pid`, `ipc`: a mode of the container's own (`own`) or another
    service of the project's (`service:<name>`); the host's or another container's never."""

    def read(reading: Reading, value: Any, key: str) -> str:
        text = str(value)
        if text in own:
            return text
        kind, _, name = text.partition(":")
        if kind == "service" and name in reading.services:
            return text
        allowed = ", ".join([*own, "service:<a service of the project>"])
        reading.refuse(
            key, f"{text} shares a namespace of the host or another container (only {allowed})"
        )

    return read


def _links(reading: Reading, value: Any, key: str) -> list[str]:
    """`links` (`service` or `service:alias`) and `volumes_from` (`service`, `service:ro`):
    services of the project, never a container outside it."""
    out = []
    for index, entry in enumerate(_list_of(_scalar)(reading, value, key)):
        name = str(entry).split(":", 1)[0]
        if name not in reading.services:
            reading.refuse(f"{key}[{index}]", f"{entry} is not a service of the project")
        out.append(str(entry))
    return out


def _not_negative(reading: Reading, value: Any, key: str) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    reading.refuse(key, f"{value!r}: only 0 to 1000 (a lower score shields it from the host's OOM)")


def _not_privileged(reading: Reading, value: Any, key: str) -> Any:
    if value is False:
        return value
    reading.refuse(key, f"privileged: {value} reaches the host; refused")


def _build(reading: Reading, value: Any, key: str) -> Any:
    """A service's `build`: its own allow-list is compose.py's (the builder's options)."""
    if isinstance(value, Mapping):
        return dict(value)
    reading.refuse(key, f"must be a mapping, not {type(value).__name__}")


# ---------------------------------------------------------------- mounts

_BIND_OPTIONS = fields(
    {
        "create_host_path": _boolean,
        "propagation": _only("rprivate", "private"),
        "selinux": _only("z", "Z"),
    }
)
_MOUNT_COMMON: dict[str, Check] = {
    "type": _scalar,
    "target": _scalar,
    "read_only": _boolean,
    "consistency": _scalar,
}
_BIND = fields(
    {
        **_MOUNT_COMMON,
        "source": lambda reading, value, key: reading.inside(key, value, "binds"),
        "bind": _BIND_OPTIONS,
    }
)
_VOLUME = fields(
    {
        **_MOUNT_COMMON,
        "source": _declared("volumes"),
        "volume": fields({"nocopy": _boolean, "subpath": _scalar}),
    }
)
_TMPFS = fields({**_MOUNT_COMMON, "tmpfs": fields({"size": _scalar, "mode": _scalar})})


def _mount(reading: Reading, value: Any, key: str) -> dict[str, Any]:
    """A service's volume: a folder of the task (always read-only: every episode of the
    run shares it), a volume of the project, or a tmpfs."""
    kind = value.get("type") if isinstance(value, Mapping) else None
    if kind == "bind":
        mount: dict[str, Any] = _BIND(reading, value, key)
        mount["read_only"] = True
        return mount
    if kind == "volume":
        return dict(_VOLUME(reading, value, key))
    if kind == "tmpfs":
        return dict(_TMPFS(reading, value, key))
    reading.refuse(
        key,
        f"a {kind} mount is not supported (a folder of the task, a volume of the project, "
        "or a tmpfs)",
    )


# ---------------------------------------------------------------- the model

#: Keys refused in a service, with why: each reaches the host, its devices or kernel, or
#: another container.
SERVICE_REFUSED = {
    "cap_add": "adds kernel capabilities, which reach the host",
    "security_opt": "loosens the container's seccomp, AppArmor or SELinux confinement",
    "devices": "hands the host's devices to the container",
    "device_cgroup_rules": "lets the container use the host's devices",
    "gpus": "hands the host's GPUs to the container",
    "sysctls": "sets kernel parameters",
    "cgroup_parent": "places the container in a cgroup of the host's",
    "userns_mode": "changes the container's user namespace",
    "uts": "shares a namespace of the host",
    "runtime": "chooses another container runtime",
    "isolation": "chooses another isolation technology",
    "logging": "sends the container's output to a logging driver the host runs",
    "storage_opt": "sets options of the engine's storage driver",
    "blkio_config": "weighs the host's block devices",
    "cpuset": "pins the container to CPUs of the host",
    "oom_kill_disable": "keeps the host's OOM killer off the container",
    "external_links": "links containers outside the project",
    "credential_spec": "reads a credential spec of the host",
    "label_file": "reads labels from a file",
}

SERVICE: dict[str, Check] = {
    # Compose has read it into `environment` (check_source checked where it lies).
    "env_file": _drop,
    "image": _scalar,
    "build": _build,
    "command": _optional(_scalars),
    "entrypoint": _optional(_scalars),
    "environment": _environment,
    "working_dir": _scalar,
    "user": _scalar,
    "hostname": _scalar,
    "domainname": _scalar,
    "stop_signal": _scalar,
    "stop_grace_period": _scalar,
    "platform": _scalar,
    "mac_address": _scalar,
    "restart": _scalar,
    "pull_policy": _scalar,
    "container_name": _scalar,
    "shm_size": _scalar,
    "mem_limit": _scalar,
    "memswap_limit": _scalar,
    "mem_reservation": _scalar,
    "mem_swappiness": _scalar,
    "cpus": _scalar,
    "cpu_shares": _scalar,
    "cpu_quota": _scalar,
    "cpu_period": _scalar,
    "cpu_count": _scalar,
    "cpu_percent": _scalar,
    "pids_limit": _scalar,
    "oom_score_adj": _not_negative,
    "init": _boolean,
    "tty": _boolean,
    "stdin_open": _boolean,
    "read_only": _boolean,
    "attach": _boolean,
    "privileged": _not_privileged,
    "expose": _scalars,
    "ports": _list_of(
        fields(
            {
                "target": _scalar,
                "published": _scalar,
                "host_ip": _scalar,
                "protocol": _scalar,
                "mode": _scalar,
                "name": _scalar,
                "app_protocol": _scalar,
            }
        )
    ),
    "healthcheck": fields(
        {
            "test": _scalars,
            "interval": _scalar,
            "timeout": _scalar,
            "retries": _scalar,
            "start_period": _scalar,
            "start_interval": _scalar,
            "disable": _boolean,
        }
    ),
    "depends_on": _keyed_by(
        "services",
        fields({"condition": _scalar, "restart": _boolean, "required": _boolean}),
    ),
    "labels": _labels,
    "networks": _keyed_by(
        "networks", _optional(fields({"aliases": _scalars, "priority": _scalar}))
    ),
    "volumes": _list_of(_mount),
    "tmpfs": _scalars,
    "extra_hosts": lambda reading, value, key: (
        _string_map(reading, value, key)
        if isinstance(value, Mapping)
        else _scalars(reading, value, key)
    ),
    "dns": _scalars,
    "dns_search": _scalars,
    "dns_opt": _scalars,
    "ulimits": _map_of(
        lambda reading, value, key: (
            fields({"soft": _scalar, "hard": _scalar})(reading, value, key)
            if isinstance(value, Mapping)
            else _scalar(reading, value, key)
        )
    ),
    "cap_drop": _scalars,
    "group_add": _scalars,
    "profiles": _scalars,
    "links": _links,
    "volumes_from": _links,
    "network_mode": _namespace("none"),
    "pid": _optional(_namespace()),
    "ipc": _namespace("private", "shareable"),
    "cgroup": _only("private"),
    "secrets": _list_of(
        fields(
            {
                "source": _declared("secrets"),
                "target": _scalar,
                "uid": _scalar,
                "gid": _scalar,
                "mode": _scalar,
            }
        )
    ),
    "configs": _list_of(
        fields(
            {
                "source": _declared("configs"),
                "target": _scalar,
                "uid": _scalar,
                "gid": _scalar,
                "mode": _scalar,
            }
        )
    ),
    "deploy": fields(
        {
            "resources": fields(
                {
                    "limits": fields({"cpus": _scalar, "memory": _scalar, "pids": _scalar}),
                    "reservations": fields({"cpus": _scalar, "memory": _scalar}),
                }
            ),
            "restart_policy": fields(
                {"condition": _scalar, "delay": _scalar, "max_attempts": _scalar, "window": _scalar}
            ),
            "placement": _only({}, why=": placement is for a swarm"),
        }
    ),
}


def _external(kind: str) -> Check:
    def read(reading: Reading, value: Any, key: str) -> Any:
        if value:
            name = key.split(".")[1]
            reading.refuse(
                key, f"external {kind} {name!r} would be shared with other episodes; refused"
            )
        return _DROP

    return read


_NETWORK = fields(
    {
        "name": _drop,  # each episode names its own
        "driver": _only("bridge"),
        "internal": _boolean,
        "attachable": _boolean,
        "enable_ipv6": _boolean,
        "labels": _labels,
        # The engine picks the addresses: chosen ones could clash with the host's networks.
        "ipam": _only({}),
        "external": _external("network"),
    },
    {"driver_opts": "sets options of the host's network driver (its bridge, its interfaces)"},
)
_VOLUME_DECLARED = fields(
    {
        "name": _drop,  # each episode names its own
        "driver": _only("local"),
        "labels": _labels,
        "external": _external("volume"),
    },
    {"driver_opts": "mounts what its options name: a folder of the host (o: bind) or a share"},
)


def _file_source(reading: Reading, value: Any, key: str) -> str:
    return reading.inside(key, value, "reads")


_SECRET = fields(
    {"name": _drop, "file": _file_source, "external": _external("secret")},
    {"environment": "reads a variable of this machine"},
)
_CONFIG = fields(
    {"name": _drop, "file": _file_source, "content": _scalar, "external": _external("config")},
    {"environment": "reads a variable of this machine"},
)
PROJECT = {
    "name": _drop,  # each episode names its own
    "services": _named(fields(SERVICE, SERVICE_REFUSED)),
    "networks": _named(_NETWORK),
    "volumes": _named(_VOLUME_DECLARED),
    "secrets": _named(_SECRET),
    "configs": _named(_CONFIG),
}
TOP_LEVEL_REFUSED = {
    "include": "merges other Compose files, which may lie outside the task folder",
    "models": "runs models the host provides",
}


def _names(config: Mapping[str, Any], kind: str) -> frozenset[str]:
    found = config.get(kind)
    return frozenset(str(name) for name in found) if isinstance(found, Mapping) else frozenset()


def read_project(task_path: Path, file: Path, config: Mapping[str, Any]) -> dict[str, Any]:
    """The canonical configuration `config` (of a task at `task_path`, from `file`) read
    into the model: the project written out from it, or ComposeRefused naming the first
    key outside it."""
    reading = Reading(
        file,
        task_path.resolve(),
        **{kind: _names(config, kind) for kind in PROJECT if kind != "name"},
    )
    project: dict[str, Any] = fields(PROJECT, TOP_LEVEL_REFUSED)(reading, config, "")
    return project
