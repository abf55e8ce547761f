"""The snapshot mode (`verify_from_snapshot`): the verifier runs in a fresh sandbox made
from an image of the agent's file system, so that not one process of the agent's lives on
where it runs."""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from pytest_harbor.display import harbor_logger
from pytest_harbor.engine.context import EpisodeContext
from pytest_harbor.engine.launcher import SandboxLauncher, stop_within
from pytest_harbor.engine.verification import Verification, VerifierRun, run_verifier
from pytest_harbor.engine.verifiers.protocol import blamed_on
from pytest_harbor.sandboxes.base import Sandbox, SandboxError, SandboxStartError

__all__ = ["SnapshotVerifier"]

log = harbor_logger()


class SnapshotVerifier:
    """The image's ENTRYPOINT is not started again. The snapshot and its start depend on
    what the agent left (a folder the sandbox needs replaced by a file, say): their
    failures are the agent's sandbox's (raised as SandboxError)."""

    name: ClassVar[str] = "snapshot"

    def __init__(self, context: EpisodeContext, launcher: SandboxLauncher) -> None:
        self._context = context
        self._launcher = launcher

    def verify(self, sandbox: Sandbox, verification: Verification) -> VerifierRun:
        context, launcher, turn = self._context, self._launcher, verification.turn
        # No process of the agent's lives on in the snapshot's sandbox: none to end.
        fresh = replace(verification, agent_id=None)
        image = sandbox.snapshot(context.image_labels)
        try:
            try:
                verifier = launcher.start(
                    image,
                    context.task.config.environment,
                    record=False,
                    network=turn.verifier_network,
                )
            except SandboxStartError as error:
                raise SandboxError(f"the snapshot's sandbox did not start: {error}") from None
            try:
                return blamed_on(
                    context,
                    verifier,
                    "the snapshot's sandbox",
                    lambda: run_verifier(verifier, fresh, context, workdir=context.workdir),
                )
            finally:
                stop_within(verifier, context.settings.cleanup_timeout_seconds)
        finally:
            try:
                launcher.provider.remove_image(image)
            except SandboxError as error:
                log.warning("%s: the snapshot image was not removed: %s", context.id, error)
