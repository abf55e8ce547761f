"""What a provider or a sandbox can be asked beside the contract (base.py), when it can:
whether it works at all, whether it has GPUs to give, whether a sandbox still runs.
Runtime-checkable protocols; base.py re-exports them."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["ChecksGpus", "ReadinessCheck", "TellsLiveness"]


@runtime_checkable
class TellsLiveness(Protocol):
    """A sandbox that can say cheaply whether it is still there and running, where its
    status() costs more (the docker provider's reads the sandbox's process count)."""

    def alive(self) -> bool:
        """Whether it is there and running; raises SandboxError when the engine cannot be
        asked."""
        ...


@runtime_checkable
class ReadinessCheck(Protocol):
    """A provider that can tell, before a run starts anything, that it cannot work at all
    (its engine does not answer): the run then stops at once with its one message."""

    def check_ready(self) -> None:
        """Raise SandboxStartError naming what was tried and the fix."""
        ...


@runtime_checkable
class ChecksGpus(Protocol):
    """A provider whose capabilities say GPUs, but whose engine may have none to give: it
    says so before a GPU task is collected."""

    def gpu_problem(self) -> str | None:
        """Why a sandbox here cannot get GPUs (naming the engine), or None when it can."""
        ...
