"""The separate mode: the verifier runs in a fresh sandbox of its own image
(`[verifier].mode = "separate"`, a `tests/Dockerfile`, or `separate_verifier_for_artifacts`),
which gets only the agent's artifacts."""

from __future__ import annotations

import tarfile
import time
from dataclasses import replace
from typing import ClassVar

from pytest_harbor.engine.context import EpisodeContext
from pytest_harbor.engine.failures import FailureKind
from pytest_harbor.engine.launcher import SandboxLauncher
from pytest_harbor.engine.processes import SandboxSurvey, survey
from pytest_harbor.engine.readiness import entrypoint_failure, start_entrypoint
from pytest_harbor.engine.rewards import RewardReading
from pytest_harbor.engine.scripts import trusted
from pytest_harbor.engine.verification import Verification, VerifierRun, run_verifier
from pytest_harbor.engine.verifiers.protocol import blamed_on
from pytest_harbor.sandboxes.base import (
    ROOT_USER,
    Sandbox,
    SandboxError,
    SandboxStartError,
    service_of,
)
from pytest_harbor.sandboxes.copies import (
    ARTIFACTS_COPY,
    ARTIFACTS_KEPT_BYTES,
    CopyCapped,
    RepackedArtifact,
    bounded,
)
from pytest_harbor.settings import HarborSettings
from pytest_harbor.tasks import Task

__all__ = ["ARTIFACTS_DIR", "SeparateVerifier", "verifies_separately"]

#: Where the agent publishes what a separate verifier gets, besides declared artifacts.
ARTIFACTS_DIR = "/logs/artifacts"


def verifies_separately(task: Task, settings: HarborSettings) -> bool:
    """Whether `task` verifies in a sandbox of its own."""
    if task.config.is_multi_step:
        return False  # the loader refuses separate verification for multi-step tasks
    return (
        task.config.verifier.mode == "separate"
        or task.verifier_dockerfile is not None
        or (settings.separate_verifier_for_artifacts and bool(task.config.artifacts))
    )


class SeparateVerifier:
    name: ClassVar[str] = "separate"

    def __init__(self, context: EpisodeContext, launcher: SandboxLauncher) -> None:
        self._context = context
        self._launcher = launcher
        self._task = context.task

    def verify(self, sandbox: Sandbox, verification: Verification) -> VerifierRun:
        context, launcher = self._context, self._launcher
        image = launcher.verifier_image
        assert image is not None
        environment = self._task.config.verifier.environment or self._task.config.environment
        # The verifier's own network_mode, else its environment's.
        network = (
            verification.turn.verifier_network
            if self._task.config.verifier.network_mode is not None
            else environment.network_mode != "no-network"
        )
        try:
            verifier = launcher.start(image, environment, record=False, network=network)
        except SandboxStartError as error:
            # Its image and nothing of the agent's: the engine's (or the task's) failure.
            return _lost(error)
        try:
            try:
                fresh = survey(verifier)
                entrypoint = start_entrypoint(
                    verifier, launcher.image_config(image), environment.workdir
                )
            except SandboxError as error:
                return _lost(error)
            # Before the agent's artifacts are there, a failed ENTRYPOINT is the image's.
            failure = entrypoint_failure(entrypoint)
            if failure is not None:
                return VerifierRun(
                    RewardReading.failed(FailureKind.ENTRYPOINT_FAILED, failure, masked=True)
                )
            try:
                self._copy_artifacts(sandbox, verifier)
            except CopyCapped as error:
                # The agent decides what the artifacts hold: too much is its doing.
                return VerifierRun(
                    RewardReading.failed(
                        FailureKind.ARTIFACTS_OVER_CAP,
                        f"the agent's artifacts were not copied to the verifier: {error}",
                    )
                )
            except SandboxError as error:
                return VerifierRun(context.fault(sandbox, error, "copying the agent's artifacts"))
            return blamed_on(
                context,
                verifier,
                "the separate verifier",
                lambda: self._run(verifier, verification, fresh),
            )
        finally:
            launcher.stop(verifier)

    def _run(
        self, verifier: Sandbox, verification: Verification, fresh: SandboxSurvey
    ) -> VerifierRun:
        context, config = self._context, self._task.config
        environment = config.verifier.environment or config.environment
        # A verifier image of its own ([verifier.environment] or tests/Dockerfile) may
        # ship its tests; the agent's image never counts as shipping them.
        own_image = self._task.verifier_dockerfile is not None or bool(
            config.verifier.environment and config.verifier.environment.docker_image
        )
        # A Python verifier always gets its tests and the engine's runner.
        ships_tests = (
            own_image
            and verification.turn.python_verifier is None
            and verifier.exec(trusted('[ -f "$1" ]', "/tests/test.sh")).exit_code == 0
        )
        # The verifier's own sandbox: surveyed afresh, run as the turn's verifier user,
        # and no process of the agent's to end.
        alone = replace(verification, seed=fresh, verifier_user=None, agent_id=None)
        return run_verifier(
            verifier, alone, context, workdir=environment.workdir, upload_tests=not ships_tests
        )

    def _copy_artifacts(self, source: Sandbox, target: Sandbox) -> None:
        """`/logs/artifacts` and each declared artifact, at the same path in `target`,
        streamed from one engine call to the other (never held whole: the agent decides
        how large they are) and re-packed on the way (repack_artifacts: owned by root, no
        set-id bit, no file capability, no device or FIFO, no link out), all of them
        within ARTIFACTS_COPY and ARTIFACTS_KEPT_BYTES together. Past a cap: CopyCapped.
        A stream that breaks (a file changing as it is read) fails the copy:
        SandboxError."""
        declared = [
            (artifact.source, artifact.exclude, artifact.service)
            for artifact in self._task.config.artifacts
        ]
        workdir = self._context.workdir or "/"
        started, read, kept = time.monotonic(), 0, 0
        for path, exclude, service in [(ARTIFACTS_DIR, [], None), *declared]:
            absolute = path if path.startswith("/") else f"{workdir}/{path}"
            origin = source if service in (None, "main") else service_of(source, service)
            chunks = origin.iter_archive(absolute)
            if chunks is None:
                continue
            # One budget for the whole set: what one artifact used, the next one lacks.
            limits = replace(
                ARTIFACTS_COPY,
                read_bytes=ARTIFACTS_COPY.read_bytes - read,
                seconds=max(ARTIFACTS_COPY.seconds - (time.monotonic() - started), 0.001),
            )
            stream = bounded(chunks, limits, "the agent's artifacts")
            repacked = RepackedArtifact(stream, exclude, ARTIFACTS_KEPT_BYTES - kept)
            parent = absolute.rstrip("/").rsplit("/", 1)[0] or "/"
            try:
                target.exec(trusted('$B mkdir -p "$1"', parent), user=ROOT_USER)
                target.write_archive(repacked, parent)
            except (tarfile.TarError, OSError, ValueError) as error:
                raise SandboxError(f"copying {absolute} broke off: {error}") from None
            finally:
                stream.close()
            read, kept = read + stream.read, kept + repacked.kept


def _lost(error: SandboxError) -> VerifierRun:
    lost = f"the separate verifier did not start: {error}"
    return VerifierRun(RewardReading.failed(FailureKind.SANDBOX_LOST, lost, masked=True))
