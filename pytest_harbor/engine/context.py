"""What every part of one episode shares: its name, task, settings, harness, clock,
redactor and labels, made once by the Episode and handed to each part (the launcher, the
agent's side, the verifier modes, the result)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from pytest_harbor.engine.budget import EpisodeBudget, episode_budget
from pytest_harbor.engine.clock import EpisodeClock
from pytest_harbor.engine.faults import fault
from pytest_harbor.engine.rewards import RewardReading
from pytest_harbor.harnesses.base import Harness
from pytest_harbor.harnesses.mcp.access import McpAccess
from pytest_harbor.harnesses.model import ModelConfig
from pytest_harbor.redaction import Redactor
from pytest_harbor.sandboxes.base import Sandbox, SandboxError
from pytest_harbor.settings import HarborSettings
from pytest_harbor.tasks import Task

__all__ = ["EpisodeContext"]


@dataclass(frozen=True, eq=False)
class EpisodeContext:
    """One episode's facts, fixed once it is made. What changes as the episode runs (the
    attempt, its sandbox, the turns' results) is the Episode's own; the clock is shared
    here as the one object every part reads the time from."""

    #: `<task>__r<repeat>`, or the name the episode was given.
    id: str
    #: The task as the run sees it (the settings' Compose overlay merged in).
    task: Task
    taskset: str
    repeat: int
    harness: Harness
    settings: HarborSettings
    #: What a model-driven harness talks to.
    model: ModelConfig | None
    #: The task's MCP servers as granted, with their header credentials.
    mcp: McpAccess
    #: The run's secrets, the model key and the MCP credentials: masked in every file and
    #: message the episode writes.
    redactor: Redactor
    clock: EpisodeClock
    #: Labels of what the episode starts on an engine.
    labels: Mapping[str, str]
    #: Labels of an image the episode builds (images outlive episodes and runs).
    image_labels: Mapping[str, str]
    #: The turn verifies in a sandbox of its own (engine/verifiers/separate.py).
    separate_verifier: bool
    #: The digest the task folder must still have at the seed (None: not checked).
    expected_digest: str | None = None

    @property
    def workdir(self) -> str | None:
        """The task's working directory, when it names one."""
        return self.task.config.environment.workdir

    @cached_property
    def budget(self) -> EpisodeBudget:
        """The time budget (raises EpisodeError when the settings refuse the task)."""
        return episode_budget(self.task, self.settings, separate_verifier=self.separate_verifier)

    def fault(
        self, sandbox: Sandbox, error: SandboxError, doing: str, *, root_had_it: bool = False
    ) -> RewardReading:
        """A step that failed once an agent had `sandbox` (engine/faults.py)."""
        return fault(
            sandbox, error, doing, episode=self.id, redactor=self.redactor, root_had_it=root_had_it
        )
