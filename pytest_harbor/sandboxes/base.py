"""The sandbox provider protocol: start from a spec, exec, upload, download, stop."""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pytest_harbor.labels import RUN_LABEL
from pytest_harbor.sandboxes.checks import ChecksGpus, ReadinessCheck, TellsLiveness
from pytest_harbor.sandboxes.routes import (
    RELAY_NAME,
    FiltersEgress,
    GuardsBorder,
    Opening,
    ReachesThisMachine,
)
from pytest_harbor.settings import DEFAULT_PIDS_LIMIT
from pytest_harbor.tasks.config import RESERVED_ID

__all__ = [
    "KEEPALIVE_USER",
    "RELAY_NAME",
    "ROOT_USER",
    "RUN_LABEL",
    "SEALED_BUSYBOX",
    "TRUSTED_BUSYBOX",
    "TRUSTED_TOOLS",
    "ArchiveStream",
    "BuildOptions",
    "CarriesAgentCommands",
    "ChecksGpus",
    "EngineUnreachable",
    "ExecResult",
    "FiltersEgress",
    "GuardsBorder",
    "ImageConfig",
    "ImageLayer",
    "ImageSource",
    "NamesBuilder",
    "Opening",
    "Placement",
    "PlacesEpisodes",
    "ProviderContext",
    "ProviderFactory",
    "ProviderOptionsError",
    "ReachesThisMachine",
    "ReadinessCheck",
    "ReportsStart",
    "Sandbox",
    "SandboxCapabilities",
    "SandboxError",
    "SandboxGroup",
    "SandboxProvider",
    "SandboxSpec",
    "SandboxStartError",
    "SandboxStatus",
    "ServiceGroup",
    "Spawned",
    "SweepsLeftovers",
    "TellsLiveness",
    "WatchesOver",
    "for_agent",
    "is_root_user",
    "service_of",
    "set_phase_network",
]


#: A read-only folder in every sandbox holding a static busybox, for the engine's own use
#: (the shell that drives a verification, its timeout, kill, tar): nothing inside the
#: sandbox, root included, can change it, and it needs nothing from the image.
TRUSTED_TOOLS = "/.pytest-harbor"
TRUSTED_BUSYBOX = f"{TRUSTED_TOOLS}/busybox"
#: The same busybox, readable by nobody (mode 0111): a process started from it cannot be
#: traced or have its memory read by another process without CAP_SYS_PTRACE, root in the
#: sandbox included. The sandbox's first process (its keep-alive) runs from it.
SEALED_BUSYBOX = f"{TRUSTED_TOOLS}/busybox-sealed"
#: Root, as the engine's own commands run: by number, so that no passwd file (an agent
#: running as root can empty it) can keep them from starting.
ROOT_USER = "0:0"
#: The user the keep-alive runs as: none of the image's own, and no task may name it
#: (tasks/config.py refuses it, the seed refuses a name that is it), so that no agent or
#: verifier shares it.
KEEPALIVE_USER = f"{RESERVED_ID}:{RESERVED_ID}"


def is_root_user(user: str) -> bool:
    """`user` (`name`, `uid`, either with `:group`) is root by name or number, or the
    image's default when that is root (empty)."""
    return user.split(":", 1)[0] in ("", "root", "0")


class SandboxError(Exception):
    """The sandbox or its engine failed (not the command run inside it)."""

    __module__ = "pytest_harbor"


class EngineUnreachable(SandboxError):
    """The sandbox's engine could not be reached for a call (its connection refused or
    dropped): nothing inside a sandbox brings this about."""

    __module__ = "pytest_harbor"


class SandboxStartError(SandboxError):
    """The image could not be made or the sandbox did not start."""

    __module__ = "pytest_harbor"


@dataclass(frozen=True)
class SandboxCapabilities:
    """What a provider can give a task; a task needing more is refused at collection."""

    gpus: bool = False
    #: A GPU type can be asked for (`request_gpu_type`).
    gpu_types: bool = False
    tpus: bool = False
    windows: bool = False
    network_allowlists: bool = False
    compose: bool = False
    #: Users written `name:group` or `uid:gid` are applied as such.
    user_groups: bool = False
    #: A sandbox's network can be taken away for a phase (`network_mode = "no-network"`).
    network_off: bool = True
    #: An environment built from a Dockerfile can be run (the provider makes its image, or
    #: has it made and sends it where its sandboxes can pull it).
    builds: bool = True
    #: `snapshot()` makes an image a verifier can start from (`verify_from_snapshot`).
    snapshots: bool = True
    #: An agent inside a sandbox can reach the model relay on this machine, in every
    #: phase (its sandboxes are ReachesThisMachine, and can go behind an egress).
    model_relay: bool = False


@dataclass(frozen=True)
class BuildOptions:
    """How a build context becomes an image beyond its files (the Compose `build` options
    pytest-harbor honours); the defaults build the context's `Dockerfile` as it is.

    Every field but `no_cache` and `pull` says what the image is, and so is part of the
    content hash that names it; those two say how a build fetches, not what it makes.
    """

    #: The Dockerfile, when not the context's own `Dockerfile` (an absolute path).
    dockerfile: Path | None = None
    #: The Dockerfile's text, given in place of a file.
    dockerfile_inline: str | None = None
    #: Build arguments, `(name, value)` sorted by name.
    args: tuple[tuple[str, str], ...] = ()
    #: The stage of a multi-stage Dockerfile to build (None: the last).
    target: str | None = None
    #: Labels the image carries, `(key, value)` sorted (the run's own are added after).
    labels: tuple[tuple[str, str], ...] = ()
    #: Lines added to the steps' `/etc/hosts`, `(host, address)` sorted.
    extra_hosts: tuple[tuple[str, str], ...] = ()
    #: `none`: the steps have no network; None: the builder's default.
    network: str | None = None
    #: The platform to build for (None: the engine's own).
    platform: str | None = None
    #: Build without the builder's cache.
    no_cache: bool = False
    #: Pull a newer version of the base images first.
    pull: bool = False


@dataclass(frozen=True)
class ImageSource:
    """Where a task's image comes from: a prebuilt name, or a build context to build
    (with `build`'s options)."""

    docker_image: str | None
    context_dir: Path | None
    build_timeout_sec: float
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Further tries of a pull that failed (the `image_pull_retries` setting).
    pull_retries: int = 0
    build: BuildOptions = field(default_factory=BuildOptions)


@dataclass(frozen=True)
class ImageLayer:
    """An image made from `base` by running `script` in it as root (an agent's install):
    made once per base image (its id) and `key`, a content hash of everything else that
    goes into it."""

    base: str
    script: str
    key: str
    #: A name for messages ("the mini-swe-agent 2.4.6 install").
    what: str
    timeout_sec: float
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Make it again even when one exists, unless the one there carries this label
    #: (the run's own: made earlier in the same run, by another worker, say).
    rebuild_unless: tuple[str, str] | None = None


@dataclass(frozen=True)
class ImageConfig:
    """What an image says about how it runs."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    workdir: str = ""
    user: str = ""
    #: Its `ENV` (`KEY=value` each), `LABEL`s and `HEALTHCHECK` test: nothing the engine
    #: runs by, but text anyone with the image can read (the check searches it).
    env: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    healthcheck: tuple[str, ...] = ()


@dataclass(frozen=True)
class SandboxGroup:
    """A Compose project the sandbox is the `main` service of: `config` is the checked,
    canonical Compose configuration, `built` the images made for services with a build,
    `episode` names the project."""

    config: Mapping[str, Any]
    built: Mapping[str, str]
    episode: str


@dataclass(frozen=True)
class SandboxSpec:
    """Everything a provider needs to start one sandbox."""

    image: str
    workdir: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    cpus: float | None = None
    memory_mb: int | None = None
    network: bool = True
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Directories (absolute path -> mode) that exist, empty or not, once started.
    directories: Mapping[str, int] = field(default_factory=dict)
    #: A script for the trusted shell, with its arguments, that the sandbox runs as root
    #: once its directories are made and before anything else runs in it; its standard
    #: output is what `start_output()` gives (ReportsStart). A provider that cannot run it
    #: so ignores it (the engine then runs it by exec).
    start_script: str | None = None
    start_arguments: tuple[str, ...] = ()
    #: The sandbox ends by itself after this many seconds (a leak cannot live forever).
    ttl_s: float | None = None
    #: Starting takes at most this long, or it fails.
    ready_timeout_s: float | None = None
    #: Start the sandbox as the `main` service of this Compose project, its other
    #: services first.
    group: SandboxGroup | None = None
    #: The most processes (threads included) the sandbox may hold at once; None: no cap.
    pids_limit: int | None = DEFAULT_PIDS_LIMIT
    #: GPUs the sandbox gets (`[environment].gpus`), and the type asked for (the first of
    #: `gpu_types`, only with `request_gpu_type`; a provider that cannot choose one
    #: refuses it).
    gpus: int | None = None
    gpu_type: str | None = None
    #: Some phase of the sandbox has an allow-listed network: it reaches the outside only
    #: through what enforces one (FiltersEgress), from its start. `allowed_hosts` is its
    #: first phase's list (None: the first phase is not an allow-list).
    filtered: bool = False
    allowed_hosts: tuple[str, ...] | None = None


@dataclass(frozen=True)
class SandboxStatus:
    """What the provider's engine says of a sandbox (not anything inside it, which an
    agent could change): whether it is still there and running, and whether something in
    it ran out of memory (killed by the kernel) or of processes (its pids cap reached)."""

    present: bool
    running: bool = False
    out_of_memory: bool = False
    out_of_processes: bool = False
    #: The exit code of its first process, once it has ended.
    exit_code: int | None = None


@dataclass(frozen=True)
class ExecResult:
    """The outcome of one command: a non-zero exit is a value, not an exception."""

    exit_code: int
    stdout_bytes: bytes = b""
    stderr_bytes: bytes = b""
    timed_out: bool = False

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", errors="replace")


class Spawned(Protocol):
    """A command left running in a sandbox, watched by the engine (not by anything inside
    the sandbox, which an agent could change)."""

    def exit_code(self) -> int | None:
        """Its exit code once it has ended, else None."""
        ...

    def output_tail(self) -> str:
        """The last few KiB of what it printed."""
        ...


class ArchiveStream(Protocol):
    """A tar stream read from a sandbox, chunk by chunk as it arrives. `close()` ends
    the transfer at once (the connection to the engine too, not just this object): a
    reader that stops early calls it, and a deadline may call it from another thread to
    end a read that waits. A generator is one; so is anything with these two methods."""

    def __iter__(self) -> Iterator[bytes]: ...

    def __next__(self) -> bytes: ...

    def close(self) -> None: ...


class Sandbox(Protocol):
    """One running sandbox."""

    @property
    def id(self) -> str: ...

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
        """Run `command` with `stdin` as its input; at `timeout` seconds the process and
        its children are killed and `timed_out` is set."""
        ...

    def spawn(
        self, command: Sequence[str], *, user: str | None = None, workdir: str | None = None
    ) -> Spawned:
        """Start `command` and leave it running; the engine keeps watching it."""
        ...

    def upload(self, source: Path | Mapping[str, bytes], target: str) -> None:
        """Copy a folder's contents (or named files) into the existing folder `target`."""
        ...

    def read_archive(self, source: str) -> bytes | None:
        """`source` (file or folder) as a tar stream whose top entry is its base name;
        None when it does not exist."""
        ...

    def write_archive(self, data: bytes | Iterable[bytes], into: str) -> None:
        """Unpack a tar stream (as read_archive gives it, or in chunks as iter_archive
        does) into the existing folder `into`."""
        ...

    def download(self, source: str) -> dict[str, bytes]:
        """Every regular file below the folder `source`, keyed by its path relative to it;
        a file `source` comes back under its own name. Nothing there gives {}."""
        ...

    def iter_archive(self, source: str) -> ArchiveStream | None:
        """`source` as read_archive gives it, in chunks as they arrive (nothing held whole);
        None when it does not exist. The caller bounds what it reads
        (pytest_harbor.sandboxes.copies) and closes the stream when it stops."""
        ...

    def set_network(self, enabled: bool) -> None:
        """Give the sandbox its network, or take it away (loopback stays), from now on.
        Only a sandbox started with `network` can have it again."""
        ...

    def snapshot(self, labels: Mapping[str, str]) -> str:
        """An image of the sandbox's file system as it is now (its processes are not part
        of it), carrying `labels`; remove it with the provider's remove_image()."""
        ...

    def status(self) -> SandboxStatus:
        """The sandbox as its engine sees it; raises SandboxError when the engine cannot
        be asked. The engine decides from it whether a failed step was the sandbox's
        doing (scored) or its own (masked)."""
        ...

    def stop(self) -> None:
        """Remove the sandbox at once; safe to call twice."""
        ...


class SandboxProvider(Protocol):
    """A kind of sandbox (docker, ...): makes images and starts sandboxes from specs."""

    name: str
    capabilities: SandboxCapabilities

    def prepare_image(self, source: ImageSource) -> str:
        """Return a runnable image reference, building or fetching it when needed."""
        ...

    def image_config(self, image: str) -> ImageConfig:
        """The entrypoint, command, working directory and user `image` declares."""
        ...

    def prepare_layer(self, layer: ImageLayer) -> str:
        """An image of `layer.base` with `layer.script` run in it, made once per
        `layer.key` and kept as a cache; raises SandboxStartError with the script's
        output when it fails. The image runs as `layer.base` does (entrypoint, user)."""
        ...

    def start(self, spec: SandboxSpec) -> Sandbox: ...

    def remove_labelled(self, labels: Mapping[str, str]) -> int:
        """Remove every sandbox carrying all of `labels`; return how many."""
        ...

    def labelled(self, key: str) -> list[tuple[str, dict[str, str]]]:
        """Every sandbox (running or not) with a label `key`: its id and all its labels."""
        ...

    def remove(self, sandbox_id: str) -> None:
        """Remove one sandbox at once; no error when it is already gone."""
        ...

    def remove_image(self, image: str) -> None:
        """Remove an image the run made (a snapshot); no error when it is already gone."""
        ...


@runtime_checkable
class SweepsLeftovers(Protocol):
    """A provider whose sandboxes leave things beside them (a Compose project's networks
    and volumes): the reaper removes those of runs whose process is gone too."""

    def labelled_leftovers(self, key: str) -> list[tuple[str, dict[str, str]]]:
        """Every such thing with a label `key`: a reference for remove_leftover() and its
        labels."""
        ...

    def remove_leftover(self, reference: str) -> None:
        """Remove one; in use or already gone: no error."""
        ...


@runtime_checkable
class WatchesOver(Protocol):
    """A provider that removes what one process made once the process is gone, however
    it ended and with no later run (the docker provider's watchdog on the engine)."""

    def watch(self, labels: Mapping[str, str]) -> None:
        """From now on, what carries every one of `labels` is removed when this process
        is gone; raises SandboxError when that cannot be arranged."""
        ...

    def unwatch(self) -> None:
        """This process is done: what is left of it goes now."""
        ...


@runtime_checkable
class NamesBuilder(Protocol):
    """A provider that builds images with one of several builders, and says which (the
    terminal summary names it)."""

    @property
    def builder(self) -> str: ...


@runtime_checkable
class PlacesEpisodes(Protocol):
    """A provider of several places (engines, clusters): an episode takes a place before
    it makes anything, and everything of the episode goes through the placement's
    provider until the episode gives it back."""

    def place(self) -> Placement:
        """A place with room (it may wait for one); raises SandboxStartError when there
        is none to be had."""
        ...


@runtime_checkable
class ServiceGroup(Protocol):
    """A sandbox that is the `main` service of a Compose project."""

    def service(self, name: str) -> Sandbox:
        """Another service of the project, as a sandbox of its own (exec, archives)."""
        ...


@runtime_checkable
class CarriesAgentCommands(Protocol):
    """A sandbox that carries a harness's commands by a route of its provider's own,
    cheaper than one exec each (the docker provider's command channels). Every other
    command, the engine's own steps first of all, goes by plain exec."""

    def for_agent(self) -> Sandbox:
        """The same sandbox, for a harness's commands."""
        ...


@runtime_checkable
class ReportsStart(Protocol):
    """A sandbox that ran its spec's `start_script` as it started, before anything else."""

    def start_output(self) -> str | None:
        """What the start script printed, when it ran and exited 0; None otherwise."""
        ...


def set_phase_network(
    sandbox: Sandbox, enabled: bool, hosts: tuple[str, ...] | None, relay: str | None = None
) -> None:
    """A phase's network: none, only `hosts` (an allow-list; the sandbox must have been
    started `filtered`), or the whole network (`hosts` None); with `relay` (`IP:PORT` on
    this machine), RELAY_NAME leads to it as well, in any of the three (FiltersEgress)."""
    if isinstance(sandbox, FiltersEgress):
        sandbox.set_egress(enabled, hosts if enabled else None, relay)
    elif relay is not None:
        raise SandboxError(
            f"sandbox {sandbox.id[:12]} cannot reach the model relay as {RELAY_NAME}: its "
            "provider does not filter its egress (FiltersEgress)"
        )
    elif hosts is not None and enabled:
        raise SandboxError(f"sandbox {sandbox.id[:12]} cannot hold its network to an allow-list")
    else:
        sandbox.set_network(enabled)


def for_agent(sandbox: Sandbox) -> Sandbox:
    """`sandbox` as a harness's commands reach it: by its provider's own route where it
    has one (CarriesAgentCommands). What the route may add to the sandbox (processes of
    the provider's, which a root agent can end) is the harness's to meet, never a
    grading step's: the engine hands this view to agents' harnesses alone."""
    return sandbox.for_agent() if isinstance(sandbox, CarriesAgentCommands) else sandbox


def service_of(sandbox: Sandbox, name: str) -> Sandbox:
    """The service `name` of the Compose project `sandbox` is the main service of; raises
    SandboxError when `sandbox` is not part of one."""
    if not isinstance(sandbox, ServiceGroup):
        raise SandboxError(f"no service {name!r}: the task is not a Compose task")
    return sandbox.service(name)


class ProviderOptionsError(ValueError):
    """`sandbox_provider_options` the provider does not take; names the key."""


@dataclass(frozen=True)
class ProviderContext:
    """What a provider learns of the run that makes it."""

    #: The run's id: the value of the `pytest-harbor.run` label on what the run makes.
    run_id: str = "no-run"
    #: A folder of the run's own, shared by its processes on this machine (for locks and
    #: counters that must hold across pytest-xdist workers).
    scratch_dir: Path = Path(tempfile.gettempdir()) / "pytest-harbor-no-run"
    #: Made in a pytest-xdist worker (False in the controller or a run without workers).
    is_worker: bool = False


class ProviderFactory(Protocol):
    """Makes a provider from its `sandbox_provider_options`; raises ProviderOptionsError,
    naming the key, for options it does not take."""

    def __call__(
        self, *, options: Mapping[str, Any], context: ProviderContext
    ) -> SandboxProvider: ...


class Placement(Protocol):
    """Where a provider of several places (engines, clusters) put one episode: the
    provider everything of the episode goes through, held until release()."""

    @property
    def provider(self) -> SandboxProvider: ...

    def release(self) -> None: ...
