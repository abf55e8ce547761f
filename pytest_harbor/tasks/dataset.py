"""dataset.toml's `[gym]` table: admitted harnesses, defaults and per-task overrides; and
the files a dataset's root shares with its tasks."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pytest_harbor.tasks.config import EnvironmentConfig, TaskConfig
from pytest_harbor.tasks.errors import TaskLoadError, describe_validation_error, key_path
from pytest_harbor.untrusted import load_toml

__all__ = [
    "DATASET_FILE",
    "SHARED_FILES",
    "DatasetConfig",
    "DatasetFiles",
    "GymDefaults",
    "read_dataset_config",
]

DATASET_FILE = "dataset.toml"


class _Strict(BaseModel):
    # No deployment settings or typos in a dataset: unknown keys are refused.
    model_config = ConfigDict(extra="forbid", frozen=True)


class GymDefaults(_Strict):
    """`[gym.defaults]`: policy for every task of the dataset."""

    repeats: int | None = Field(default=None, ge=1)
    timeout_multiplier: float = Field(default=1.0, gt=0)
    agent_timeout_multiplier: float | None = Field(default=None, gt=0)
    verifier_timeout_multiplier: float | None = Field(default=None, gt=0)
    build_timeout_multiplier: float | None = Field(default=None, gt=0)
    cpus_multiplier: float = Field(default=1.0, gt=0)
    memory_multiplier: float = Field(default=1.0, gt=0)
    storage_multiplier: float = Field(default=1.0, gt=0)

    def _timeout(self, phase: float | None) -> float:
        return phase if phase is not None else self.timeout_multiplier

    def scale(self, config: TaskConfig) -> TaskConfig:
        """Scale every timeout and resource of `config` (after the per-task overrides)."""
        agent = self._timeout(self.agent_timeout_multiplier)
        verifier = self._timeout(self.verifier_timeout_multiplier)
        build = self._timeout(self.build_timeout_multiplier)

        def times(value: float | None, factor: float) -> float | None:
            return None if value is None else value * factor

        def sized(environment: EnvironmentConfig) -> EnvironmentConfig:
            return environment.model_copy(
                update={
                    "build_timeout_sec": environment.build_timeout_sec * build,
                    "cpus": times(environment.cpus, self.cpus_multiplier),
                    "memory_mb": _whole(times(environment.memory_mb, self.memory_multiplier)),
                    "storage_mb": _whole(times(environment.storage_mb, self.storage_multiplier)),
                }
            )

        task_verifier = config.verifier.model_copy(
            update={
                "timeout_sec": config.verifier.timeout_sec * verifier,
                "environment": config.verifier.environment and sized(config.verifier.environment),
                "collect": [
                    hook.model_copy(
                        update={"timeout_sec": hook.timeout_sec * self.timeout_multiplier}
                    )
                    for hook in config.verifier.collect
                ],
            }
        )
        steps = None
        if config.steps is not None:
            steps = [
                step.model_copy(
                    update={
                        "agent": step.agent.model_copy(
                            update={"timeout_sec": times(step.agent.timeout_sec, agent)}
                        ),
                        "verifier": step.verifier.model_copy(
                            update={"timeout_sec": times(step.verifier.timeout_sec, verifier)}
                        ),
                    }
                )
                for step in config.steps
            ]
        return config.model_copy(
            update={
                "agent": config.agent.model_copy(
                    update={"timeout_sec": times(config.agent.timeout_sec, agent)}
                ),
                "verifier": task_verifier,
                "environment": sized(config.environment),
                "steps": steps,
            }
        )


def _whole(value: float | None) -> int | None:
    return None if value is None else max(1, round(value))


class DatasetConfig(_Strict):
    """The `[gym]` table; the file's other tables are Harbor's and left alone."""

    license: str | None = None
    type: str | None = None
    domain: str | None = None
    verified: bool | None = None
    source: str | None = None
    allowed_agents: list[str] | None = None
    defaults: GymDefaults = GymDefaults()
    tasks: dict[str, dict[str, Any]] = {}

    def override_for(self, task_id: str) -> dict[str, Any] | None:
        return self.tasks.get(task_id)

    def unknown_task_ids(self, task_ids: Iterable[str]) -> list[str]:
        known = set(task_ids)
        return sorted(task_id for task_id in self.tasks if task_id not in known)


#: The files at a dataset's root its tasks share: the grader of each single-step task
#: without `tests/` (`verifier.py`) and the model of the tasks' fields (`task_data.py`).
SHARED_FILES = ("verifier.py", "task_data.py")
#: The most of one shared file that is read.
SHARED_FILE_CAP = 1024 * 1024


@dataclass(frozen=True)
class DatasetFiles:
    """A dataset root's shared files, as read once when the run planned it: what is
    shipped into sandboxes is what the digest covers, whatever changes on disk later.
    They are Python for the sandbox; nothing of them runs on this machine."""

    verifier: bytes | None = None
    task_data_model: bytes | None = None

    @classmethod
    def read(cls, root: Path) -> DatasetFiles:
        """`root`'s shared files; TaskLoadError names one that is a link, not a file or
        too large."""
        found: dict[str, bytes] = {}
        for name in SHARED_FILES:
            path = root / name
            if path.is_symlink():
                raise TaskLoadError(path, "must not be a symlink: it is shipped into sandboxes")
            if not path.exists():
                continue
            if not path.is_file():
                raise TaskLoadError(path, "must be a file")
            with path.open("rb") as handle:
                data = handle.read(SHARED_FILE_CAP + 1)
            if len(data) > SHARED_FILE_CAP:
                raise TaskLoadError(path, f"is larger than {SHARED_FILE_CAP} bytes")
            found[name] = data
        return cls(found.get("verifier.py"), found.get("task_data.py"))

    @property
    def digest(self) -> str | None:
        """`sha256:` over `name NUL sha256(content) LF` of each file there (None: none)."""
        present = {"verifier.py": self.verifier, "task_data.py": self.task_data_model}
        records = sorted(
            f"{name}\0{hashlib.sha256(data).hexdigest()}\n".encode()
            for name, data in present.items()
            if data is not None
        )
        if not records:
            return None
        return "sha256:" + hashlib.sha256(b"".join(records)).hexdigest()


def read_dataset_config(folder: Path) -> DatasetConfig:
    """The `[gym]` table of `folder/dataset.toml`; empty when the file or table is missing."""
    path = folder / DATASET_FILE
    if not path.is_file():
        return DatasetConfig()
    try:
        parsed = load_toml(path.read_bytes())
    except OSError as error:
        raise TaskLoadError(path, f"cannot be read: {error}") from None
    if parsed.error is not None:
        raise TaskLoadError(path, parsed.error.removeprefix("is "))
    data = parsed.value
    gym = data.get("gym", {})
    try:
        return DatasetConfig.model_validate(gym)
    except ValidationError as error:
        first = error.errors()[0]
        key = "gym." + key_path(first["loc"]) if first["loc"] else "gym"
        message = describe_validation_error(error)
        if first["type"] == "extra_forbidden":
            table = ".".join(["gym", *(str(part) for part in first["loc"][:-1])])
            message = f"not a key of [{table}] (a dataset holds no deployment settings)"
        raise TaskLoadError(path, message, key=key) from None
