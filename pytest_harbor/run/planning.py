"""A taskset's plan: its dataset settings, the selected tasks that load, and those that do not.

The controller plans once to write the materialized rows; every process plans again to
collect its nodes. Planning reads files only; it starts no sandbox.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pytest_harbor.engine.admission import refuse_unrunnable
from pytest_harbor.sandboxes.base import SandboxCapabilities
from pytest_harbor.tasks import (
    DatasetConfig,
    Task,
    TaskLoadError,
    discover_task_dirs,
    load_task,
    matches_any,
    read_dataset_config,
)
from pytest_harbor.tasks.dataset import DATASET_FILE, DatasetFiles
from pytest_harbor.tasks.loader import MAX_TASK_DEPTH, TASK_FILE, refuse_unusable_name
from pytest_harbor.templates import TemplateSources

__all__ = ["Selection", "TasksetPlan", "plan_taskset"]

#: Harnesses every dataset admits: checking reference solutions is not running an agent.
ALWAYS_ADMITTED = frozenset({"oracle"})


@dataclass(frozen=True)
class Selection:
    """`--harbor-only-tasks` and `--harbor-exclude-tasks`: names or globs."""

    only: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def admits(self, task_id: str) -> bool:
        if self.only and not matches_any(task_id, self.only):
            return False
        return not matches_any(task_id, self.exclude)


@dataclass(frozen=True)
class TasksetPlan:
    taskset: str
    root: Path
    dataset: DatasetConfig
    repeats: int
    tasks: list[Task] = field(default_factory=list)
    #: Every task id of the taskset, selected or not.
    task_ids: list[str] = field(default_factory=list)
    #: Selected task folders that did not load or cannot run here, with the reason.
    failures: dict[Path, TaskLoadError] = field(default_factory=dict)
    #: The files the dataset's root shares with its tasks (a Python verifier's).
    files: DatasetFiles = field(default_factory=DatasetFiles)


def plan_taskset(
    root: Path,
    *,
    harness: str,
    capabilities: SandboxCapabilities,
    provider: str,
    gpu_provider: tuple[SandboxCapabilities, str] | None = None,
    selection: Selection = Selection(),
    variables: TemplateSources | None = None,
    repeats: int | None = None,
    admit_any_harness: bool = False,
    check: Callable[[Task], None] | None = None,
    allow_remote_add: bool = False,
) -> TasksetPlan:
    """Plan the taskset rooted at `root` (a task folder or a dataset folder).

    Raises TaskLoadError for what spoils the whole taskset: a bad dataset.toml, a harness
    it does not admit, an override naming no task, two tasks with one id, no tasks at all.
    `check` may refuse a task (TaskLoadError) for what only the run knows (its settings).
    `variables` are what the tasks' `${NAME}` may read (none by default): the run's
    settings' `template_sources()`. `allow_remote_add` (the settings' own) lets a
    Dockerfile's `ADD` fetch a URL.
    `gpu_provider` (capabilities and name) is where tasks that ask for GPUs run, when the
    run names one.
    """
    if not (root / "task.toml").is_file():
        refuse_unusable_name(root, "dataset folder")
    alone = (root / "task.toml").is_file()
    dataset = DatasetConfig() if alone else read_dataset_config(root)
    files = DatasetFiles() if alone else DatasetFiles.read(root)
    _admit(root, dataset, harness, admit_any_harness)
    task_dirs = discover_task_dirs(root)
    if not task_dirs:
        raise TaskLoadError(
            root,
            "no task folders found (a task folder holds task.toml; searched "
            f"{MAX_TASK_DEPTH} levels deep, hidden folders skipped)",
        )
    _refuse_duplicates(root, task_dirs)
    unknown = dataset.unknown_task_ids(path.name for path in task_dirs)
    if unknown:
        raise TaskLoadError(
            root / DATASET_FILE,
            "names no task folder of this dataset (task ids are folder names)",
            key=f'gym.tasks."{unknown[0]}"',
        )
    plan = TasksetPlan(
        taskset=root.name,
        root=root,
        dataset=dataset,
        repeats=repeats or dataset.defaults.repeats or 1,
        task_ids=[path.name for path in task_dirs],
        files=files,
    )
    for task_dir in task_dirs:
        if not selection.admits(task_dir.name):
            continue
        try:
            task = load_task(
                task_dir,
                variables=variables,
                dataset=dataset,
                dataset_files=files,
                allow_remote_add=allow_remote_add,
            )
            if gpu_provider is not None and task.config.environment.gpus:
                refuse_unrunnable(task, *gpu_provider)
            else:
                refuse_unrunnable(task, capabilities, provider)
            if check is not None:
                check(task)
        except TaskLoadError as error:
            plan.failures[task_dir] = error
        except Exception as error:  # reading a stranger's task never ends the run
            plan.failures[task_dir] = TaskLoadError(
                task_dir / TASK_FILE, f"could not be loaded: {type(error).__name__}: {error}"
            )
        else:
            plan.tasks.append(task)
    return plan


def _admit(root: Path, dataset: DatasetConfig, harness: str, admit_any: bool) -> None:
    allowed = dataset.allowed_agents
    if allowed is None or admit_any or harness in ALWAYS_ADMITTED or harness in allowed:
        return
    raise TaskLoadError(
        root / DATASET_FILE,
        f"does not admit the harness {harness!r} (admitted: {', '.join(allowed) or 'none'}); "
        "pass --harbor-allow-unsupported-pairing to run it anyway",
        key="gym.allowed_agents",
    )


def _refuse_duplicates(root: Path, task_dirs: list[Path]) -> None:
    seen: dict[str, Path] = {}
    for task_dir in task_dirs:
        if task_dir.name in seen:
            raise TaskLoadError(
                root,
                f"task id {task_dir.name!r} is used twice: {seen[task_dir.name]} and {task_dir} "
                "(task ids are folder names and must be unique in a dataset)",
            )
        seen[task_dir.name] = task_dir
