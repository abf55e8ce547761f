"""The shared mode: the verifier runs in the agent's own sandbox, once the agent's
processes are gone (the default). A verification given a secret, with another turn to
follow, ends every process it started: one left running would hold the secret in its
environment, where the next turn's agent could read it."""

from __future__ import annotations

from typing import ClassVar

from pytest_harbor.engine.admission import secrets_given
from pytest_harbor.engine.processes import end_processes_since, survey
from pytest_harbor.engine.verification import VerifierRun, run_verifier
from pytest_harbor.engine.verifiers.protocol import ModeContext, Verification
from pytest_harbor.sandboxes.base import Sandbox, SandboxError

__all__ = ["SharedVerifier"]


class SharedVerifier:
    name: ClassVar[str] = "shared"

    def __init__(self, context: ModeContext) -> None:
        self._context = context

    def verify(self, sandbox: Sandbox, verification: Verification) -> VerifierRun:
        context, turn = self._context, verification.turn
        secret = secrets_given(turn, context.launcher.settings.secrets)
        before = survey(sandbox).processes if verification.more_turns and secret else None
        run = run_verifier(
            sandbox,
            turn,
            workdir=context.workdir,
            grace_s=context.launcher.settings.verifier_grace_s,
            budget_s=context.clock.verifier_budget(turn),
            trajectory=verification.transcript,
            seed=verification.seed,
            into=verification.into,
            redactor=context.redactor,
            verifier_user=verification.verifier_user,
            agent_id=verification.agent_id,
            response=verification.response,
        )
        if before is not None:
            try:
                end_processes_since(sandbox, before)
            except SandboxError as error:
                doing = f"ending what the verification of {turn.name} left running"
                return VerifierRun(context.fault(sandbox, error, doing))
        return run
