"""pytest-harbor: run Harbor-format task folders as pytest items, in Docker sandboxes."""

from pytest_harbor.engine import (
    Episode,
    EpisodeResult,
    EpisodeSettings,
    FailureKind,
    TurnResult,
    decide_outcome,
    read_reward,
)
from pytest_harbor.harnesses import Harness, make_harness
from pytest_harbor.sandboxes import Sandbox, SandboxProvider, SandboxSpec, make_provider
from pytest_harbor.tasks import Task, TaskConfig, TaskLoadError, Turn, discover_task_dirs, load_task

__all__ = [
    "Episode",
    "EpisodeResult",
    "EpisodeSettings",
    "FailureKind",
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
