"""task.toml as pydantic models, with Harbor's field names and defaults."""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "AgentConfig",
    "EnvironmentConfig",
    "PackageInfo",
    "SolutionConfig",
    "StepConfig",
    "TaskConfig",
    "VerifierConfig",
    "unknown_keys",
]

User = str | int


class _Table(BaseModel):
    """A TOML table: unknown keys are kept aside so the loader can list them."""

    model_config = ConfigDict(extra="allow", frozen=True)


def _finite(value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


class PackageInfo(_Table):
    """`[task]`: the registry identity of a task (not its id; the folder name is the id)."""

    name: str = Field(pattern=r"^[a-zA-Z0-9][a-zA-Z0-9._-]*/[a-zA-Z0-9][a-zA-Z0-9._-]*$")
    version: str | None = Field(default=None, min_length=1)
    description: str = ""
    authors: list[dict[str, str]] = []
    keywords: list[str] = []

    @field_validator("name")
    @classmethod
    def _no_parent_refs(cls, value: str) -> str:
        if ".." in value:
            raise ValueError("must not contain '..'")
        return value


class AgentConfig(_Table):
    """`[agent]`: budget and user of the agent (or the oracle's solve.sh)."""

    timeout_sec: float | None = Field(default=None, gt=0)
    user: User | None = None

    _check_timeout = field_validator("timeout_sec")(_finite)


class VerifierConfig(_Table):
    """`[verifier]`: how tests/test.sh runs."""

    timeout_sec: float = Field(default=600.0, gt=0)
    env: dict[str, str] = {}
    user: User | None = None

    _check_timeout = field_validator("timeout_sec")(_finite)


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
    """`[environment]`: the sandbox's image, resources and working directory."""

    build_timeout_sec: float = Field(default=600.0, gt=0)
    docker_image: str | None = None
    os: Literal["linux", "windows"] = "linux"
    cpus: int | float | None = Field(default=None, gt=0)
    memory_mb: int | None = Field(default=None, gt=0)
    storage_mb: int | None = Field(default=None, gt=0)
    gpus: int | None = Field(default=None, ge=0)
    workdir: str | None = None
    env: dict[str, str] = {}
    network_mode: Literal["public", "no-network", "allowlist"] = "public"
    allowed_hosts: list[str] | None = None

    _check_numbers = field_validator("build_timeout_sec", "cpus")(_finite)

    @model_validator(mode="before")
    @classmethod
    def _legacy_sizes(cls, data: Any) -> Any:
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

    @model_validator(mode="after")
    def _hosts_need_allowlist(self) -> EnvironmentConfig:
        if self.allowed_hosts is not None and self.network_mode != "allowlist":
            raise ValueError('allowed_hosts is only valid with network_mode = "allowlist"')
        return self

    @field_validator("cpus")
    @classmethod
    def _whole_cpus(cls, value: int | float | None) -> int | float | None:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value

    @field_validator("workdir")
    @classmethod
    def _absolute_workdir(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"must be an absolute path inside the sandbox, got {value!r}")
        return value


class SolutionConfig(_Table):
    """`[solution]`: environment for the oracle's solve.sh."""

    env: dict[str, str] = {}


class StepConfig(_Table):
    """One `[[steps]]` entry of a multi-step task."""

    name: str


class TaskConfig(_Table):
    """The whole of task.toml."""

    schema_version: str = "1.4"
    source: str | None = None
    multi_step_reward_strategy: Literal["mean", "final"] | None = None
    artifacts: list[Any] = []
    task: PackageInfo | None = None
    metadata: dict[str, Any] = {}
    agent: AgentConfig = AgentConfig()
    verifier: VerifierConfig = VerifierConfig()
    environment: EnvironmentConfig = EnvironmentConfig()
    solution: SolutionConfig = SolutionConfig()
    steps: list[StepConfig] | None = None

    @model_validator(mode="before")
    @classmethod
    def _legacy_version(cls, data: Any) -> Any:
        # Harbor reads the old root key `version` as `schema_version`.
        if isinstance(data, dict) and "version" in data:
            data = dict(data)
            version = data.pop("version")
            data.setdefault("schema_version", version)
        return data

    @property
    def is_multi_step(self) -> bool:
        return bool(self.steps)


def unknown_keys(model: BaseModel, prefix: str = "") -> list[str]:
    """Dotted paths of every key the models do not know, depth first."""
    found = [f"{prefix}{key}" for key in (model.model_extra or {})]
    for name in type(model).model_fields:
        value = getattr(model, name)
        children = value if isinstance(value, list) else [value]
        for index, child in enumerate(children):
            if isinstance(child, _Table):
                where = f"{name}[{index}]" if isinstance(value, list) else name
                found.extend(unknown_keys(child, f"{prefix}{where}."))
    return found
