"""task.toml as pydantic models: Harbor 1.4's tables, fields, defaults and rules."""

from __future__ import annotations

import ipaddress
import math
import re
import unicodedata
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pytest_harbor.display import unshowable
from pytest_harbor.tasks.typos import closest

__all__ = [
    "AgentConfig",
    "ArtifactConfig",
    "EnvironmentConfig",
    "HealthcheckConfig",
    "MCPServerConfig",
    "PackageInfo",
    "SolutionConfig",
    "StepAgentConfig",
    "StepConfig",
    "StepVerifierConfig",
    "TPUConfig",
    "TaskConfig",
    "VerifierCollectConfig",
    "VerifierConfig",
    "known_instead",
    "unknown_keys",
]

#: The uid and gid the sandbox's keep-alive runs as (sandboxes/base.py): no task's user or
#: group may be it, or its processes could end the sandbox or share the keep-alive's.
RESERVED_ID = 65533
_USER_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\Z")
#: The highest uid or gid the kernel takes ((uid_t) -1 means "no change").
_MAX_ID = 2**32 - 2


def _checked_user(value: str | int) -> str | int:
    """A user as the engine can run it: a name or uid, with a group name or gid or not;
    names from an allow-list of characters; numbers in range and never RESERVED_ID."""
    parts = str(value).split(":") if isinstance(value, str) else [str(int(value))]
    if len(parts) > 2 or not all(_USER_PART.match(part) for part in parts):
        raise ValueError(
            "must be a user name or uid, with `:group` or `:gid` or not (names of letters, "
            "digits, `_`, `.` and `-`, up to 64 of them)"
        )
    for part in parts:
        if part.isdigit() and int(part) > _MAX_ID:
            raise ValueError(f"{part} is not a uid or gid (at most {_MAX_ID})")
        if part.isdigit() and int(part) == RESERVED_ID:
            raise ValueError(
                f"{RESERVED_ID} is the id of the sandbox's own keep-alive, which no task's "
                "user or group may share"
            )
    return value


User = Annotated[str | int, AfterValidator(_checked_user)]
NetworkMode = Literal["public", "no-network", "allowlist"]
VerifierMode = Literal["shared", "separate"]


class _Table(BaseModel):
    """A TOML table: unknown keys are kept aside so the loader can list them."""

    model_config = ConfigDict(extra="allow", frozen=True)


def _finite(value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


# ---------------------------------------------------------------------------- network policy

_HOSTNAME = re.compile(
    r"^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$"
)


def _normalise_host(entry: str) -> str:
    """A hostname, `*.suffix` wildcard, IP or CIDR; lowercased, trailing dot removed."""
    host = entry.strip().lower().rstrip(".")
    if _is_network(host):
        return host
    if "://" in host or "/" in host:
        raise ValueError(f"allowed_hosts entry {entry!r} must be a host, IP or CIDR, not a URL")
    if ":" in host:
        raise ValueError(f"allowed_hosts entry {entry!r} must not name a port")
    if not _HOSTNAME.match(host):
        raise ValueError(f"allowed_hosts entry {entry!r} is not a valid host name")
    return host


def _is_network(host: str) -> bool:
    try:
        ipaddress.ip_network(host, strict=False)
    except ValueError:
        return False
    return True


def _allowed_hosts(value: list[str] | None, info: ValidationInfo) -> list[str] | None:
    """Normalised hosts, and only with `network_mode = "allowlist"` (declared before)."""
    if value is None:
        return None
    if info.data.get("network_mode") != "allowlist":
        raise ValueError('allowed_hosts is only valid with network_mode = "allowlist"')
    return [_normalise_host(entry) for entry in value]


class _PhaseNetworkPolicy(_Table):
    """A phase's own network policy; None inherits the environment's."""

    network_mode: NetworkMode | None = None
    allowed_hosts: list[str] | None = None

    _check_hosts = field_validator("allowed_hosts")(_allowed_hosts)


# ---------------------------------------------------------------------------- small tables


_PACKAGE_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]*/[a-zA-Z0-9][a-zA-Z0-9._-]*$")


class PackageInfo(_Table):
    """`[task]`: the registry identity of a task (not its id; the folder name is the id)."""

    name: str
    version: str | None = Field(default=None, min_length=1)
    description: str = ""
    authors: list[dict[str, str]] = []
    keywords: list[str] = []

    @field_validator("name")
    @classmethod
    def _org_slash_name(cls, value: str) -> str:
        if not _PACKAGE_NAME.match(value):
            raise ValueError(
                f"{value!r} must be 'org/name' (letters, digits, '.', '_', '-'; each part "
                "starting with a letter or digit)"
            )
        if ".." in value:
            raise ValueError(f"{value!r} must not contain '..'")
        return value


class HealthcheckConfig(_Table):
    """A command run until it succeeds once, before the agent starts."""

    command: str
    interval_sec: float = 5.0
    timeout_sec: float = 30.0
    start_period_sec: float = 0.0
    start_interval_sec: float = 5.0
    retries: int = 3


class TPUConfig(_Table):
    type: str
    topology: str

    @field_validator("topology")
    @classmethod
    def _grid(cls, value: str) -> str:
        if not re.match(r"^\d+x\d+(x\d+)?$", value):
            raise ValueError(f"topology {value!r} must look like 2x2 or 2x2x4")
        return value


_CREDENTIAL_HEADER = re.compile(r"auth|token|key|secret|password|cookie", re.IGNORECASE)


class MCPServerConfig(_Table):
    """An MCP server the task offers its agent."""

    name: str
    transport: Literal["sse", "streamable-http", "stdio"] = "sse"
    url: str | None = None
    command: str | None = None
    args: list[str] = []
    headers: dict[str, str] = {}

    @model_validator(mode="before")
    @classmethod
    def _http_alias(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("transport") == "http":
            data = {**data, "transport": "streamable-http"}
        return data

    @model_validator(mode="after")
    def _transport_rules(self) -> MCPServerConfig:
        if self.transport == "stdio":
            if not self.command:
                raise ValueError(f"MCP server {self.name!r}: transport stdio needs a command")
            if self.headers:
                raise ValueError(f"MCP server {self.name!r}: transport stdio takes no headers")
        elif not self.url:
            raise ValueError(f"MCP server {self.name!r}: transport {self.transport} needs a url")
        for header, value in self.headers.items():
            if _CREDENTIAL_HEADER.search(header) and "${" not in value:
                raise ValueError(
                    f"MCP server {self.name!r}: header {header} carries a credential; write it "
                    "as ${VARIABLE} so it is not stored in task.toml"
                )
        return self


# ---------------------------------------------------------------------------- environment

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([GgMmKk])[Bb]?\s*$")
_SIZE_FACTORS = {"g": 1024.0, "m": 1.0, "k": 1.0 / 1024.0}


def _megabytes(text: object, key: str) -> int:
    """Harbor's legacy sizes: "2G" -> 2048, "512M" -> 512, "1024K" -> 1."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    match = _SIZE.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"{key} must be a size such as '2G', '512M' or '1024K', got {text!r}")
    return int(float(match.group(1)) * _SIZE_FACTORS[match.group(2).lower()])


class EnvironmentConfig(_Table):
    """`[environment]` (and `[verifier.environment]`): image, resources, network, workdir."""

    build_timeout_sec: float = Field(default=600.0, gt=0)
    docker_image: str | None = None
    os: Literal["linux", "windows"] = "linux"
    cpus: float | None = Field(default=None, gt=0)
    memory_mb: int | None = Field(default=None, gt=0)
    storage_mb: int | None = Field(default=None, gt=0)
    gpus: int | None = Field(default=None, ge=0)
    gpu_types: list[str] | None = None
    tpu: TPUConfig | None = None
    mcp_servers: list[MCPServerConfig] = []
    env: dict[str, str] = {}
    skills_dir: str | None = None
    healthcheck: HealthcheckConfig | None = None
    workdir: str | None = None
    network_mode: NetworkMode = "public"
    allowed_hosts: list[str] | None = None

    _check_numbers = field_validator("build_timeout_sec", "cpus")(_finite)

    @model_validator(mode="before")
    @classmethod
    def _legacy_spellings(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for legacy, modern in (("memory", "memory_mb"), ("storage", "storage_mb")):
            if legacy not in data:
                continue
            converted = _megabytes(data.pop(legacy), legacy)
            if modern in data and data[modern] != converted:
                raise ValueError(
                    f"{legacy} = {converted} MB conflicts with {modern} = {data[modern]}; "
                    f"keep only {modern}"
                )
            data[modern] = converted
        if isinstance(data.get("os"), str):
            data["os"] = data["os"].lower()
        # Deprecated: read only when neither network_mode nor allowed_hosts is set.
        allow_internet = data.pop("allow_internet", None)
        if (
            allow_internet is not None
            and "network_mode" not in data
            and "allowed_hosts" not in data
        ):
            data["network_mode"] = "public" if allow_internet else "no-network"
        return data

    @field_validator("cpus")
    @classmethod
    def _whole_cpus(cls, value: float | None) -> float | None:
        # Harbor collapses a whole number of CPUs to an int.
        if value is not None and value.is_integer():
            return int(value)
        return value

    @field_validator("workdir")
    @classmethod
    def _absolute_workdir(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"must be an absolute path inside the sandbox, got {value!r}")
        return value

    _check_hosts = field_validator("allowed_hosts")(_allowed_hosts)

    @field_validator("mcp_servers")
    @classmethod
    def _unique_servers(cls, value: list[MCPServerConfig]) -> list[MCPServerConfig]:
        names = [server.name for server in value]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"MCP server names must be unique: {', '.join(repeated)} repeats")
        return value


# ---------------------------------------------------------------------------- agent, verifier


class AgentConfig(_PhaseNetworkPolicy):
    """`[agent]`: budget and user of the agent (or the oracle's solve.sh)."""

    timeout_sec: float | None = Field(default=None, gt=0)
    user: User | None = None

    _check_timeout = field_validator("timeout_sec")(_finite)


_SERVICE = r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$"


class VerifierCollectConfig(_Table):
    """`[[verifier.collect]]`: a command run after the agent, before verification."""

    command: str
    service: str = Field(default="main", pattern=_SERVICE)
    timeout_sec: float = Field(default=60.0, gt=0)
    user: User | None = None


class VerifierConfig(_PhaseNetworkPolicy):
    """`[verifier]`: how tests/test.sh runs, and where."""

    timeout_sec: float = Field(default=600.0, gt=0)
    env: dict[str, str] = {}
    user: User | None = None
    environment_mode: VerifierMode | None = None
    environment: EnvironmentConfig | None = None
    collect: list[VerifierCollectConfig] = []

    _check_timeout = field_validator("timeout_sec")(_finite)

    @field_validator("environment")
    @classmethod
    def _shared_has_no_environment(
        cls, value: EnvironmentConfig | None, info: ValidationInfo
    ) -> EnvironmentConfig | None:
        if value is not None and info.data.get("environment_mode") == "shared":
            raise ValueError(
                'environment_mode = "shared" cannot be combined with [verifier.environment]'
            )
        return value

    @property
    def mode(self) -> VerifierMode:
        """The declared mode, else separate when a verifier environment is given."""
        if self.environment_mode is not None:
            return self.environment_mode
        return "separate" if self.environment is not None else "shared"


class SolutionConfig(_Table):
    """`[solution]`: environment for the oracle's solve.sh."""

    env: dict[str, str] = {}


class ArtifactConfig(_Table):
    """A path copied out of the agent's sandbox after it finishes."""

    source: str
    destination: str | None = None
    exclude: list[str] = []
    service: str | None = Field(default=None, pattern=_SERVICE)

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        if ".." in value.split("/"):
            raise ValueError(f"artifact source {value!r} must not contain '..'")
        return value

    @field_validator("destination")
    @classmethod
    def _destination(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if value.startswith("/") or "\\" in value or ".." in value.split("/"):
            raise ValueError(
                f"artifact destination {value!r} must be a relative path without '..' or '\\'"
            )
        parts = [part for part in value.split("/") if part not in ("", ".")]
        if parts[:1] == ["manifest.json"] or not parts:
            raise ValueError(
                "artifact destination manifest.json is reserved"
                if parts
                else f"artifact destination {value!r} names no file or folder"
            )
        return value

    @model_validator(mode="after")
    def _sidecar_source_absolute(self) -> ArtifactConfig:
        if self.service not in (None, "main") and not self.source.startswith("/"):
            raise ValueError(
                f"artifact source {self.source!r} of service {self.service!r} must be absolute"
            )
        return self


def _artifact_list(value: Any) -> Any:
    if isinstance(value, list):
        return [{"source": entry} if isinstance(entry, str) else entry for entry in value]
    return value


# ---------------------------------------------------------------------------- steps


class StepAgentConfig(_PhaseNetworkPolicy):
    """`[steps.agent]`: unset fields fall back to the task's `[agent]`."""

    timeout_sec: float | None = Field(default=None, gt=0)
    user: User | None = None


class StepVerifierConfig(_PhaseNetworkPolicy):
    """`[steps.verifier]`: unset fields fall back to the task's `[verifier]`."""

    timeout_sec: float | None = Field(default=None, gt=0)
    env: dict[str, str] = {}
    user: User | None = None
    environment_mode: VerifierMode | None = None
    environment: EnvironmentConfig | None = None


_RESERVED_NAMES = {"con", "prn", "aux", "nul"} | {
    f"{p}{n}" for p in ("com", "lpt") for n in range(1, 10)
}
_FORBIDDEN_CHARACTERS = set('<>:"/\\|?*')


def _portable_name(name: str) -> str:
    """A step name must work as a folder name everywhere."""
    if not name:
        raise ValueError("a step name must not be empty")
    bad = sorted({char for char in name if char in _FORBIDDEN_CHARACTERS or ord(char) < 32})
    if bad:
        raise ValueError(
            f"step name {name!r} contains characters not allowed in a folder name: {''.join(bad)!r}"
        )
    if unshowable(name):
        raise ValueError(
            f"step name {name!r} contains control or format characters "
            f"({unshowable(name)!r}): a name shows in ids, reports and terminals"
        )
    if name[-1] in ". ":
        raise ValueError(f"step name {name!r} must not end with a dot or a space")
    if name.split(".")[0].lower() in _RESERVED_NAMES:
        raise ValueError(f"step name {name!r} is a reserved device name on Windows")
    if len(name.encode()) > 255:
        raise ValueError(f"step name {name[:20]!r}... is longer than 255 bytes")
    return name


class StepConfig(_Table):
    """One `[[steps]]` entry of a multi-step task."""

    name: str
    agent: StepAgentConfig = StepAgentConfig()
    verifier: StepVerifierConfig = StepVerifierConfig()
    min_reward: float | dict[str, float] | None = None
    healthcheck: HealthcheckConfig | None = None
    artifacts: list[ArtifactConfig] = []

    _check_name = field_validator("name")(_portable_name)
    _artifacts = field_validator("artifacts", mode="before")(_artifact_list)


# ---------------------------------------------------------------------------- the task


class TaskConfig(_Table):
    """The whole of task.toml."""

    schema_version: str = "1.4"
    source: str | None = None
    multi_step_reward_strategy: Literal["mean", "final"] | None = None
    #: Pre-1.3 key, read and dropped as Harbor does (the loader warns about odd values).
    multi_step_reward_mode: str | None = Field(default=None, exclude=True)
    artifacts: list[ArtifactConfig] = []
    task: PackageInfo | None = None
    metadata: dict[str, Any] = {}
    agent: AgentConfig = AgentConfig()
    verifier: VerifierConfig = VerifierConfig()
    environment: EnvironmentConfig = EnvironmentConfig()
    solution: SolutionConfig = SolutionConfig()
    steps: list[StepConfig] | None = None

    _artifacts = field_validator("artifacts", mode="before")(_artifact_list)

    @model_validator(mode="before")
    @classmethod
    def _legacy_version(cls, data: Any) -> Any:
        # Harbor reads the old root key `version` as `schema_version`.
        if isinstance(data, dict) and "version" in data:
            data = dict(data)
            version = data.pop("version")
            data.setdefault("schema_version", version)
        return data

    @field_validator("steps")
    @classmethod
    def _unique_steps(cls, value: list[StepConfig] | None) -> list[StepConfig] | None:
        seen: dict[str, str] = {}
        for step in value or []:
            key = unicodedata.normalize("NFC", step.name).casefold()
            if key in seen:
                raise ValueError(
                    f"step names must be unique (ignoring case): {seen[key]!r} and "
                    f"{step.name!r} clash"
                )
            seen[key] = step.name
        return value

    @property
    def is_multi_step(self) -> bool:
        return bool(self.steps)


def unknown_keys(model: BaseModel, prefix: str = "") -> list[str]:
    """Dotted paths of every key the models do not know, depth first."""
    return list(known_instead(model, prefix))


def known_instead(model: BaseModel, prefix: str = "") -> dict[str, str | None]:
    """Every key the models do not know (a dotted path, depth first), with the known key of
    the same table it most likely misspells, if one is close."""
    fields = type(model).model_fields
    names = [*fields, *(field.alias for field in fields.values() if field.alias)]
    found: dict[str, str | None] = {}
    for key in model.model_extra or {}:
        meant = closest(key, names)
        found[f"{prefix}{key}"] = f"{prefix}{meant}" if meant else None
    for name in fields:
        value = getattr(model, name)
        children = value if isinstance(value, list) else [value]
        for index, child in enumerate(children):
            if isinstance(child, _Table):
                where = f"{name}[{index}]" if isinstance(value, list) else name
                found.update(known_instead(child, f"{prefix}{where}."))
    return found
