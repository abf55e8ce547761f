"""What a verifier mode is: one way to run a turn's verifier on what its agent left. A
mode is made from the episode's context and its launcher (for a sandbox of its own)."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Protocol

from pytest_harbor.engine.context import EpisodeContext
from pytest_harbor.engine.verification import Verification, VerifierRun
from pytest_harbor.sandboxes.base import Sandbox, SandboxError

__all__ = ["Verification", "VerifierMode", "blamed_on"]


def blamed_on(
    context: EpisodeContext, sandbox: Sandbox, what: str, verify: Callable[[], VerifierRun]
) -> VerifierRun:
    """`verify()` in a verifier's own sandbox: its failures are blamed on that sandbox
    (what is in it besides its image came from the agent)."""
    try:
        return verify()
    except SandboxError as error:
        return VerifierRun(context.fault(sandbox, error, f"verifying in {what}"))


class VerifierMode(Protocol):
    """Runs `tests/test.sh` for a turn and reads its reward. A SandboxError the mode lets
    through is the agent's sandbox's (the episode blames it, engine/faults.py)."""

    #: The mode's name in rows: `shared`, `snapshot` or `separate`.
    name: ClassVar[str]

    def verify(self, sandbox: Sandbox, verification: Verification) -> VerifierRun:
        """Verify what the agent left in `sandbox`."""
        ...
