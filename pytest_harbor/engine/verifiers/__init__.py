"""The verifier modes, one module each behind one protocol: `shared` (the agent's own
sandbox), `snapshot` (a fresh sandbox from an image of the agent's file system) and
`separate` (a fresh sandbox of the verifier's own image, given the agent's artifacts)."""

from __future__ import annotations

from pytest_harbor.engine.context import EpisodeContext
from pytest_harbor.engine.launcher import SandboxLauncher
from pytest_harbor.engine.verifiers.protocol import Verification, VerifierMode
from pytest_harbor.engine.verifiers.separate import SeparateVerifier, verifies_separately
from pytest_harbor.engine.verifiers.shared import SharedVerifier
from pytest_harbor.engine.verifiers.snapshot import SnapshotVerifier

__all__ = [
    "SeparateVerifier",
    "SharedVerifier",
    "SnapshotVerifier",
    "Verification",
    "VerifierMode",
    "verifier_mode",
    "verifies_separately",
]


def verifier_mode(context: EpisodeContext, launcher: SandboxLauncher) -> VerifierMode:
    """The mode the episode's task and settings call for."""
    if context.separate_verifier:
        return SeparateVerifier(context, launcher)
    if context.settings.verify_from_snapshot:
        return SnapshotVerifier(context, launcher)
    return SharedVerifier(context, launcher)
