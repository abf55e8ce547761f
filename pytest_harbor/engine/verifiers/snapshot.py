"""The snapshot mode (`verify_from_snapshot`): the verifier runs in a fresh sandbox made
from an image of the agent's file system, so that not one process of the agent's lives on
where it runs."""

from __future__ import annotations

from typing import ClassVar

from pytest_harbor.display import harbor_logger
from pytest_harbor.engine.launcher import stop_within
from pytest_harbor.engine.verification import VerifierRun, run_verifier
from pytest_harbor.engine.verifiers.protocol import ModeContext, Verification
from pytest_harbor.sandboxes.base import Sandbox, SandboxError, SandboxStartError

__all__ = ["SnapshotVerifier"]

log = harbor_logger()


class SnapshotVerifier:
    """The image's ENTRYPOINT is not started again. The snapshot and its start depend on
    what the agent left (a folder the sandbox needs replaced by a file, say): their
    failures are the agent's sandbox's (raised as SandboxError)."""

    name: ClassVar[str] = "snapshot"

    def __init__(self, context: ModeContext) -> None:
        self._context = context

    def verify(self, sandbox: Sandbox, verification: Verification) -> VerifierRun:
        context, turn = self._context, verification.turn
        launcher = context.launcher
        settings = launcher.settings
        image = sandbox.snapshot(launcher.image_labels)
        try:
            try:
                verifier = launcher.start(
                    image,
                    launcher.task.config.environment,
                    record=False,
                    network=turn.verifier_network,
                )
            except SandboxStartError as error:
                raise SandboxError(f"the snapshot's sandbox did not start: {error}") from None
            try:
                return context.blamed_on(
                    verifier,
                    "the snapshot's sandbox",
                    lambda: run_verifier(
                        verifier,
                        turn,
                        workdir=context.workdir,
                        grace_s=settings.verifier_grace_s,
                        budget_s=context.clock.verifier_budget(turn),
                        trajectory=verification.transcript,
                        seed=verification.seed,
                        into=verification.into,
                        redactor=context.redactor,
                        verifier_user=verification.verifier_user,
                        response=verification.response,
                    ),
                )
            finally:
                stop_within(verifier, settings.cleanup_timeout_seconds)
        finally:
            try:
                launcher.provider.remove_image(image)
            except SandboxError as error:
                log.warning("%s: the snapshot image was not removed: %s", context.episode, error)
