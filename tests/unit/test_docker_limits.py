"""What a docker sandbox may take of its engine, the same for a container and for a
Compose project's `main`; and the one module that runs `docker compose`."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

import pytest_harbor
from pytest_harbor.sandboxes.base import SandboxSpec, SandboxStartError
from pytest_harbor.sandboxes.docker.engine import Engine
from pytest_harbor.sandboxes.docker.limits import (
    FOREVER_S,
    GPU_RUNTIME,
    Limits,
    keep_alive,
    lifetime,
)


class _Engine:
    """An engine with `cpus` CPUs; None: asking is a failure."""

    def __init__(self, cpus: int | None) -> None:
        self._cpus = cpus

    @property
    def cpus(self) -> int:
        if self._cpus is None:
            raise AssertionError("the engine was asked for its CPUs")
        return self._cpus


def _limits(spec: SandboxSpec, cpus: int | None = None) -> Limits:
    return Limits.of(spec, cast(Engine, _Engine(cpus)))


def test_a_lifetime_is_whole_seconds_within_what_the_keep_alive_holds() -> None:
    assert lifetime(None) == FOREVER_S
    assert lifetime(1e300) == FOREVER_S
    assert lifetime(0.2) == 1
    assert lifetime(-5) == 1
    assert lifetime(10.5) == 11


def test_the_keep_alive_sleeps_for_the_sandbox_s_lifetime() -> None:
    entrypoint, command = keep_alive(SandboxSpec(image="x", ttl_s=90.2))
    assert "91" in entrypoint + command
    entrypoint, command = keep_alive(SandboxSpec(image="x"))
    assert str(FOREVER_S) in entrypoint + command


def test_a_container_and_a_compose_main_get_the_same_limits() -> None:
    spec = SandboxSpec(image="x", cpus=8, memory_mb=512, pids_limit=100)
    limits = _limits(spec, cpus=2)
    assert limits == Limits(cpus=2, memory="512m", pids=100)
    assert limits.host_config(spec) == {
        "pids_limit": 100,
        "nano_cpus": 2_000_000_000,
        "mem_limit": "512m",
        "memswap_limit": "512m",
    }
    assert limits.compose_service(spec) == {
        "cpus": 2,
        "mem_limit": "512m",
        "memswap_limit": "512m",
        "pids_limit": 100,
    }
    fraction = SandboxSpec(image="x", cpus=0.5)
    assert _limits(fraction, cpus=2).host_config(fraction)["nano_cpus"] == 500_000_000


def test_without_limits_the_engine_is_not_asked_and_compose_gets_no_keys() -> None:
    spec = SandboxSpec(image="x", pids_limit=None)
    limits = _limits(spec)
    assert limits.host_config(spec) == {"pids_limit": None}
    assert limits.compose_service(spec) == {}


def test_gpus_are_asked_for_in_each_form_and_a_gpu_type_is_refused_in_both() -> None:
    spec = SandboxSpec(image="x", gpus=2, pids_limit=None)
    (request,) = _limits(spec).host_config(spec)["device_requests"]
    assert request["Count"] == 2
    devices = _limits(spec).compose_service(spec)["deploy"]["resources"]["reservations"]
    assert devices == {"devices": [{"driver": GPU_RUNTIME, "count": 2, "capabilities": ["gpu"]}]}
    typed = SandboxSpec(image="x", gpus=1, gpu_type="H100")
    for form in (Limits.host_config, Limits.compose_service):
        with pytest.raises(SandboxStartError, match="cannot choose a GPU type"):
            form(_limits(typed), typed)


def test_only_the_compose_cli_module_runs_the_compose_cli() -> None:
    package = Path(pytest_harbor.__file__).parent
    running = [
        str(path.relative_to(package))
        for path in sorted(package.rglob("*.py"))
        if '"docker", "compose"' in path.read_text()
    ]
    assert running == ["sandboxes/compose/cli.py"]
