"""One run of an episode, from its seed: a retry after an agent failure starts a fresh one
in a fresh sandbox."""

from __future__ import annotations

from dataclasses import dataclass, field

from pytest_harbor.engine.failures import FailureKind
from pytest_harbor.engine.processes import SandboxSurvey
from pytest_harbor.engine.readiness import entrypoint_failure
from pytest_harbor.engine.rewards import RewardReading
from pytest_harbor.engine.users import SandboxUsers
from pytest_harbor.sandboxes.base import Sandbox, Spawned

__all__ = ["Attempt"]


@dataclass
class Attempt:
    """An attempt's sandbox, its users, and how the seed left it."""

    number: int
    users: SandboxUsers
    sandbox: Sandbox | None = None
    #: The agent's sandbox as the seed left it (before any agent).
    survey: SandboxSurvey | None = None
    #: The image's ENTRYPOINT, started at the seed.
    entrypoint: Spawned | None = None
    #: A root agent has had the sandbox: it can have stopped it (engine/faults.py).
    root_had_sandbox: bool = False
    _noted: bool = field(default=False, repr=False)
    _masked: RewardReading | None = field(default=None, repr=False)

    def masked(self, agent_has_run: bool) -> RewardReading | None:
        """Before any agent: an ENTRYPOINT that exited non-zero masks the sample (the
        image's fault: no agent has had the sandbox yet); the masking reading, once set."""
        if self._masked is None and not agent_has_run:
            failure = entrypoint_failure(self.entrypoint)
            if failure is not None:
                self._masked = RewardReading.failed(
                    FailureKind.ENTRYPOINT_FAILED, failure, masked=True
                )
        return self._masked

    def entrypoint_note(self) -> list[str]:
        """Once an agent has had the sandbox: an ENTRYPOINT that exited non-zero is noted
        (once), and the episode verified as usual (the agent may have ended it; nothing
        tells)."""
        code = None if self.entrypoint is None else self.entrypoint.exit_code()
        if code in (None, 0) or self._noted:
            return []
        self._noted = True
        return [f"the image's ENTRYPOINT exited with code {code} after the agent's turn began"]
