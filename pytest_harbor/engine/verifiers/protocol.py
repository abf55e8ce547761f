"""What a verifier mode is: one way to run a turn's verifier on what its agent left."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

from pytest_harbor.engine.clock import EpisodeClock
from pytest_harbor.engine.faults import fault
from pytest_harbor.engine.launcher import SandboxLauncher
from pytest_harbor.engine.processes import SandboxSurvey
from pytest_harbor.engine.rewards import RewardReading
from pytest_harbor.engine.verification import VerifierRun
from pytest_harbor.redaction import Redactor
from pytest_harbor.sandboxes.base import Sandbox, SandboxError
from pytest_harbor.tasks import Turn

__all__ = ["ModeContext", "Verification", "VerifierMode"]


@dataclass(frozen=True)
class Verification:
    """One turn's verification, as the episode hands it to its mode."""

    turn: Turn
    #: The agent's transcript of the turn (the verifier gets it as a file).
    transcript: bytes
    #: The agent's sandbox as the seed left it (before any agent).
    seed: SandboxSurvey
    #: Where the files the verifier left go.
    into: Path
    #: The turn's verifier user as `uid:gid`, when the seed read one.
    verifier_user: str | None
    #: The user (`uid:gid`) whose every process ends before a shared verification (None:
    #: root's).
    agent_id: str | None
    #: Another turn follows in the same sandbox: what a verification given a secret
    #: started ends with it (a process it left holds the secret in its environment).
    more_turns: bool = False
    #: The agent's final answer (None for the oracle): a Python verifier's `response`.
    response: str | None = None


@dataclass(frozen=True)
class ModeContext:
    """What every mode works with: the episode's launcher (for a sandbox of the mode's
    own), its clock, its redactor and working directory."""

    episode: str
    launcher: SandboxLauncher
    clock: EpisodeClock
    redactor: Redactor
    workdir: str | None

    def fault(self, sandbox: Sandbox, error: SandboxError, doing: str) -> RewardReading:
        """A step that failed once an agent had `sandbox` (engine/faults.py)."""
        return fault(sandbox, error, doing, episode=self.episode, redactor=self.redactor)

    def blamed_on(
        self, sandbox: Sandbox, what: str, verify: Callable[[], VerifierRun]
    ) -> VerifierRun:
        """`verify()` in a verifier's own sandbox: its failures are blamed on that sandbox
        (what is in it besides its image came from the agent)."""
        try:
            return verify()
        except SandboxError as error:
            return VerifierRun(self.fault(sandbox, error, f"verifying in {what}"))


class VerifierMode(Protocol):
    """Runs `tests/test.sh` for a turn and reads its reward. A SandboxError the mode lets
    through is the agent's sandbox's (the episode blames it, engine/faults.py)."""

    #: The mode's name in rows: `shared`, `snapshot` or `separate`.
    name: ClassVar[str]

    def verify(self, sandbox: Sandbox, verification: Verification) -> VerifierRun:
        """Verify what the agent left in `sandbox`."""
        ...
