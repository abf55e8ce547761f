"""The shared mode: the verifier runs in the agent's own sandbox, once the agent's
processes are gone (the default)."""

from __future__ import annotations

from typing import ClassVar

from pytest_harbor.engine.verification import VerifierRun, run_verifier
from pytest_harbor.engine.verifiers.protocol import ModeContext, Verification
from pytest_harbor.sandboxes.base import Sandbox

__all__ = ["SharedVerifier"]


class SharedVerifier:
    name: ClassVar[str] = "shared"

    def __init__(self, context: ModeContext) -> None:
        self._context = context

    def verify(self, sandbox: Sandbox, verification: Verification) -> VerifierRun:
        context, turn = self._context, verification.turn
        return run_verifier(
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
        )
