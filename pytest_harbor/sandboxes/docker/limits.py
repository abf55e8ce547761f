"""What a sandbox may take of its engine, worked out once for a container and for a
Compose project's `main`: its keep-alive's lifetime, its CPUs, memory, processes and
GPUs."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import docker.types

from pytest_harbor.sandboxes.base import SandboxSpec, SandboxStartError
from pytest_harbor.sandboxes.docker.engine import Engine
from pytest_harbor.sandboxes.docker.first_process import first_process

__all__ = [
    "FOREVER_S",
    "GPU_RUNTIME",
    "Limits",
    "compose_gpu_request",
    "gpu_request",
    "keep_alive",
    "lifetime",
]

#: The keep-alive sleep of a sandbox with no lifetime; removal is forceful, so the sleep
#: never needs a signal.
FOREVER_S = 2147483647
#: The runtime an engine lists when the NVIDIA Container Toolkit is set up for it.
GPU_RUNTIME = "nvidia"


def lifetime(ttl_s: float | None) -> int:
    """A sandbox's lifetime in whole seconds, at least 1, at most FOREVER_S (what the
    keep-alive's arithmetic holds: a task's timeouts of 1e300 s made one that ended at
    once); FOREVER_S without a ttl."""
    if ttl_s is None:
        return FOREVER_S
    return min(FOREVER_S, max(1, math.ceil(ttl_s)))


def keep_alive(spec: SandboxSpec) -> tuple[list[str], list[str]]:
    """The entrypoint and command of the sandbox's first process. The keep-alive is the
    sandbox's lifetime: a leaked one ends by itself, and the reaper removes it."""
    return first_process(
        lifetime(spec.ttl_s), spec.directories, spec.start_script, spec.start_arguments
    )


@dataclass(frozen=True)
class Limits:
    """A sandbox's limits on its engine: CPUs (never more than the engine has), memory
    (swap included: none beyond it), processes; its GPUs are asked for by gpu_request()."""

    cpus: float | None
    memory: str | None
    pids: int | None

    @classmethod
    def of(cls, spec: SandboxSpec, engine: Engine) -> Limits:
        return cls(
            # A task may ask for more CPUs than this engine has; it gets them all.
            cpus=None if spec.cpus is None else min(spec.cpus, engine.cpus),
            memory=None if spec.memory_mb is None else f"{spec.memory_mb}m",
            pids=spec.pids_limit,
        )

    def host_config(self, spec: SandboxSpec) -> dict[str, Any]:
        """The limits as `create_host_config` arguments, the GPUs' device request with them."""
        limits: dict[str, Any] = {"pids_limit": self.pids}
        if self.cpus is not None:
            limits["nano_cpus"] = int(self.cpus * 1e9)
        if self.memory is not None:
            limits["mem_limit"] = limits["memswap_limit"] = self.memory
        return limits | gpu_request(spec)

    def compose_service(self, spec: SandboxSpec) -> dict[str, Any]:
        """The limits as a Compose service's keys, the GPUs' reservation with them."""
        limits: dict[str, Any] = {}
        if self.cpus is not None:
            limits["cpus"] = self.cpus
        if self.memory is not None:
            limits["mem_limit"] = limits["memswap_limit"] = self.memory
        if self.pids is not None:
            limits["pids_limit"] = self.pids
        return limits | compose_gpu_request(spec)


def gpu_request(spec: SandboxSpec) -> dict[str, Any]:
    """The host configuration's device request for the sandbox's GPUs (`docker run
    --gpus N`); none without GPUs. A GPU type cannot be asked of Docker: refused."""
    if spec.gpu_type is not None:
        raise SandboxStartError(
            f"the docker sandbox cannot choose a GPU type ({spec.gpu_type!r}): "
            "turn request_gpu_type off, or give GPU tasks a provider that can "
            "(gpu_sandbox_provider)"
        )
    if not spec.gpus:
        return {}
    return {
        "device_requests": [docker.types.DeviceRequest(count=spec.gpus, capabilities=[["gpu"]])]
    }


def compose_gpu_request(spec: SandboxSpec) -> dict[str, Any]:
    """The same for `main` in a Compose project (a device reservation)."""
    gpu_request(spec)  # a type is refused here too
    if not spec.gpus:
        return {}
    device = {"driver": GPU_RUNTIME, "count": spec.gpus, "capabilities": ["gpu"]}
    return {"deploy": {"resources": {"reservations": {"devices": [device]}}}}
