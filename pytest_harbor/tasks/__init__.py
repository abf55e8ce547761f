"""Task folders: the task.toml model, dataset.toml, discovery, loading, digests (no pytest)."""

from pytest_harbor.tasks.config import TaskConfig
from pytest_harbor.tasks.dataset import DatasetConfig, read_dataset_config
from pytest_harbor.tasks.digest import task_digest
from pytest_harbor.tasks.errors import TaskLoadError
from pytest_harbor.tasks.loader import (
    discover_task_dirs,
    is_dataset_dir,
    is_task_dir,
    load_task,
    matches_any,
)
from pytest_harbor.tasks.task import SINGLE_STEP_TURN, Task, Turn

__all__ = [
    "SINGLE_STEP_TURN",
    "DatasetConfig",
    "Task",
    "TaskConfig",
    "TaskLoadError",
    "Turn",
    "discover_task_dirs",
    "is_dataset_dir",
    "is_task_dir",
    "load_task",
    "matches_any",
    "read_dataset_config",
    "task_digest",
]
