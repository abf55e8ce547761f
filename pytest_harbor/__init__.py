"""pytest-harbor: run Harbor-format task folders as pytest items, in Docker sandboxes."""

from pytest_harbor.engine import (
    Episode,
    EpisodeError,
    EpisodeResult,
    FailureKind,
    TurnResult,
    decide_outcome,
    read_reward,
)
from pytest_harbor.harnesses import Harness, make_harness
from pytest_harbor.sandboxes import Sandbox, SandboxProvider, SandboxSpec, make_provider
from pytest_harbor.settings import HarborSettings
from pytest_harbor.tasks import Task, TaskConfig, TaskLoadError, Turn, discover_task_dirs, load_task

__all__ = [
    "Episode",
    "EpisodeError",
    "EpisodeResult",
    "FailureKind",
    "HarborSettings",
    "Harness",
    "Sandbox",
    "SandboxProvider",
    "SandboxSpec",
    "Task",
    "TaskConfig",
    "TaskLoadError",
    "Turn",
    "TurnResult",
    "decide_outcome",
    "discover_task_dirs",
    "load_task",
    "make_harness",
    "make_provider",
    "read_reward",
]
