"""The `docker` sandbox provider, on the Docker SDK (never the docker CLI)."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import math
import os
import re
import signal
import socket
import ssl
import struct
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import docker.tls
import requests
import urllib3
from docker.utils.socket import STDERR as _STDERR
from docker.utils.socket import STDOUT as _STDOUT
from docker.utils.socket import frames_iter

from pytest_harbor.sandboxes.archives import (
    pack_directories,
    pack_files,
    pack_folder,
    unpack_files,
)
from pytest_harbor.sandboxes.base import (
    KEEPALIVE_USER,
    ROOT_USER,
    RUN_LABEL,
    SEALED_BUSYBOX,
    TRUSTED_BUSYBOX,
    TRUSTED_TOOLS,
    ExecResult,
    ImageConfig,
    ImageLayer,
    ImageSource,
    ProviderContext,
    ProviderOptionsError,
    SandboxCapabilities,
    SandboxError,
    SandboxGroup,
    SandboxProvider,
    SandboxSpec,
    SandboxStartError,
    SandboxStatus,
)
from pytest_harbor.sandboxes.compose import episode_project, project_name
from pytest_harbor.sandboxes.images import build_lock, image_tag_for
from pytest_harbor.sandboxes.output import CappedOutput
from pytest_harbor.threads import join

log = logging.getLogger("pytest_harbor")

__all__ = ["TOOLS_IMAGE", "ComposeSandbox", "DockerProvider", "DockerSandbox", "docker_provider"]

#: The image the trusted tools come from: its /bin/busybox must be statically linked.
#: Pulled when missing, like a task's image; PYTEST_HARBOR_TOOLS_IMAGE names another.
TOOLS_IMAGE = os.environ.get("PYTEST_HARBOR_TOOLS_IMAGE", "busybox:musl")
#: The network a sandbox with network access is on (and that a phase without it leaves).
_NETWORK = "bridge"
#: Volumes and images pytest-harbor keeps as a cache (the trusted tools, install layers).
_CACHE_LABEL = "pytest-harbor.cache"
#: The content hash an install layer was made for.
_LAYER_KEY = "pytest-harbor.content-hash"
#: The labels Compose puts on what it makes.
_PROJECT_LABEL = "com.docker.compose.project"
_SERVICE_LABEL = "com.docker.compose.service"
#: How long `up --wait` may take when the spec sets no limit.
_COMPOSE_UP_S = 900.0
#: Where an install script waits in the image while it runs (removed after).
_INSTALL_SCRIPT = "/tmp/pytest-harbor-install.sh"

#: The oldest engine API pytest-harbor works with (Docker Engine 20.10).
_MIN_API_VERSION = "1.41"
#: Control calls (create, inspect, remove) give up after this long.
_CONTROL_TIMEOUT_S = 300
#: After a deadline kill, how long the output stream may take to end.
_KILL_GRACE_S = 5.0
#: The directory bit of the file mode the engine reports (Go's os.ModeDir).
_GO_MODE_DIR = 1 << 31
#: What a dropped or timed-out connection to the engine raises.
_TRANSPORT_ERRORS = (OSError, requests.exceptions.RequestException, urllib3.exceptions.HTTPError)
#: What a call to the engine raises when the engine refuses it or cannot be reached.
_ENGINE_ERRORS = (docker.errors.APIError, *_TRANSPORT_ERRORS)
#: The keep-alive sleep of a sandbox with no lifetime; removal is forceful, so the sleep
#: never needs a signal.
_FOREVER_S = 2147483647
#: The sandbox's first process, run by the sealed busybox as KEEPALIVE_USER; $1 is its
#: lifetime in seconds. Nothing inside a sandbox, root included, can end it: it ignores
#: every signal it could be sent (the kernel drops the others for a first process), and
#: no agent can trace it (the sealed busybox). It reaps the orphans every sandbox gathers
#: (they become its children; unreaped, each would hold a place under the pids cap) by
#: waiting on the sleep it starts. It forks only then, at its start: a fork refused later
#: (the cap reached) would end the shell, and the sandbox with it. When that sleep ends
#: early (only root can kill it), it sleeps on in its own place, without reaping.
_KEEPALIVE = """trap '' 1 2 3 4 5 6 7 8 10 11 12 13 14 15 16 18 20 21 22 23 24 25 26 27 28 29 30 31
read -r up _ < /proc/uptime
end=$(( ${up%.*} + $1 ))
{busybox} sleep "$1" &
while :; do
  wait
  read -r up _ < /proc/uptime
  left=$(( end - ${up%.*} ))
  [ "$left" -gt 0 ] || exit 0
  exec {busybox} sleep "$left"
done
""".replace("{busybox}", SEALED_BUSYBOX)
#: The keep-alive as an entrypoint; the lifetime is the container's command.
_KEEPALIVE_ENTRYPOINT = [SEALED_BUSYBOX, "sh", "-c", _KEEPALIVE, "sh"]
#: First pause between image pulls; it doubles each try.
_PULL_BACKOFF_S = 0.5
#: Run by the trusted busybox shell: prints its pid (the command exec'd keeps it and leads
#: its process group) on stderr before anything else, so a deadline can kill the whole
#: group; then runs the command found on PATH by its full path (a bare name would run the
#: busybox applet of that name instead of the image's program).
_PID_WRAPPER = """echo "$$" >&2
command=$1; shift
case $command in */*) exec "$command" "$@" ;; esac
IFS=:
for dir in $PATH; do
  if [ -f "$dir/$command" ] && [ -x "$dir/$command" ]; then exec "$dir/$command" "$@"; fi
done
echo "$command: command not found" >&2
exit 127
"""


@dataclass(frozen=True)
class Endpoint:
    """A Docker engine by its address: `unix://PATH`, `tcp://HOST:PORT` (with TLS when
    `cert_path` names a folder holding Docker's ca.pem, cert.pem and key.pem) or
    `ssh://USER@HOST` (through the ssh client on PATH)."""

    url: str
    cert_path: str | None = None
    tls_verify: bool = True

    @property
    def key(self) -> str:
        """A short name of the address, for lock and marker files."""
        return hashlib.sha256(self.url.encode()).hexdigest()[:12]

    def client_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"base_url": self.url}
        if self.url.startswith("ssh://"):
            kwargs["use_ssh_client"] = True
        if self.cert_path is not None:
            folder = Path(self.cert_path)
            kwargs["tls"] = docker.tls.TLSConfig(
                client_cert=(str(folder / "cert.pem"), str(folder / "key.pem")),
                ca_cert=str(folder / "ca.pem") if self.tls_verify else None,
                verify=self.tls_verify,
            )
        return kwargs

    def client(self, *, version: str, timeout: float) -> docker.APIClient:
        return _api_client(self.client_kwargs(), version=version, timeout=timeout)

    def cli_env(self) -> dict[str, str]:
        """The environment that points the docker CLI (Compose, buildx) at this engine."""
        env = {key: value for key, value in os.environ.items() if not key.startswith("DOCKER_")}
        env["DOCKER_HOST"] = self.url
        if self.cert_path is not None:
            env["DOCKER_CERT_PATH"] = self.cert_path
            if self.tls_verify:
                env["DOCKER_TLS_VERIFY"] = "1"
        return env


def _api_client(kwargs: Mapping[str, Any], *, version: str, timeout: float) -> docker.APIClient:
    """An API client. With TLS, the engine's CA is the TLS settings' alone: the
    environment's CA bundle (REQUESTS_CA_BUNDLE, which requests would put first) and its
    proxies are not used, whether the engine is named in the options or by DOCKER_HOST."""
    if not kwargs.get("tls"):
        return docker.APIClient(version=version, timeout=timeout, **kwargs)
    # Asked for after trust_env is off: "auto" would ask at once, trusting it.
    api = docker.APIClient(
        version=_MIN_API_VERSION if version == "auto" else version, timeout=timeout, **kwargs
    )
    api.trust_env = False
    if version == "auto":
        api._version = api._retrieve_server_version()
    return api


class _Engine:
    """The per-process connection to one Docker engine."""

    def __init__(self, endpoint: Endpoint | None = None) -> None:
        try:
            self.api = _api_client(
                endpoint.client_kwargs() if endpoint else _client_kwargs(),
                version="auto",
                timeout=_CONTROL_TIMEOUT_S,
            )
        except docker.errors.DockerException as error:
            raise SandboxStartError(_unreachable(endpoint, str(error))) from None
        self._cpus: int | None = None
        #: Reached over TLS or ssh (named in the options or by DOCKER_HOST alike), where
        #: an exec's connection cannot be half-closed to end the command's input.
        self.tunnelled = self.api.base_url.startswith(("https://", "http+docker://ssh"))

    @property
    def cpus(self) -> int:
        if self._cpus is None:
            self._cpus = int(self.api.info().get("NCPU") or os.cpu_count() or 1)
        return self._cpus


def _unreachable(endpoint: Endpoint | None, why: str) -> str:
    """Why an engine does not answer: the address tried, where it came from, the fix."""
    if endpoint is not None:
        where = f"{endpoint.url} (sandbox_provider_options.hosts)"
    elif os.environ.get("DOCKER_HOST"):
        where = f"{os.environ['DOCKER_HOST']} (DOCKER_HOST)"
    else:
        where = "unix:///var/run/docker.sock (the default; DOCKER_HOST is not set)"
    return (
        f"the Docker engine at {where} does not answer: {why}. Start it (as root, .ci/setup "
        "does: it installs and starts dockerd), or set DOCKER_HOST to an engine that answers"
    )


def _client_kwargs() -> dict[str, Any]:
    return docker.utils.kwargs_from_env()  # type: ignore[no-any-return]


_engines: dict[tuple[int, Endpoint | None], _Engine] = {}
_engines_lock = threading.Lock()


def _engine(endpoint: Endpoint | None = None) -> _Engine:
    """The connection to `endpoint` (None: the engine the environment names)."""
    # Keyed by pid too: a forked process must not share the parent's connections.
    key = (os.getpid(), endpoint)
    with _engines_lock:
        if key not in _engines:
            _engines[key] = _Engine(endpoint)
        return _engines[key]


_HOST_KEYS = {"url", "capacity", "name", "cert_path", "tls_verify"}
_URL_SCHEMES = ("unix://", "tcp://", "ssh://")


def docker_provider(options: Mapping[str, Any], context: ProviderContext) -> SandboxProvider:
    """The docker provider from its `sandbox_provider_options`: `network`, `builder`, and
    `hosts` (several engines: each a URL, or a mapping with `url` and optionally
    `capacity`, `name`, `cert_path`, `tls_verify`)."""
    unknown = sorted(set(options) - {"network", "builder", "hosts"})
    if unknown:
        raise ProviderOptionsError(
            "the docker provider takes the options network, builder and hosts, not: "
            + ", ".join(unknown)
        )
    builder = options.get("builder", "auto")
    if builder not in ("auto", "buildkit", "classic"):
        raise ProviderOptionsError("the docker provider's builder is auto, buildkit or classic")
    network = options.get("network")
    if network is not None and (not isinstance(network, str) or not network):
        raise ProviderOptionsError("the docker provider's network must be a network's name")
    hosts = options.get("hosts")
    if hosts is None:
        return DockerProvider(network=network, builder=builder)
    from pytest_harbor.sandboxes.fleet import DockerFleet, FleetEngine

    if not isinstance(hosts, list) or not hosts:
        raise ProviderOptionsError("the docker provider's hosts must be a list of engines")
    engines = []
    for index, host in enumerate(hosts):
        where = f"hosts[{index}]"
        if isinstance(host, str):
            host = {"url": host}
        if not isinstance(host, Mapping):
            raise ProviderOptionsError(f"{where}: expected an engine URL or a mapping with url")
        extra = sorted(set(host) - _HOST_KEYS)
        if extra:
            raise ProviderOptionsError(
                f"{where}: unknown keys {', '.join(extra)} (an engine takes "
                + ", ".join(sorted(_HOST_KEYS))
                + ")"
            )
        url = host.get("url")
        if not isinstance(url, str) or not url.startswith(_URL_SCHEMES):
            raise ProviderOptionsError(
                f"{where}.url: expected unix://PATH, tcp://HOST:PORT or ssh://USER@HOST, "
                f"got {url!r}"
            )
        if url.startswith("ssh://") and not _can_ssh():
            raise ProviderOptionsError(
                f"{where}.url: an ssh:// engine needs paramiko, which the Docker SDK imports "
                "for it: pip install 'pytest-harbor[ssh]'"
            )
        capacity = host.get("capacity")
        if capacity is not None and (
            isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1
        ):
            raise ProviderOptionsError(f"{where}.capacity: expected a whole number of at least 1")
        cert_path = host.get("cert_path")
        if cert_path is not None and not isinstance(cert_path, str):
            raise ProviderOptionsError(f"{where}.cert_path: expected a folder's path")
        tls_verify = host.get("tls_verify", True)
        if not isinstance(tls_verify, bool):
            raise ProviderOptionsError(f"{where}.tls_verify: expected true or false")
        if cert_path is not None:
            needed = ["cert.pem", "key.pem", *(["ca.pem"] if tls_verify else [])]
            missing = [name for name in needed if not (Path(cert_path) / name).is_file()]
            if missing:
                raise ProviderOptionsError(
                    f"{where}.cert_path: {cert_path} has no {', '.join(missing)} (the folder "
                    "holds the client's TLS files as Docker names them)"
                )
        endpoint = Endpoint(url, cert_path=cert_path, tls_verify=tls_verify)
        engines.append(
            FleetEngine(
                name=str(host.get("name") or url),
                provider=DockerProvider(network=network, builder=builder, endpoint=endpoint),
                capacity=capacity,
            )
        )
    urls = [engine.endpoint.url for engine in engines]
    if len(set(urls)) != len(urls):
        raise ProviderOptionsError("the docker provider's hosts name one engine twice")
    return DockerFleet(engines, context)


def _can_ssh() -> bool:
    return importlib.util.find_spec("paramiko") is not None


class DockerProvider:
    """Starts one container per sandbox: keep-alive sleep, labels, limits, forceful removal."""

    name = "docker"
    #: Plain containers on one engine: no accelerators or egress filtering; `--user`
    #: takes a group. (On the host network a phase cannot go without the network.)
    capabilities = SandboxCapabilities(user_groups=True, compose=True)

    def __init__(
        self,
        network: str | None = None,
        builder: str = "auto",
        endpoint: Endpoint | None = None,
    ) -> None:
        #: The engine (None: the one the environment names, as the docker CLI finds it).
        self.endpoint = endpoint
        #: Other engines of the same run, which an image missing here may come from.
        self.peers: list[DockerProvider] = []
        self._builder_option = builder
        self._builder: str | None = None
        #: The network sandboxes with the network are on: the engine's default bridge,
        #: another network by name, or "host" (this machine's own, loopback included;
        #: then no phase can go without it).
        self.network = network or _NETWORK
        if self.network == "host":
            self.capabilities = SandboxCapabilities(
                user_groups=True, compose=True, network_off=False
            )
        self._present: set[str] = set()
        self._tags: dict[Path, str] = {}
        self._configs: dict[str, ImageConfig] = {}
        self._tools_volume: str | None = None
        self._tools_lock = threading.Lock()

    def check_ready(self) -> None:
        """The engine answers, or SandboxStartError naming the address tried and the fix."""
        try:
            _engine(self.endpoint).api.ping()
        except SandboxStartError:
            raise
        except (docker.errors.DockerException, *_TRANSPORT_ERRORS) as error:
            raise SandboxStartError(_unreachable(self.endpoint, _explain(error))) from None

    def tools_volume(self) -> str:
        """The volume holding the trusted busybox, made once per tools image and engine
        (and kept, as a cache); every sandbox mounts it read-only at TRUSTED_TOOLS."""
        with self._tools_lock:
            if self._tools_volume is None:
                self._tools_volume = self._make_tools_volume()
            return self._tools_volume

    def _make_tools_volume(self) -> str:
        api = _engine(self.endpoint).api
        try:
            image = self._prebuilt(TOOLS_IMAGE, retries=2)
        except SandboxStartError as error:
            raise SandboxStartError(
                f"{error}; pytest-harbor runs its verification with the static busybox of "
                f"{TOOLS_IMAGE} (pull it, or make one: .ci/setup shows how)"
            ) from None
        digest = str(api.inspect_image(image)["Id"]).split(":")[-1]
        name = f"pytest-harbor-tools-{digest[:16]}"
        with self._lock(name):
            try:
                api.create_volume(name, labels={_CACHE_LABEL: "tools"})
                helper = api.create_container(
                    image,
                    command=["true"],
                    labels={_CACHE_LABEL: "tools-helper"},
                    host_config=api.create_host_config(
                        binds={name: {"bind": "/fill", "mode": "rw"}}
                    ),
                )
            except _ENGINE_ERRORS as error:
                raise SandboxStartError(
                    f"cannot make the tools volume: {_explain(error)}"
                ) from None
            try:
                try:
                    api.get_archive(helper["Id"], "/fill/busybox-sealed")
                except docker.errors.NotFound:
                    chunks, _ = api.get_archive(helper["Id"], "/bin/busybox")
                    binary = unpack_files(b"".join(chunks), strip_components=0)["busybox"]
                    api.put_archive(helper["Id"], "/fill", pack_files({"busybox": binary}, 0o755))
                    # Written last: its presence says the volume is complete.
                    api.put_archive(
                        helper["Id"], "/fill", pack_files({"busybox-sealed": binary}, 0o111)
                    )
            except _ENGINE_ERRORS as error:
                raise SandboxStartError(
                    f"cannot copy /bin/busybox of {image} into the tools volume: {_explain(error)}"
                ) from None
            finally:
                with contextlib.suppress(docker.errors.APIError):
                    api.remove_container(helper["Id"], force=True)
        return name

    def prepare_image(self, source: ImageSource) -> str:
        if source.docker_image is not None:
            return self._prebuilt(source.docker_image, source.pull_retries)
        if source.context_dir is None:
            raise SandboxStartError("the task names neither a docker_image nor a build context")
        # Hash each build context once per run, not once per trial.
        tag = self._tags.get(source.context_dir)
        if tag is None:
            tag = self._tags[source.context_dir] = image_tag_for(source.context_dir)
        if self._has_image(tag):
            return tag
        run = source.labels.get(RUN_LABEL, "")
        with self._lock(tag):
            if not self._has_image(tag) and not self._from_peer(tag):
                # A build that failed in this run is not tried again: every trial of the
                # task gets its failure (the builds ahead and the episodes share it).
                failed = _failed_build(tag, run)
                if failed is not None:
                    raise SandboxStartError(failed)
                try:
                    self._build(source, tag)
                except SandboxStartError as error:
                    _note_failed_build(tag, run, str(error))
                    raise
        return tag

    def prepare_layer(self, layer: ImageLayer) -> str:
        # One image per (base image, key): the same install on another task's image is
        # another image.
        try:
            base_id = str(_engine(self.endpoint).api.inspect_image(layer.base)["Id"])
        except _ENGINE_ERRORS as error:
            raise SandboxStartError(
                f"cannot inspect image {layer.base}: {_explain(error)}"
            ) from None
        content_hash = hashlib.sha256(f"{base_id}\n{layer.key}".encode()).hexdigest()
        tag = f"hb-layer__{content_hash[:32]}"
        with self._lock(tag):
            stale: str | None = None
            if self._has_image(tag) or self._from_peer(tag):
                if not self._stale(tag, layer):
                    return tag
                stale = str(_engine(self.endpoint).api.inspect_image(tag)["Id"])
            self._present.discard(tag)
            config = self.image_config(layer.base)
            # The base's own user comes back after the install, which runs as root.
            dockerfile = (
                f"FROM {layer.base}\nUSER root\nCOPY install.sh {_INSTALL_SCRIPT}\n"
                f"RUN /bin/sh {_INSTALL_SCRIPT} && rm -f {_INSTALL_SCRIPT}\n"
                f"USER {config.user or 'root'}\n"
            )
            with tempfile.TemporaryDirectory(prefix="harbor-layer-") as scratch:
                (Path(scratch) / "Dockerfile").write_text(dockerfile)
                (Path(scratch) / "install.sh").write_text(layer.script)
                self._run_build(
                    Path(scratch),
                    tag=tag,
                    labels={**layer.labels, _CACHE_LABEL: "layer", _LAYER_KEY: content_hash},
                    # Made again on request means the install runs again, not the
                    # builder's cached step.
                    nocache=stale is not None,
                    what=layer.what,
                    budget=layer.timeout_sec,
                    budget_name="its timeout_sec",
                )
            if not self._has_image(tag):
                raise SandboxStartError(f"{layer.what} produced no image {tag}")
            if stale is not None:
                # The one it replaces goes, unless a sandbox still runs from it.
                with contextlib.suppress(docker.errors.APIError):
                    _engine(self.endpoint).api.remove_image(stale)
        return tag

    def _stale(self, tag: str, layer: ImageLayer) -> bool:
        """With `rebuild_unless`, an image there counts only when it carries that label."""
        if layer.rebuild_unless is None:
            return False
        key, value = layer.rebuild_unless
        labels = (_engine(self.endpoint).api.inspect_image(tag).get("Config") or {}).get(
            "Labels"
        ) or {}
        return bool(labels.get(key) != value)

    def _lock(self, key: str) -> contextlib.AbstractContextManager[None]:
        """Serialises the making of one image (or volume) on this engine, across the
        processes of this machine."""
        return build_lock(key if self.endpoint is None else f"{self.endpoint.key}-{key}")

    def _from_peer(self, name: str) -> bool:
        """Copy the image `name` from another engine of the run that has it (saved there,
        loaded here, streamed); False when none has it or the copy failed."""
        for peer in self.peers:
            try:
                if not peer._has_image(name):
                    continue
                api = _engine(self.endpoint).api
                for message in api.load_image(_engine(peer.endpoint).api.get_image(name)):
                    if isinstance(message, dict) and message.get("error"):
                        raise SandboxError(str(message["error"]))
            except (SandboxError, *_ENGINE_ERRORS) as error:
                log.warning("copying image %s from another engine failed: %s", name, error)
                continue
            self._present.discard(name)
            if self._has_image(name):
                return True
        return False

    def _has_image(self, name: str) -> bool:
        if name in self._present:
            return True
        try:
            _engine(self.endpoint).api.inspect_image(name)
        except docker.errors.ImageNotFound:
            return False
        except _ENGINE_ERRORS as error:
            raise SandboxStartError(f"cannot inspect image {name}: {error}") from None
        self._present.add(name)
        return True

    def _prebuilt(self, name: str, retries: int) -> str:
        if self._has_image(name):
            return name
        if self.peers:
            with self._lock(name):
                if self._has_image(name) or self._from_peer(name):
                    return name
        for attempt in range(retries + 1):
            try:
                _engine(self.endpoint).api.pull(name)
            except _ENGINE_ERRORS as error:
                if attempt == retries:
                    raise SandboxStartError(
                        f"image {name} is not on this machine and pulling it failed "
                        f"({attempt + 1} attempt{'s' if attempt else ''}): {_explain(error)}"
                    ) from None
                time.sleep(_PULL_BACKOFF_S * 2**attempt)
            else:
                break
        self._present.add(name)
        return name

    def image_config(self, image: str) -> ImageConfig:
        if image in self._configs:
            return self._configs[image]
        try:
            config = _engine(self.endpoint).api.inspect_image(image).get("Config") or {}
        except _ENGINE_ERRORS as error:
            raise SandboxStartError(f"cannot inspect image {image}: {_explain(error)}") from None
        self._configs[image] = ImageConfig(
            entrypoint=tuple(config.get("Entrypoint") or ()),
            cmd=tuple(config.get("Cmd") or ()),
            workdir=config.get("WorkingDir") or "",
            user=config.get("User") or "",
        )
        return self._configs[image]

    def _build(self, source: ImageSource, tag: str) -> None:
        assert source.context_dir is not None
        dockerfile = source.context_dir / "Dockerfile"
        self._run_build(
            source.context_dir,
            tag=tag,
            labels=dict(source.labels),
            what=f"building {dockerfile}",
            budget=source.build_timeout_sec,
            budget_name="[environment].build_timeout_sec",
        )
        if not self._has_image(tag):
            raise SandboxStartError(f"building {dockerfile} produced no image {tag}")

    @property
    def builder(self) -> str:
        """`buildkit` (through the buildx CLI plugin, when it answers) or `classic` (the
        engine's API); the provider option `builder` may name one."""
        if self._builder is None:
            if self._builder_option != "auto":
                self._builder = self._builder_option
            else:
                try:
                    found = subprocess.run(
                        ["docker", "buildx", "version"],
                        capture_output=True,
                        timeout=30,
                        check=False,
                        stdin=subprocess.DEVNULL,
                    )
                    self._builder = "buildkit" if found.returncode == 0 else "classic"
                except (OSError, subprocess.TimeoutExpired):
                    self._builder = "classic"
        return self._builder

    def _run_build(
        self,
        context: Path,
        *,
        tag: str,
        labels: Mapping[str, str],
        what: str,
        budget: float,
        budget_name: str,
        nocache: bool = False,
    ) -> None:
        if self.builder == "buildkit":
            _buildkit(
                context,
                tag=tag,
                labels=labels,
                nocache=nocache,
                what=what,
                budget=budget,
                budget_name=budget_name,
                endpoint=self.endpoint,
            )
            return
        build = _Build(
            _engine(self.endpoint).api,
            path=str(context),
            tag=tag,
            rm=True,
            forcerm=True,
            labels=dict(labels),
            nocache=nocache,
            decode=True,
        )
        thread = threading.Thread(target=build.run, name="harbor-build", daemon=True)
        thread.start()
        if not _join(thread, budget):
            # The build stream cannot be cut from here; killing the step's container
            # makes the engine end the build.
            build.stop()
            _join(thread, _KILL_GRACE_S)
            build.remove_steps()
            raise SandboxStartError(
                f"{what} took longer than {budget_name} = {budget:g} s\n{_tail(build.log)}"
            )
        if build.error is not None:
            build.remove_steps()
            raise SandboxStartError(f"{what} failed: {build.error}\n{_tail(build.log)}")

    def start(self, spec: SandboxSpec) -> DockerSandbox:
        if spec.ready_timeout_s is None:
            return self._start(spec)
        attempt = _StartAttempt(self, spec)
        thread = threading.Thread(target=attempt.run, name="harbor-start", daemon=True)
        thread.start()
        if not _join(thread, spec.ready_timeout_s):
            attempt.abandon()
            raise SandboxStartError(
                f"the sandbox from {spec.image} did not start within "
                f"sandbox_ready_timeout_s = {spec.ready_timeout_s:g} s"
            )
        return attempt.result()

    def _start(self, spec: SandboxSpec) -> DockerSandbox:
        if spec.group is not None:
            return self._start_group(spec, spec.group)
        engine = _engine(self.endpoint)
        api = engine.api
        limits: dict[str, Any] = {}
        if spec.cpus is not None:
            # A task may ask for more CPUs than this engine has; it gets them all.
            limits["nano_cpus"] = int(min(spec.cpus, engine.cpus) * 1e9)
        if spec.memory_mb is not None:
            limits["mem_limit"] = limits["memswap_limit"] = f"{spec.memory_mb}m"
        # The keep-alive is the sandbox's lifetime: a leaked one ends by itself, and the
        # reaper removes it. It is not removed by the engine as it ends: a sandbox that
        # stopped must still be there to say why (status()).
        lifetime = _FOREVER_S if spec.ttl_s is None else max(1, math.ceil(spec.ttl_s))
        try:
            host_config = api.create_host_config(
                network_mode=self.network if spec.network else "none",
                binds={self.tools_volume(): {"bind": TRUSTED_TOOLS, "mode": "ro"}},
                pids_limit=spec.pids_limit,
                **limits,
            )
            created = api.create_container(
                spec.image,
                entrypoint=_KEEPALIVE_ENTRYPOINT,
                command=[str(lifetime)],
                user=KEEPALIVE_USER,
                labels=dict(spec.labels),
                environment=[f"{key}={value}" for key, value in spec.env.items()],
                working_dir=spec.workdir,
                host_config=host_config,
                detach=True,
            )
        except _ENGINE_ERRORS as error:
            raise SandboxStartError(
                f"cannot create a sandbox from {spec.image}: {_explain(error)}"
            ) from None
        sandbox = DockerSandbox(
            created["Id"],
            online=spec.network,
            network=self.network,
            endpoint=self.endpoint,
            user=self.image_config(spec.image).user,
        )
        try:
            if spec.directories:
                # Before start, so no exec is needed to make them.
                api.put_archive(created["Id"], "/", pack_directories(spec.directories))
            api.start(created["Id"])
        except _ENGINE_ERRORS as error:
            sandbox.stop()
            raise SandboxStartError(
                f"the sandbox from {spec.image} did not start: {_explain(error)}"
            ) from None
        return sandbox

    def _start_group(self, spec: SandboxSpec, group: SandboxGroup) -> DockerSandbox:
        """The Compose project `group`, `main` kept alive like any sandbox (the trusted
        sleep as its first process, the trusted tools mounted), its other services first,
        as their depends_on conditions and health checks say (`up --wait`)."""
        engine = _engine(self.endpoint)
        lifetime = _FOREVER_S if spec.ttl_s is None else max(1, math.ceil(spec.ttl_s))
        tools = self.tools_volume()
        main: dict[str, Any] = {
            # Compose reads `$` as its own variables': `$$` is a `$` for the shell.
            "entrypoint": [part.replace("$", "$$") for part in _KEEPALIVE_ENTRYPOINT],
            "command": [str(lifetime)],
            "user": KEEPALIVE_USER,
            "environment": dict(spec.env),
            "volumes": [
                {"type": "volume", "source": tools, "target": TRUSTED_TOOLS, "read_only": True}
            ],
        }
        if spec.workdir:
            main["working_dir"] = spec.workdir
        if spec.cpus is not None:
            main["cpus"] = min(spec.cpus, engine.cpus)
        if spec.memory_mb is not None:
            main["mem_limit"] = main["memswap_limit"] = f"{spec.memory_mb}m"
        if spec.pids_limit is not None:
            main["pids_limit"] = spec.pids_limit
        name = project_name(group.episode, uuid.uuid4().hex[:8])
        config = episode_project(
            group.config,
            name=name,
            main_image=spec.image,
            built=group.built,
            labels=spec.labels,
            main=main,
            internal=not spec.network,
        )
        config.setdefault("volumes", {})[tools] = {"external": True, "name": tools}
        with tempfile.TemporaryDirectory(prefix="harbor-compose-") as scratch:
            file = Path(scratch) / "compose.json"
            file.write_text(json.dumps(config))
            up = _compose(
                ["-p", name, "-f", str(file), "--project-directory", scratch, "up", "-d", "--wait"],
                timeout=spec.ready_timeout_s or _COMPOSE_UP_S,
                endpoint=self.endpoint,
            )
            if up.returncode != 0:
                logs = _compose(
                    [
                        "-p",
                        name,
                        "-f",
                        str(file),
                        "--project-directory",
                        scratch,
                        "logs",
                        "--no-color",
                        "--tail",
                        "20",
                    ],
                    timeout=60,
                    endpoint=self.endpoint,
                )
                _remove_project(name, self.endpoint)
                raise SandboxStartError(
                    f"the Compose project did not come up: {_tail(up.stderr.splitlines(), 8)}"
                    f"\n{_tail(logs.stdout.splitlines(), 40)}"
                )
        found = engine.api.containers(
            filters={"label": [f"{_PROJECT_LABEL}={name}", f"{_SERVICE_LABEL}=main"]}
        )
        if not found:
            _remove_project(name, self.endpoint)
            raise SandboxStartError(f"the Compose project {name} came up without its main")
        sandbox = ComposeSandbox(
            found[0]["Id"],
            name,
            online=spec.network,
            endpoint=self.endpoint,
            user=self.image_config(spec.image).user,
        )
        try:
            if spec.directories:
                engine.api.put_archive(found[0]["Id"], "/", pack_directories(spec.directories))
        except _ENGINE_ERRORS as error:
            sandbox.stop()
            raise SandboxStartError(
                f"cannot make the sandbox's folders: {_explain(error)}"
            ) from None
        return sandbox

    def labelled(self, key: str) -> list[tuple[str, dict[str, str]]]:
        found = _engine(self.endpoint).api.containers(all=True, filters={"label": key})
        return [(container["Id"], dict(container.get("Labels") or {})) for container in found]

    def remove(self, sandbox_id: str) -> None:
        DockerSandbox(sandbox_id, endpoint=self.endpoint).stop()

    def labelled_leftovers(self, key: str) -> list[tuple[str, dict[str, str]]]:
        """Networks and volumes (of Compose projects) with a label `key`: a reference for
        remove_leftover() and their labels. Networks first: a volume may outlive them."""
        api = _engine(self.endpoint).api
        found: list[tuple[str, dict[str, str]]] = []
        try:
            for network in api.networks(filters={"label": key}):
                found.append((f"network:{network['Id']}", dict(network.get("Labels") or {})))
            for volume in (api.volumes(filters={"label": key}) or {}).get("Volumes") or []:
                found.append((f"volume:{volume['Name']}", dict(volume.get("Labels") or {})))
        except _ENGINE_ERRORS as error:
            log.warning("cannot list networks and volumes: %s", _explain(error))
        return found

    def remove_leftover(self, reference: str) -> None:
        """Remove a network or volume labelled_leftovers() gave; in use or gone: no error."""
        kind, _, name = reference.partition(":")
        api = _engine(self.endpoint).api
        with contextlib.suppress(docker.errors.APIError):
            if kind == "network":
                api.remove_network(name)
            else:
                api.remove_volume(name, force=True)

    def remove_image(self, image: str) -> None:
        try:
            _engine(self.endpoint).api.remove_image(image, force=True)
        except docker.errors.NotFound:
            pass
        except _ENGINE_ERRORS as error:
            raise SandboxError(f"cannot remove image {image[:19]}: {_explain(error)}") from None

    def remove_labelled(self, labels: Mapping[str, str]) -> int:
        api = _engine(self.endpoint).api
        wanted = [f"{key}={value}" for key, value in labels.items()]
        removed = 0
        for container in api.containers(all=True, filters={"label": wanted}):
            DockerSandbox(container["Id"], endpoint=self.endpoint).stop()
            removed += 1
        # What Compose projects made beside their containers.
        _remove_networks_and_volumes({"label": wanted}, self.endpoint)
        return removed


class DockerSandbox:
    """One container; every call goes through the Docker engine API.

    `user` is who a command runs as when it names no one: the image's user (root when
    the image names none). None: the container's own user (a Compose sidecar's); a
    sandbox the provider started runs its keep-alive as KEEPALIVE_USER, never a command.
    """

    def __init__(
        self,
        container_id: str,
        online: bool = True,
        network: str = _NETWORK,
        endpoint: Endpoint | None = None,
        user: str | None = None,
    ) -> None:
        self._id = container_id
        self._endpoint = endpoint
        self._stopped = False
        self._online = online
        self._network = network
        self._user = None if user is None else (user or "0")

    @property
    def id(self) -> str:
        return self._id

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
        engine = _engine(self._endpoint)
        argv = list(command)
        if stdin is not None and engine.tunnelled:
            # Over TLS or ssh the input cannot be ended by closing half of the connection:
            # the command gets exactly its bytes, then the end of its input, from `head`.
            argv = [
                TRUSTED_BUSYBOX,
                "sh",
                "-c",
                f'{TRUSTED_BUSYBOX} head -c {len(stdin)} | "$@"',
                "sh",
                *argv,
            ]
        if timeout is not None:
            argv = [TRUSTED_BUSYBOX, "sh", "-c", _PID_WRAPPER, "sh", *argv]
        try:
            exec_id = engine.api.exec_create(
                self._id,
                argv,
                stdout=True,
                stderr=True,
                stdin=stdin is not None,
                user=user or self._user or "",
                workdir=workdir,
                environment=[f"{key}={value}" for key, value in (env or {}).items()],
            )["Id"]
            connection = _Connection(engine.api.exec_start(exec_id, socket=True))
        except _ENGINE_ERRORS as error:
            raise SandboxError(f"sandbox {self._id[:12]}: exec failed: {_explain(error)}") from None
        reader = _OutputReader(connection, reads_pid=timeout is not None)
        threads = [threading.Thread(target=reader.run, name="harbor-exec-out", daemon=True)]
        if stdin is not None:
            threads.append(
                threading.Thread(
                    target=connection.send_all, args=(stdin,), name="harbor-exec-in", daemon=True
                )
            )
        for thread in threads:
            thread.start()
        timed_out = not _join(threads[0], timeout)
        if timed_out:
            self._kill_group(reader.wait_for_pid(_KILL_GRACE_S))
            if not _join(threads[0], _KILL_GRACE_S):
                connection.close()
                _join(threads[0], 1.0)
        connection.close()
        try:
            info = engine.api.exec_inspect(exec_id)
        except _ENGINE_ERRORS as error:
            raise SandboxError(f"sandbox {self._id[:12]}: exec lost: {_explain(error)}") from None
        exit_code = info.get("ExitCode")
        if reader.broken is not None and not timed_out:
            raise SandboxError(
                f"sandbox {self._id[:12]}: the output of {argv[0]} was lost ({reader.broken})"
            )
        return ExecResult(
            exit_code=-1 if exit_code is None or info.get("Running") else int(exit_code),
            stdout_bytes=reader.out.value(),
            stderr_bytes=reader.stderr(),
            timed_out=timed_out,
        )

    def spawn(
        self, command: Sequence[str], *, user: str | None = None, workdir: str | None = None
    ) -> _Spawned:
        engine = _engine(self._endpoint)
        try:
            exec_id = engine.api.exec_create(
                self._id,
                list(command),
                stdout=True,
                stderr=True,
                user=user or self._user or "",
                workdir=workdir,
            )["Id"]
            connection = _Connection(engine.api.exec_start(exec_id, socket=True))
        except _ENGINE_ERRORS as error:
            raise SandboxError(f"sandbox {self._id[:12]}: exec failed: {_explain(error)}") from None
        return _Spawned(exec_id, connection, engine.api)

    def _kill_group(self, pid: int | None) -> None:
        if pid is None:
            return
        # Negative pid: the whole process group the command leads.
        script = f"kill -9 -{pid} 2>/dev/null; kill -9 {pid} 2>/dev/null; true"
        with contextlib.suppress(SandboxError):
            self.exec([TRUSTED_BUSYBOX, "sh", "-c", script], user=ROOT_USER)

    def upload(self, source: Path | Mapping[str, bytes], target: str) -> None:
        data = pack_folder(source) if isinstance(source, Path) else pack_files(source)
        try:
            _engine(self._endpoint).api.put_archive(self._id, target, data)
        except _ENGINE_ERRORS as error:
            raise SandboxError(
                f"sandbox {self._id[:12]}: upload to {target} failed: {_explain(error)}"
            ) from None

    def _path_missing(self, error: docker.errors.NotFound) -> None:
        """A path that is not there is an answer; a sandbox that is not there (removed
        under the run) is not, and must not read as a verifier that wrote nothing."""
        if "no such container" in _explain(error).lower():
            raise SandboxError(f"sandbox {self._id[:12]} is gone: {_explain(error)}") from None

    def read_archive(self, source: str) -> bytes | None:
        try:
            chunks, _ = _engine(self._endpoint).api.get_archive(self._id, source)
            return b"".join(chunks)
        except docker.errors.NotFound as error:
            self._path_missing(error)
            return None
        except _ENGINE_ERRORS as error:
            raise SandboxError(
                f"sandbox {self._id[:12]}: reading {source} failed: {_explain(error)}"
            ) from None

    def write_archive(self, data: bytes | Iterable[bytes], into: str) -> None:
        try:
            _engine(self._endpoint).api.put_archive(self._id, into, data)
        except _ENGINE_ERRORS as error:
            raise SandboxError(
                f"sandbox {self._id[:12]}: writing into {into} failed: {_explain(error)}"
            ) from None

    def download(self, source: str) -> dict[str, bytes]:
        try:
            chunks, stat = _engine(self._endpoint).api.get_archive(self._id, source)
            data = b"".join(chunks)
        except docker.errors.NotFound as error:
            self._path_missing(error)
            return {}
        except _ENGINE_ERRORS as error:
            raise SandboxError(
                f"sandbox {self._id[:12]}: download of {source} failed: {_explain(error)}"
            ) from None
        # A folder comes back as `folder/...`: drop that first part. A file as itself.
        is_folder = bool(stat.get("mode", 0) & _GO_MODE_DIR)
        return unpack_files(data, strip_components=1 if is_folder else 0)

    def iter_archive(self, source: str) -> Iterator[bytes] | None:
        try:
            chunks, _ = _engine(self._endpoint).api.get_archive(self._id, source)
        except docker.errors.NotFound as error:
            self._path_missing(error)
            return None
        except _ENGINE_ERRORS as error:
            raise SandboxError(
                f"sandbox {self._id[:12]}: reading {source} failed: {_explain(error)}"
            ) from None
        return _guarded(chunks, f"sandbox {self._id[:12]}: reading {source} failed")

    def set_network(self, enabled: bool) -> None:
        if enabled == self._online:
            return
        if self._network == "host":
            raise SandboxError(
                f"sandbox {self._id[:12]} is on the host network, which cannot be "
                "taken away or given back"
            )
        api = _engine(self._endpoint).api
        try:
            if enabled:
                api.connect_container_to_network(self._id, self._network)
            else:
                api.disconnect_container_from_network(self._id, self._network, force=True)
        except _ENGINE_ERRORS as error:
            raise SandboxError(
                f"sandbox {self._id[:12]}: cannot {'connect' if enabled else 'disconnect'} "
                f"its network: {_explain(error)}"
            ) from None
        self._online = enabled

    def snapshot(self, labels: Mapping[str, str]) -> str:
        try:
            made = _engine(self._endpoint).api.commit(
                self._id,
                repository="pytest-harbor-snapshot",
                tag=uuid.uuid4().hex[:12],
                # The container runs its keep-alive as KEEPALIVE_USER; the snapshot runs
                # as the image did.
                conf={"Labels": dict(labels), "User": self._user or ""},
            )
        except _ENGINE_ERRORS as error:
            raise SandboxError(
                f"sandbox {self._id[:12]}: snapshot failed: {_explain(error)}"
            ) from None
        return str(made["Id"])

    def status(self) -> SandboxStatus:
        api = _engine(self._endpoint).api
        try:
            state = api.inspect_container(self._id).get("State") or {}
        except docker.errors.NotFound:
            return SandboxStatus(present=False)
        except _ENGINE_ERRORS as error:
            raise SandboxError(
                f"sandbox {self._id[:12]}: the engine does not say how it is: {_explain(error)}"
            ) from None
        running = bool(state.get("Running"))
        return SandboxStatus(
            present=True,
            running=running,
            out_of_memory=bool(state.get("OOMKilled")),
            out_of_processes=running and self._at_pids_cap(),
            exit_code=None if running else _int_or_none(state.get("ExitCode")),
        )

    def _at_pids_cap(self) -> bool:
        """Whether the sandbox holds as many processes as its cap allows (or nearly)."""
        try:
            stats = _engine(self._endpoint).api.stats(self._id, stream=False, one_shot=True)
        except (docker.errors.DockerException, *_TRANSPORT_ERRORS, TypeError):
            return False
        pids = stats.get("pids_stats") or {}
        current, limit = pids.get("current"), pids.get("limit")
        if not isinstance(current, int) or not isinstance(limit, int) or limit <= 0:
            return False
        return current >= limit - 2

    def stop(self) -> None:
        if self._stopped:
            return
        try:
            _engine(self._endpoint).api.remove_container(self._id, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except _ENGINE_ERRORS as error:
            if "already in progress" not in str(error):
                raise SandboxError(
                    f"sandbox {self._id[:12]}: removal failed: {_explain(error)}"
                ) from None
        self._stopped = True


class ComposeSandbox(DockerSandbox):
    """The `main` service of a Compose project; stopping it removes the whole project
    (every container, network and volume it made), forcefully."""

    def __init__(
        self,
        container_id: str,
        project: str,
        online: bool = True,
        endpoint: Endpoint | None = None,
        user: str | None = None,
    ) -> None:
        super().__init__(
            container_id,
            online=online,
            network=f"{project}_default",
            endpoint=endpoint,
            user=user,
        )
        self.project = project

    def set_network(self, enabled: bool) -> None:
        if enabled != self._online:
            raise SandboxError(
                "a Compose project keeps one network for all its phases (its services "
                "must reach each other)"
            )

    def service(self, name: str) -> DockerSandbox:
        """Another service's container, to run a command in or copy from."""
        found = _engine(self._endpoint).api.containers(
            filters={"label": [f"{_PROJECT_LABEL}={self.project}", f"{_SERVICE_LABEL}={name}"]}
        )
        if not found:
            raise SandboxError(f"the Compose project has no running service {name!r}")
        return DockerSandbox(
            found[0]["Id"], online=self._online, network=self._network, endpoint=self._endpoint
        )

    def stop(self) -> None:
        if self._stopped:
            return
        _remove_project(self.project, self._endpoint)
        self._stopped = True


def _buildkit(
    context: Path,
    *,
    tag: str,
    labels: Mapping[str, str],
    nocache: bool,
    what: str,
    budget: float,
    budget_name: str,
    endpoint: Endpoint | None = None,
) -> None:
    """A BuildKit build through the buildx CLI plugin (its default builder is the
    engine's own, so the image lands in the engine). A build past `budget` is stopped: its
    client goes, and BuildKit cancels what it was doing."""
    command = ["docker", "buildx", "build", "--progress=plain", "-t", tag]
    for key, value in labels.items():
        command += ["--label", f"{key}={value}"]
    if nocache:
        command.append("--no-cache")
    command.append(str(context))
    try:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            start_new_session=True,
            env=endpoint.cli_env() if endpoint else None,
        )
    except OSError as error:
        raise SandboxStartError(f"{what}: cannot run docker buildx: {error}") from None
    try:
        output, _ = process.communicate(timeout=budget)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        raise SandboxStartError(
            f"{what} took longer than {budget_name} = {budget:g} s\n{_tail(output.splitlines())}"
        ) from None
    if process.returncode != 0:
        raise SandboxStartError(f"{what} failed:\n{_tail(output.splitlines())}")


def _failure_file(tag: str) -> Path:
    return Path(tempfile.gettempdir()) / f"pytest-harbor-build-{tag}.failed"


def _failed_build(tag: str, run: str) -> str | None:
    """The error of a build of `tag` that failed earlier in the run `run`, if one did."""
    if not run:
        return None
    try:
        noted = json.loads(_failure_file(tag).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(noted, dict) or noted.get("run") != run:
        return None
    return str(noted.get("error"))


def _note_failed_build(tag: str, run: str, error: str) -> None:
    if run:
        with contextlib.suppress(OSError):
            _failure_file(tag).write_text(json.dumps({"run": run, "error": error}))


def _compose(
    arguments: list[str], *, timeout: float, endpoint: Endpoint | None = None
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            ["docker", "compose", *arguments],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
            env=endpoint.cli_env() if endpoint else None,
        )
    except FileNotFoundError:
        raise SandboxStartError("the docker CLI is not installed (Compose tasks need it)") from None
    except subprocess.TimeoutExpired as expired:
        return subprocess.CompletedProcess(
            expired.cmd, 124, "", f"docker compose {arguments[-1]} took over {timeout:g} s"
        )


def _remove_project(project: str, endpoint: Endpoint | None = None) -> None:
    """Every container of the project at once (forced, no graceful stop), then its
    networks and volumes."""
    api = _engine(endpoint).api
    selector = {"label": f"{_PROJECT_LABEL}={project}"}
    try:
        containers = api.containers(all=True, filters=selector)
    except _ENGINE_ERRORS as error:
        raise SandboxError(f"cannot list the project {project}: {_explain(error)}") from None
    threads = [
        threading.Thread(target=DockerSandbox(c["Id"], endpoint=endpoint).stop, daemon=True)
        for c in containers
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        join(thread, _CONTROL_TIMEOUT_S)
    _remove_networks_and_volumes(selector, endpoint)


def _remove_networks_and_volumes(
    filters: Mapping[str, Any], endpoint: Endpoint | None = None
) -> None:
    api = _engine(endpoint).api
    with contextlib.suppress(docker.errors.APIError):
        for network in api.networks(filters=filters):
            with contextlib.suppress(docker.errors.APIError):
                api.remove_network(network["Id"])
    with contextlib.suppress(docker.errors.APIError):
        for volume in (api.volumes(filters=filters) or {}).get("Volumes") or []:
            with contextlib.suppress(docker.errors.APIError):
                api.remove_volume(volume["Name"], force=True)


class _Spawned:
    """A running exec, drained in a thread of its own; its exit code comes from the engine
    when its output ends."""

    _TAIL_BYTES = 4096

    def __init__(self, exec_id: str, connection: _Connection, api: docker.APIClient) -> None:
        self._exec_id = exec_id
        self._api = api
        self._connection = connection
        self._tail = bytearray()
        self._code: int | None = None
        self._thread = threading.Thread(target=self._watch, name="harbor-spawned", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        try:
            for _, data in self._connection.frames():
                self._tail += data
                del self._tail[: -self._TAIL_BYTES]
        except (OSError, ValueError):
            pass
        finally:
            self._connection.close()
        try:
            info = self._api.exec_inspect(self._exec_id)
        except (docker.errors.APIError, *_TRANSPORT_ERRORS):
            return  # the sandbox went away: nothing to tell
        if not info.get("Running") and info.get("ExitCode") is not None:
            self._code = int(info["ExitCode"])

    def exit_code(self) -> int | None:
        return self._code

    def output_tail(self) -> str:
        return bytes(self._tail).decode("utf-8", errors="replace")


class _StartAttempt:
    """A start that may be given up on: a sandbox it makes after that is removed."""

    def __init__(self, provider: DockerProvider, spec: SandboxSpec) -> None:
        self._provider = provider
        self._spec = spec
        self._lock = threading.Lock()
        self._sandbox: DockerSandbox | None = None
        self._error: SandboxStartError | None = None
        self._abandoned = False

    def run(self) -> None:
        try:
            sandbox = self._provider._start(self._spec)
        except SandboxStartError as error:
            self._error = error
            return
        except (SandboxError, *_ENGINE_ERRORS) as error:
            # The engine went away while the sandbox started (or could not be removed).
            self._error = SandboxStartError(f"the sandbox did not start: {_explain(error)}")
            return
        with self._lock:
            self._sandbox = sandbox
            abandoned = self._abandoned
        if abandoned:
            with contextlib.suppress(SandboxError):
                sandbox.stop()

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True
            sandbox = self._sandbox
        if sandbox is not None:
            with contextlib.suppress(SandboxError):
                sandbox.stop()

    def result(self) -> DockerSandbox:
        if self._error is not None:
            raise self._error
        assert self._sandbox is not None
        return self._sandbox


class _Build:
    """One image build, followed event by event (run() in a thread of its own)."""

    _STEP_CONTAINER = re.compile(r"Running in ([0-9a-f]{12,64})")
    _STEP_IMAGE = re.compile(r"^---> ([0-9a-f]{12,64})$")

    def __init__(self, api: docker.APIClient, **arguments: Any) -> None:
        self._api = api
        self._arguments = arguments
        self.log: list[str] = []
        self.error: str | None = None
        self._step_container: str | None = None

    def run(self) -> None:
        try:
            for event in self._api.build(**self._arguments):
                text = str(event.get("stream", ""))
                self.log.extend(text.splitlines())
                running = self._STEP_CONTAINER.search(text)
                if running:
                    self._step_container = running.group(1)
                if "error" in event:
                    self.error = str(event["error"]).strip()
        except _ENGINE_ERRORS as error:
            self.error = _explain(error)
        except _TRANSPORT_ERRORS as error:
            self.error = str(error)

    def remove_steps(self) -> None:
        """After a failed build: the untagged images its finished steps left (kept by the
        builder as a cache) go, latest first; tagged ones and those still used stay."""
        steps = [m.group(1) for line in self.log if (m := self._STEP_IMAGE.match(line.strip()))]
        for image in reversed(steps):
            with contextlib.suppress(docker.errors.APIError):
                if not self._api.inspect_image(image).get("RepoTags"):
                    self._api.remove_image(image)

    def stop(self) -> None:
        if self._step_container is not None:
            with contextlib.suppress(docker.errors.APIError):
                self._api.kill(self._step_container)


def _join(thread: threading.Thread, timeout: float | None) -> bool:
    """Wait for `thread`; True when it ended in time."""
    return join(thread, timeout)


class _Connection:
    """The hijacked exec connection: frames out, stdin in, closable from any thread."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        # SocketIO wraps the socket for unix connections; TLS connections are plain.
        self._raw: socket.socket = getattr(sock, "_sock", sock)
        self._raw.settimeout(None)
        #: Not a plain socket (TLS, or an ssh client's pipes): read without polling the
        #: file descriptor (TLS may hold decrypted bytes the descriptor does not show;
        #: the ssh connection's descriptor is not where its bytes come from), and never
        #: half-closed (neither can close one direction and go on reading the other).
        self.tunnelled = isinstance(self._raw, ssl.SSLSocket) or type(
            self._raw
        ).__module__.endswith(".sshconn")

    def frames(self) -> Iterator[tuple[int, bytes]]:
        if not self.tunnelled:
            yield from frames_iter(self.sock, tty=False)
            return
        while True:
            header = _receive(self._raw, _FRAME_HEADER.size)
            if header is None:
                return
            stream, size = _FRAME_HEADER.unpack(header)
            data = _receive(self._raw, size) if size else b""
            if data is None:
                raise ValueError("the output stream ended inside a frame")
            if data:
                yield stream, data

    def send_all(self, data: bytes) -> None:
        try:
            self._raw.sendall(data)
            if not self.tunnelled:
                self._raw.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the command ended without reading all of its input

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._raw.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._raw.close()


#: The header of each frame of an exec's output: stream, three zero bytes, length.
_FRAME_HEADER = struct.Struct(">BxxxL")


def _receive(sock: socket.socket, size: int) -> bytes | None:
    """Exactly `size` bytes, or None when the stream ended before the first of them."""
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            if chunks:
                raise ValueError("the output stream ended inside a frame")
            return None
        chunks += chunk
    return bytes(chunks)


class _OutputReader:
    """Drains an exec connection; learns the command's pid from the first stderr line."""

    def __init__(self, connection: _Connection, reads_pid: bool) -> None:
        self._connection = connection
        self.out = CappedOutput()
        self._err = CappedOutput()
        self._pid: int | None = None
        self._pid_known = threading.Event()
        self._reads_pid = reads_pid
        #: Why the output stream broke off, when it did for a reason other than a close.
        self.broken: str | None = None
        if not reads_pid:
            self._pid_known.set()

    def run(self) -> None:
        try:
            for stream, data in self._connection.frames():
                if stream == _STDOUT:
                    self.out.append(data)
                elif stream == _STDERR:
                    self._err.append(data)
                    if not self._pid_known.is_set():
                        self._take_pid()
        except (OSError, ValueError):
            pass  # closed under us after a deadline; what was read is kept
        except Exception as error:  # a torn frame: the output cannot be trusted whole
            self.broken = f"{type(error).__name__}: {error}"
        finally:
            self._pid_known.set()

    def _take_pid(self) -> None:
        line, newline, _ = bytes(self._err.head).partition(b"\n")
        if not newline:
            return
        self._pid = int(line) if line.strip().isdigit() else None
        self._err.drop_prefix(len(line) + 1)
        self._pid_known.set()

    def wait_for_pid(self, timeout: float) -> int | None:
        self._pid_known.wait(timeout)
        return self._pid

    def stderr(self) -> bytes:
        if self._reads_pid and self._pid is None:
            self._take_pid()
        return self._err.value()


def _guarded(chunks: Iterator[bytes], what: str) -> Iterator[bytes]:
    """The chunks, a dropped connection turned into a SandboxError."""
    try:
        yield from chunks
    except _TRANSPORT_ERRORS as error:
        raise SandboxError(f"{what}: {error}") from None


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _explain(error: BaseException) -> str:
    explanation = getattr(error, "explanation", None)
    return str(explanation or error).strip()


def _tail(lines: list[str], count: int = 20) -> str:
    return "\n".join(lines[-count:])
