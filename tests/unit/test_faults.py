"""Whose fault a failed step is: decided from the engine's view, and an engine that could
not be reached for the step is the engine's fault whatever it says afterwards."""

from __future__ import annotations

import pytest

from pytest_harbor.engine.failures import EpisodeError, FailureKind
from pytest_harbor.engine.faults import blame, fault
from pytest_harbor.redaction import Redactor
from pytest_harbor.sandboxes.base import EngineUnreachable, SandboxError, SandboxStatus


class Seen:
    """A sandbox as far as blame() looks at one: what its engine says of it."""

    id = "0123456789abcdef"

    def __init__(self, status: SandboxStatus) -> None:
        self._status = status

    def status(self) -> SandboxStatus:
        return self._status


RUNNING = SandboxStatus(present=True, running=True)


def test_a_failed_step_in_a_sandbox_that_still_runs_is_the_sandboxs() -> None:
    reading = blame(Seen(RUNNING), SandboxError("exec failed: boom"), "verifying")  # type: ignore[arg-type]
    assert reading is not None
    assert reading.failure_kind == FailureKind.VERIFIER_TAMPERED


def test_an_engine_that_could_not_be_reached_is_to_blame_though_it_says_running() -> None:
    """An engine shutting down refuses new connections yet answers on one it holds."""
    error = EngineUnreachable("exec failed: ('Connection aborted.', FileNotFoundError(2))")
    assert blame(Seen(RUNNING), error, "verifying") is None  # type: ignore[arg-type]
    assert blame(Seen(RUNNING), error, "verifying", root_had_it=True) is None  # type: ignore[arg-type]


def test_a_step_the_engine_could_not_be_reached_for_ends_the_episode_with_no_result() -> None:
    error = EngineUnreachable("exec failed: ('Connection aborted.', FileNotFoundError(2))")
    with pytest.raises(EpisodeError) as raised:
        fault(Seen(RUNNING), error, "verifying", episode="e", redactor=Redactor())  # type: ignore[arg-type]
    assert raised.value.failure_kind == FailureKind.SANDBOX_LOST
