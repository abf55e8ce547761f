"""The shared mode: the verifier runs in the agent's own sandbox, once the agent's
processes are gone (the default). A verification given a secret, with another turn to
follow, ends every process it started: one left running would hold the secret in its
environment, where the next turn's agent could read it."""

from __future__ import annotations

from typing import ClassVar

from pytest_harbor.engine.admission import secrets_given
from pytest_harbor.engine.context import EpisodeContext
from pytest_harbor.engine.launcher import SandboxLauncher
from pytest_harbor.engine.processes import end_processes_since, survey
from pytest_harbor.engine.verification import Verification, VerifierRun, run_verifier
from pytest_harbor.sandboxes.base import Sandbox, SandboxError

__all__ = ["SharedVerifier"]


class SharedVerifier:
    name: ClassVar[str] = "shared"

    def __init__(self, context: EpisodeContext, launcher: SandboxLauncher) -> None:
        self._context = context

    def verify(self, sandbox: Sandbox, verification: Verification) -> VerifierRun:
        context, turn = self._context, verification.turn
        secret = secrets_given(turn)
        before = survey(sandbox).processes if verification.more_turns and secret else None
        run = run_verifier(sandbox, verification, context, workdir=context.workdir)
        if before is not None:
            try:
                end_processes_since(sandbox, before)
            except SandboxError as error:
                doing = f"ending what the verification of {turn.name} left running"
                return VerifierRun(context.fault(sandbox, error, doing))
        return run
