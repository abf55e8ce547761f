"""audited-docker: a complete pytest-harbor sandbox provider in one module.

It starts the sandboxes pytest-harbor's own docker provider starts, with two options of
its own: `extra_labels`, labels every sandbox carries, and `audit_log`, a file it appends
one JSON line to for every start, command, network change and stop. It passes `network`
and `builder` on to the docker provider.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pytest_harbor.sandboxes import (
    ExecResult,
    ImageConfig,
    ImageLayer,
    ImageSource,
    NamesBuilder,
    ProviderContext,
    ProviderFactory,
    ProviderOptionsError,
    Sandbox,
    SandboxProvider,
    SandboxSpec,
    SandboxStatus,
    SweepsLeftovers,
    service_of,
)
from pytest_harbor.sandboxes.base import ArchiveStream, Spawned
from pytest_harbor.sandboxes.docker import docker_provider

#: The options this provider reads itself.
OWN_OPTIONS = ("extra_labels", "audit_log")
#: The docker provider's options it passes on: those it knows it wraps as they are (a
#: docker option added later may change what docker_provider() makes).
PASSED_ON = ("network", "builder")


def audited_docker(*, options: Mapping[str, Any], context: ProviderContext) -> AuditedDocker:
    """The factory the entry point names: called once in every process of the run with
    the `sandbox_provider_options` setting and what the run says of itself."""
    unknown = sorted(set(options) - {*OWN_OPTIONS, *PASSED_ON})
    if unknown:
        raise ProviderOptionsError(
            "audited-docker takes extra_labels and audit_log, and network and builder for "
            "the docker provider, not: " + ", ".join(unknown)
        )
    labels = _extra_labels(options.get("extra_labels", {}))
    log = _audit_log_path(options.get("audit_log"), context)
    # Docker checks its own options; its message names the key.
    docker = docker_provider({key: options[key] for key in PASSED_ON if key in options}, context)
    return AuditedDocker(docker, labels, AuditLog(log, context))


def _extra_labels(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise ProviderOptionsError(
            f"extra_labels must map label names to values ({{team: evals}}), not {value!r}"
        )
    for key, label in value.items():
        if not isinstance(key, str) or not isinstance(label, str):
            raise ProviderOptionsError(f"extra_labels.{key} must be a string, not {label!r}")
        if key.startswith("pytest-harbor."):
            # The run's own labels: the reaper and the run's clean-up find sandboxes by them.
            raise ProviderOptionsError(f"extra_labels.{key}: pytest-harbor.* labels are reserved")
    return dict(value)


def _audit_log_path(value: Any, context: ProviderContext) -> Path:
    if value is None:
        # The run's scratch folder goes when the run ends: the log is kept beside it.
        return Path(tempfile.gettempdir()) / "audited-docker" / f"{context.run_id}.jsonl"
    if not isinstance(value, str) or not value:
        raise ProviderOptionsError(f"audit_log must be a file's path, not {value!r}")
    path = Path(value).expanduser().absolute()
    if not path.parent.is_dir():
        raise ProviderOptionsError(f"audit_log: the folder {path.parent} does not exist")
    return path


class AuditLog:
    """One JSON line per operation, from every process of the run (xdist workers too)."""

    def __init__(self, path: Path, context: ProviderContext) -> None:
        self.path = path
        self.run_id = context.run_id
        # A lock of the run's own, shared by its processes, keeps their lines whole.
        self._lock = context.scratch_dir / "audited-docker.lock"

    def write(self, operation: str, sandbox: str, **details: Any) -> None:
        line = json.dumps(
            {
                "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
                "run": self.run_id,
                "pid": os.getpid(),
                "op": operation,
                "sandbox": sandbox[:12],
                **details,
            }
        )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock.parent.mkdir(parents=True, exist_ok=True)
        with self._lock.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            with self.path.open("a", encoding="utf-8") as log:
                log.write(line + "\n")


class AuditedDocker:
    """The provider: docker's images and sandboxes, each sandbox labelled and audited."""

    name = "audited-docker"

    def __init__(self, docker: SandboxProvider, labels: Mapping[str, str], log: AuditLog) -> None:
        self.docker = docker
        self.extra_labels = dict(labels)
        self.log = log
        # The same sandboxes as docker's: a task gets what the docker provider can give.
        self.capabilities = docker.capabilities

    def start(self, spec: SandboxSpec) -> AuditedSandbox:
        # The run's labels win: they are how the reaper and the clean-up find a sandbox.
        spec = replace(spec, labels={**self.extra_labels, **spec.labels})
        sandbox = AuditedSandbox(self.docker.start(spec), self.log)
        self.log.write(
            "start", sandbox.id, image=spec.image, network=spec.network, labels=dict(spec.labels)
        )
        return sandbox

    # Images, the reaper's calls and clean-up: docker's own.

    def prepare_image(self, source: ImageSource) -> str:
        return self.docker.prepare_image(source)

    def image_config(self, image: str) -> ImageConfig:
        return self.docker.image_config(image)

    def prepare_layer(self, layer: ImageLayer) -> str:
        return self.docker.prepare_layer(layer)

    def remove_image(self, image: str) -> None:
        self.docker.remove_image(image)

    def remove_labelled(self, labels: Mapping[str, str]) -> int:
        return self.docker.remove_labelled(labels)

    def labelled(self, key: str) -> list[tuple[str, dict[str, str]]]:
        return self.docker.labelled(key)

    def remove(self, sandbox_id: str) -> None:
        self.docker.remove(sandbox_id)

    # Optional calls the run makes when a provider has them: what Compose projects leave
    # beside their containers (for the reaper), and the builder the summary names.

    def labelled_leftovers(self, key: str) -> list[tuple[str, dict[str, str]]]:
        if isinstance(self.docker, SweepsLeftovers):
            return self.docker.labelled_leftovers(key)
        return []

    def remove_leftover(self, reference: str) -> None:
        if isinstance(self.docker, SweepsLeftovers):
            self.docker.remove_leftover(reference)

    @property
    def builder(self) -> str:
        return self.docker.builder if isinstance(self.docker, NamesBuilder) else "unknown"


class AuditedSandbox:
    """One docker sandbox; its commands, network changes and removal go to the log."""

    def __init__(self, sandbox: Sandbox, log: AuditLog) -> None:
        self.sandbox = sandbox
        self.log = log
        self._stopped = False

    @property
    def id(self) -> str:
        return self.sandbox.id

    def exec(
        self,
        command: Sequence[str],
        *,
        user: str | None = None,
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        result = self.sandbox.exec(
            command, user=user, workdir=workdir, env=env, timeout=timeout, stdin=stdin
        )
        # The command and its user, never the environment: the run's secrets travel there.
        self.log.write(
            "exec",
            self.id,
            command=list(command),
            user=user,
            exit_code=result.exit_code,
            timed_out=result.timed_out,
        )
        return result

    def spawn(
        self, command: Sequence[str], *, user: str | None = None, workdir: str | None = None
    ) -> Spawned:
        spawned = self.sandbox.spawn(command, user=user, workdir=workdir)
        self.log.write("spawn", self.id, command=list(command), user=user)
        return spawned

    def set_network(self, enabled: bool) -> None:
        self.sandbox.set_network(enabled)
        self.log.write("set_network", self.id, enabled=enabled)

    def stop(self) -> None:
        self.sandbox.stop()
        if not self._stopped:
            self._stopped = True
            self.log.write("stop", self.id)

    # A Compose task's other services (docker can start Compose projects).
    def service(self, name: str) -> AuditedSandbox:
        return AuditedSandbox(service_of(self.sandbox, name), self.log)

    # Files in and out: not audited, docker's own.

    def upload(self, source: Path | Mapping[str, bytes], target: str) -> None:
        self.sandbox.upload(source, target)

    def read_archive(self, source: str) -> bytes | None:
        return self.sandbox.read_archive(source)

    def write_archive(self, data: bytes | Iterable[bytes], into: str) -> None:
        self.sandbox.write_archive(data, into)

    def download(self, source: str) -> dict[str, bytes]:
        return self.sandbox.download(source)

    def iter_archive(self, source: str) -> ArchiveStream | None:
        return self.sandbox.iter_archive(source)

    def snapshot(self, labels: Mapping[str, str]) -> str:
        return self.sandbox.snapshot(labels)

    # What the engine says of the sandbox: grading decides by it whether a failed step
    # was the sandbox's doing or the engine's (write-a-provider.md, What grading relies on).
    def status(self) -> SandboxStatus:
        return self.sandbox.status()


# Checked by mypy: the factory, its provider and their sandboxes keep the protocols.
_: ProviderFactory = audited_docker
