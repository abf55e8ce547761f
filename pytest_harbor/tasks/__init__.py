"""Task folders: the task.toml model, discovery and loading (no pytest here)."""

from pytest_harbor.tasks.config import TaskConfig
from pytest_harbor.tasks.loader import (
    TaskLoadError,
    discover_task_dirs,
    is_dataset_dir,
    is_task_dir,
    load_task,
)
from pytest_harbor.tasks.task import SINGLE_STEP_TURN, Task, Turn

__all__ = [
    "SINGLE_STEP_TURN",
    "Task",
    "TaskConfig",
    "TaskLoadError",
    "Turn",
    "discover_task_dirs",
    "is_dataset_dir",
    "is_task_dir",
    "load_task",
]
