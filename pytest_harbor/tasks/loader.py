"""Find task folders and load them into Tasks, with errors that name file and key."""

from __future__ import annotations

import fnmatch
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path

from pydantic import ValidationError

from pytest_harbor.tasks.config import (
    EnvironmentConfig,
    SolutionConfig,
    TaskConfig,
    VerifierConfig,
    unknown_keys,
)
from pytest_harbor.tasks.task import SINGLE_STEP_TURN, Task, Turn

__all__ = [
    "MAX_TASK_DEPTH",
    "TaskLoadError",
    "discover_task_dirs",
    "is_dataset_dir",
    "is_task_dir",
    "load_task",
    "strip_canary",
]

#: How deep below a dataset folder task folders are searched for.
MAX_TASK_DEPTH = 6

TASK_FILE = "task.toml"


class TaskLoadError(Exception):
    """A task folder that cannot be loaded: which file, which key, what was expected."""

    def __init__(self, path: Path, message: str, key: str | None = None) -> None:
        self.path = path
        self.key = key
        self.message = message
        where = f"{path}: {key}" if key else str(path)
        super().__init__(f"{where}: {message}")


def is_task_dir(path: Path) -> bool:
    return (path / TASK_FILE).is_file()


def discover_task_dirs(root: Path, max_depth: int = MAX_TASK_DEPTH) -> list[Path]:
    """Task folders at or below `root`, sorted; hidden folders and task contents are skipped."""
    if is_task_dir(root):
        return [root]
    found: list[Path] = []
    level = [root]
    for _ in range(max_depth):
        below: list[Path] = []
        for folder in level:
            for child in _subfolders(folder):
                (found if is_task_dir(child) else below).append(child)
        level = below
    return sorted(found, key=lambda path: path.relative_to(root).as_posix())


def is_dataset_dir(path: Path, test_file_patterns: Iterable[str] = ()) -> bool:
    """A folder of task folders that holds no Python test files of its own.

    Used to decide whether a plain positional argument (`pytest path`) names a dataset:
    a folder with both task folders and pytest test modules outside them is a project,
    not a dataset, and pytest collects it as usual.
    """
    if not path.is_dir() or is_task_dir(path):
        return False
    patterns = tuple(test_file_patterns)
    has_task = False
    level = [path]
    for _ in range(MAX_TASK_DEPTH):
        below: list[Path] = []
        for folder in level:
            if patterns and _holds_test_module(folder, patterns):
                return False
            for child in _subfolders(folder):
                if is_task_dir(child):
                    has_task = True
                else:
                    below.append(child)
        level = below
    return has_task


def _subfolders(folder: Path) -> list[Path]:
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    return [
        Path(entry.path)
        for entry in entries
        if not entry.name.startswith(".") and entry.is_dir(follow_symlinks=True)
    ]


def _holds_test_module(folder: Path, patterns: tuple[str, ...]) -> bool:
    try:
        names = [entry.name for entry in os.scandir(folder) if entry.is_file()]
    except OSError:
        return False
    return any(
        name.endswith(".py") and any(fnmatch.fnmatch(name, pattern) for pattern in patterns)
        for name in names
    )


def load_task(path: Path, environ: Mapping[str, str] | None = None) -> Task:
    """Load and validate one task folder; raise TaskLoadError naming the file and key."""
    environ = os.environ if environ is None else environ
    task_file = path / TASK_FILE
    if path.is_symlink():
        raise TaskLoadError(path, "a task folder must not be a symlink")
    config = _read_config(task_file)
    _check_supported(path, config)
    config = _resolve_env_templates(task_file, config, environ)
    return Task(
        path=path,
        config=config,
        turns=(_single_step_turn(path, config),),
        unknown_keys=tuple(unknown_keys(config)),
    )


def _read_config(task_file: Path) -> TaskConfig:
    try:
        data = tomllib.loads(task_file.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise TaskLoadError(task_file, f"not valid TOML: {error}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise TaskLoadError(task_file, f"cannot be read: {error}") from None
    try:
        return TaskConfig.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        key = _key_path(first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        given = first.get("input")
        if not isinstance(given, dict) and first["type"] != "missing":
            message = f"{message}, got {given!r}"
        more = error.error_count() - 1
        if more:
            message += f" (and {more} more problem{'s' if more > 1 else ''})"
        raise TaskLoadError(task_file, message, key=key or None) from None


def _key_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def _check_supported(path: Path, config: TaskConfig) -> None:
    task_file = path / TASK_FILE
    if config.is_multi_step:
        raise TaskLoadError(task_file, "multi-step tasks are not supported yet", key="steps")
    if config.environment.os != "linux":
        raise TaskLoadError(
            task_file,
            f"{config.environment.os} tasks cannot run on a Linux Docker engine",
            key="environment.os",
        )
    if config.environment.gpus:
        raise TaskLoadError(
            task_file, "the docker sandbox has no GPUs to give", key="environment.gpus"
        )
    if config.environment.network_mode == "allowlist":
        raise TaskLoadError(
            task_file,
            'network_mode = "allowlist" cannot be enforced by the docker sandbox',
            key="environment.network_mode",
        )
    environment = path / "environment"
    if config.environment.docker_image is None:
        if (environment / "docker-compose.yaml").is_file():
            raise TaskLoadError(
                environment / "docker-compose.yaml",
                "Compose tasks are not supported by the docker sandbox",
            )
        if not (environment / "Dockerfile").is_file():
            raise TaskLoadError(
                task_file,
                "no environment: set [environment].docker_image or add environment/Dockerfile",
                key="environment.docker_image",
            )
    if not (path / "instruction.md").is_file():
        raise TaskLoadError(path / "instruction.md", "missing: a single-step task needs one")
    if not (path / "tests" / "test.sh").is_file():
        raise TaskLoadError(path / "tests" / "test.sh", "missing: the verifier script is required")


_TEMPLATE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?\}$", re.DOTALL)


def resolve_env_value(value: str, environ: Mapping[str, str]) -> str | None:
    """Harbor's `${VAR}` / `${VAR:-default}` (whole value only); None when VAR is unset."""
    match = _TEMPLATE.match(value)
    if match is None:
        return value
    name, default = match.group(1), match.group(2)
    if name in environ:
        return environ[name]
    return default


def _resolve_env_templates(
    task_file: Path, config: TaskConfig, environ: Mapping[str, str]
) -> TaskConfig:
    tables: dict[str, EnvironmentConfig | VerifierConfig | SolutionConfig] = {
        "environment": config.environment,
        "verifier": config.verifier,
        "solution": config.solution,
    }
    updates = {}
    for table_name, table in tables.items():
        resolved: dict[str, str] = {}
        for key, value in table.env.items():
            result = resolve_env_value(value, environ)
            if result is None:
                raise TaskLoadError(
                    task_file,
                    f"{value} names a variable that is not set and has no default "
                    "(write ${NAME:-default} to give one)",
                    key=f"{table_name}.env.{key}",
                )
            resolved[key] = result
        updates[table_name] = table.model_copy(update={"env": resolved})
    return config.model_copy(update=updates)


_CANARY = re.compile(r"^\s*(<!--.*canary.*-->|#.*canary.*)\s*$", re.IGNORECASE)


def strip_canary(text: str) -> str:
    """Drop leading canary lines (`<!-- ...canary... -->` or `# ...canary...`) and blanks after."""
    lines = text.splitlines(keepends=True)
    index = 0
    while index < len(lines) and _CANARY.match(lines[index]):
        index += 1
    if index:
        while index < len(lines) and not lines[index].strip():
            index += 1
    return "".join(lines[index:])


def _user(value: str | int | None) -> str | None:
    return None if value is None else str(value)


def _single_step_turn(path: Path, config: TaskConfig) -> Turn:
    instruction = strip_canary((path / "instruction.md").read_text(encoding="utf-8"))
    solution = path / "solution"
    return Turn(
        name=SINGLE_STEP_TURN,
        instruction=instruction,
        solution_dir=solution if solution.is_dir() else None,
        tests_dirs=(path / "tests",),
        agent_timeout_sec=config.agent.timeout_sec,
        agent_user=_user(config.agent.user),
        verifier_timeout_sec=config.verifier.timeout_sec,
        verifier_user=_user(config.verifier.user),
        verifier_env=dict(config.verifier.env),
        solution_env=dict(config.solution.env),
    )
