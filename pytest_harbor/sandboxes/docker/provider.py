"""The `docker` sandbox provider on one engine: containers kept alive by a first process
nothing inside can end, labels, limits, forceful removal."""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import docker
import docker.errors
import docker.tls

from pytest_harbor.display import harbor_logger
from pytest_harbor.sandboxes.archives import pack_directories
from pytest_harbor.sandboxes.base import (
    TRUSTED_TOOLS,
    ImageConfig,
    ImageLayer,
    ImageSource,
    Opening,
    SandboxCapabilities,
    SandboxError,
    SandboxGroup,
    SandboxSpec,
    SandboxStartError,
)
from pytest_harbor.sandboxes.docker.engine import (
    ENGINE_ERRORS,
    TRANSPORT_ERRORS,
    Endpoint,
    describe_endpoint,
    engine_for,
    explain,
    unreachable,
)
from pytest_harbor.sandboxes.docker.filtering import Egress, start_egress
from pytest_harbor.sandboxes.docker.first_process import FIRST_USER, read_first_report
from pytest_harbor.sandboxes.docker.images import EngineImages
from pytest_harbor.sandboxes.docker.limits import GPU_RUNTIME, Limits, keep_alive
from pytest_harbor.sandboxes.docker.networks import IsolatedNetwork
from pytest_harbor.sandboxes.docker.projects import remove_networks_and_volumes, start_project
from pytest_harbor.sandboxes.docker.sandbox import DEFAULT_NETWORK, ComposeSandbox, DockerSandbox
from pytest_harbor.sandboxes.docker.watchdog import Watchdog, engine_socket
from pytest_harbor.threads import join

log = harbor_logger()


class DockerProvider:
    """Starts one container per sandbox: keep-alive sleep, labels, limits, forceful removal."""

    name = "docker"
    #: Containers on one engine: GPUs when the engine has a GPU runtime (gpu_problem()),
    #: no TPUs or egress filtering; `--user` takes a group. (On the host network a phase
    #: cannot go without the network.)
    capabilities = SandboxCapabilities(
        user_groups=True, compose=True, gpus=True, network_allowlists=True, model_relay=True
    )

    def __init__(
        self,
        network: str | None = None,
        builder: str = "auto",
        endpoint: Endpoint | None = None,
        engine_socket: str | None = None,
    ) -> None:
        #: The engine (None: the one the environment names, as the docker CLI finds it).
        self.endpoint = endpoint
        #: The engine's socket on its own machine, for the watchdog (None: found from
        #: the endpoint; watchdog.engine_socket).
        self.engine_socket = engine_socket
        self._peers: list[DockerProvider] = []
        #: The network sandboxes with the network are on: the engine's default bridge,
        #: another network by name, or "host" (this machine's own, loopback included;
        #: then no phase can go without it).
        self.network = network or DEFAULT_NETWORK
        if self.network == "host":
            self.capabilities = SandboxCapabilities(
                user_groups=True, compose=True, gpus=True, network_off=False, model_relay=True
            )
        #: Its images: made, pulled or copied from a peer once each.
        self.images = EngineImages(endpoint, builder)
        #: Where sandboxes go in place of the engine's default bridge.
        self._isolated = IsolatedNetwork(endpoint)
        self._gpu_problem: tuple[str | None] | None = None
        self._watchdog: Watchdog | None = None
        #: What the border lets this process's sandboxes reach beyond the internet.
        self._openings: tuple[Opening, ...] = ()
        self.images.guard = self._guarded_network

    def gpu_problem(self) -> str | None:
        """None when the engine has a GPU runtime (`nvidia` among the runtimes it lists),
        else why not, naming the engine; asked once."""
        if self._gpu_problem is None:
            where = describe_endpoint(self.endpoint)
            try:
                runtimes = sorted(engine_for(self.endpoint).api.info().get("Runtimes") or {})
            except ENGINE_ERRORS as error:
                return f"cannot ask the Docker engine at {where} for its runtimes: {explain(error)}"
            self._gpu_problem = (
                None
                if GPU_RUNTIME in runtimes
                else f"the Docker engine at {where} has no GPU runtime (it lists "
                f"{', '.join(runtimes) or 'none'}; GPUs need the NVIDIA Container Toolkit's "
                f"{GPU_RUNTIME!r})",
            )
        return self._gpu_problem[0]

    def _network_of(self, spec: SandboxSpec) -> str:
        """The network a sandbox with network access joins: the one the provider option
        names, else the engine's isolated one (the engine's default bridge lets every
        container reach every other, so one episode could reach another's services), once
        the border holds there."""
        if self.network != DEFAULT_NETWORK:
            return self.network
        return self._guarded_network()

    def open_to(self, openings: Sequence[Opening]) -> None:
        """From now on the border also opens `openings` to this process's sandboxes (a
        watchdog already holding the border is replaced by one holding these); raises
        SandboxError when that cannot be done."""
        self._openings = tuple(openings)
        if self._watchdog is not None:
            self._watchdog.reopen(self._openings)

    def watch(self, labels: Mapping[str, str]) -> None:
        self._keeper().arm(labels)

    def _keeper(self) -> Watchdog:
        """This process's watchdog on the engine, which also holds the border."""
        if self._watchdog is None:
            socket_path = self.engine_socket or engine_socket(self.endpoint, os.environ)
            self._watchdog = Watchdog(self.images, self.endpoint, socket_path, self._openings)
        return self._watchdog

    def _guard(self) -> None:
        """The border holds on the engine (egress/border.py) before anything of a task's
        reaches beyond its own network: this process's watchdog is armed (with no labels
        yet when watch() was not called: it then sweeps nothing). Raises
        SandboxStartError."""
        keeper = self._keeper()
        if keeper.armed:
            return
        try:
            keeper.arm({})
        except SandboxError as error:
            raise SandboxStartError(
                f"the border of the sandboxes on the Docker engine at "
                f"{describe_endpoint(self.endpoint)} cannot be held ({error}); it keeps a "
                "sandbox's network to the internet, and needs a container on the engine's "
                "host network with CAP_NET_ADMIN. A network of your own "
                "(sandbox_provider_options.network) is used without it"
            ) from None

    def _guarded_network(self) -> str:
        """The sandboxes' network, once the border holds (a build's steps join it)."""
        network = self._isolated.name()
        self._guard()
        return network

    def unwatch(self) -> None:
        if self._watchdog is not None:
            self._watchdog.disarm()

    def check_ready(self) -> None:
        """The engine answers, or SandboxStartError naming the address tried and the fix."""
        try:
            engine_for(self.endpoint).api.ping()
        except SandboxStartError:
            raise
        except (docker.errors.DockerException, *TRANSPORT_ERRORS) as error:
            raise SandboxStartError(unreachable(self.endpoint, explain(error))) from None

    @property
    def peers(self) -> list[DockerProvider]:
        """Other engines of the same run, which an image missing here may come from."""
        return self._peers

    @peers.setter
    def peers(self, others: list[DockerProvider]) -> None:
        self._peers = list(others)
        self.images.peers = [other.images for other in others]

    @property
    def builder(self) -> str:
        return self.images.builder

    def tools_volume(self) -> str:
        return self.images.tools_volume()

    def prepare_image(self, source: ImageSource) -> str:
        return self.images.prepare_image(source)

    def prepare_layer(self, layer: ImageLayer) -> str:
        return self.images.prepare_layer(layer)

    def image_config(self, image: str) -> ImageConfig:
        return self.images.image_config(image)

    def remove_image(self, image: str) -> None:
        self.images.remove_image(image)

    def start(self, spec: SandboxSpec) -> DockerSandbox:
        watchdog = self._watchdog
        if watchdog is not None:
            # The engine restarted since it was armed: its watchdog went with it.
            try:
                if watchdog.rearm_if_lost():
                    log.warning("the engine restarted: a new watchdog watches this process")
            except SandboxError as error:
                log.info("the watchdog could not be started again yet: %s", error)
        if spec.ready_timeout_s is None:
            return self._start(spec)
        attempt = _StartAttempt(self, spec)
        thread = threading.Thread(target=attempt.run, name="harbor-start", daemon=True)
        thread.start()
        if not join(thread, spec.ready_timeout_s):
            attempt.abandon()
            raise SandboxStartError(
                f"the sandbox from {spec.image} did not start within "
                f"sandbox_ready_timeout_s = {spec.ready_timeout_s:g} s"
            )
        return attempt.result()

    def _start(self, spec: SandboxSpec) -> DockerSandbox:
        if spec.group is not None:
            return self._start_group(spec, spec.group)
        engine = engine_for(self.endpoint)
        api = engine.api
        host_config = Limits.of(spec, engine).host_config(spec)
        # It is not removed by the engine as it ends: a sandbox that stopped must still be
        # there to say why (status()).
        entrypoint, command = keep_alive(spec)
        egress: Egress | None = None
        env = dict(spec.env)
        for attempt in range(2):
            # Made even for a sandbox that starts offline: a later phase may join it.
            network = self._network_of(spec)
            if spec.filtered and egress is None:
                egress = self._start_egress(spec, network)
                host_config["dns"] = [egress.address]
                env = egress.proxy_env() | env
            try:
                created = api.create_container(
                    spec.image,
                    entrypoint=entrypoint,
                    command=command,
                    user=FIRST_USER,
                    labels=dict(spec.labels),
                    environment=[f"{key}={value}" for key, value in env.items()],
                    working_dir=spec.workdir,
                    host_config=api.create_host_config(
                        network_mode=network if spec.network or egress else "none",
                        binds={self.tools_volume(): {"bind": TRUSTED_TOOLS, "mode": "ro"}},
                        **host_config,
                    ),
                    detach=True,
                )
                break
            except ENGINE_ERRORS as error:
                if attempt == 0 and isinstance(error, docker.errors.NotFound):
                    # The isolated network was removed: make it again.
                    self._isolated.forget()
                    continue
                if egress is not None:
                    egress.remove()
                raise SandboxStartError(
                    f"cannot create a sandbox from {spec.image}: {explain(error)}"
                ) from None
        sandbox = DockerSandbox(
            created["Id"],
            online=spec.network or egress is not None,
            network=network,
            endpoint=self.endpoint,
            user=self.image_config(spec.image).user,
        )
        sandbox.egress = egress
        try:
            if egress is not None:
                # Its own network first, then its first phase (which may take the outside
                # away) before anything in it runs but the keep-alive.
                api.connect_container_to_network(created["Id"], egress.network)
            api.start(created["Id"])
            if egress is not None:
                sandbox.set_egress(spec.network, spec.allowed_hosts)
        except (*ENGINE_ERRORS, SandboxError) as error:
            sandbox.stop()
            raise SandboxStartError(
                f"the sandbox from {spec.image} did not start: {explain(error)}"
            ) from None
        _take_first_report(sandbox, spec, api)
        return sandbox

    def _start_egress(self, spec: SandboxSpec, outside: str) -> Egress:
        """The egress of a sandbox started `filtered`: its only way to `outside`."""
        return start_egress(
            self.images, outside=outside, labels=spec.labels, endpoint=self.endpoint
        )

    def _start_group(self, spec: SandboxSpec, group: SandboxGroup) -> DockerSandbox:
        """The Compose project `group`, `main` kept alive like any sandbox (the trusted
        sleep as its first process, the trusted tools mounted), its other services first,
        as their depends_on conditions and health checks say (`up --wait`)."""
        from pytest_harbor.sandboxes.compose.model import TOOLS_KEY

        # The project's own networks are bridges the border judges, whatever the option.
        self._guard()
        entrypoint, command = keep_alive(spec)
        main: dict[str, Any] = {
            # Compose reads `$` as its own variables': `$$` is a `$` for the shell.
            "entrypoint": [part.replace("$", "$$") for part in entrypoint],
            "command": [part.replace("$", "$$") for part in command],
            "user": FIRST_USER,
            "environment": dict(spec.env),
            "volumes": [
                {"type": "volume", "source": TOOLS_KEY, "target": TRUSTED_TOOLS, "read_only": True}
            ],
        }
        if spec.workdir:
            main["working_dir"] = spec.workdir
        main.update(Limits.of(spec, engine_for(self.endpoint)).compose_service(spec))

        egress: Egress | None = None
        if spec.filtered:
            # The project's networks are internal; the egress is its only way out, in
            # the seed's policy before any service starts.
            egress = self._start_egress(spec, self._network_of(spec))
            main["environment"] = egress.proxy_env(group.config["services"]) | main["environment"]
        try:
            if egress is not None and spec.network and spec.allowed_hosts is not None:
                egress.set_policy("allowlist", spec.allowed_hosts)
            sandbox = self._up(spec, group, main, egress)
        except BaseException:
            if egress is not None:
                egress.remove()
            raise
        sandbox.egress = egress
        _take_first_report(sandbox, spec, engine_for(self.endpoint).api)
        return sandbox

    def _up(
        self, spec: SandboxSpec, group: SandboxGroup, main: dict[str, Any], egress: Egress | None
    ) -> ComposeSandbox:
        """The episode's project started (projects.start_project), its main service the
        sandbox; raises SandboxStartError (the project removed)."""
        from pytest_harbor.sandboxes.compose.model import TOOLS_KEY
        from pytest_harbor.sandboxes.compose.project import (
            EgressLink,
            episode_project,
            project_name,
        )

        name = project_name(group.episode, uuid.uuid4().hex[:8])
        config = episode_project(
            group.config,
            name=name,
            main_image=spec.image,
            built=group.built,
            labels=spec.labels,
            main=main,
            internal=not spec.network,
            egress=None if egress is None else EgressLink(egress.network, egress.address),
        )
        volumes = config.setdefault("volumes", {})
        if TOOLS_KEY in volumes:
            # The model refuses the name in a task's file: never let one stand for the tools.
            raise SandboxStartError(f"the project already has a volume {TOOLS_KEY}")
        volumes[TOOLS_KEY] = {"external": True, "name": self.tools_volume()}
        main_id = start_project(name, config, timeout=spec.ready_timeout_s, endpoint=self.endpoint)
        return ComposeSandbox(
            main_id,
            name,
            online=spec.network and egress is None,
            endpoint=self.endpoint,
            user=self.image_config(spec.image).user,
        )

    def labelled(self, key: str) -> list[tuple[str, dict[str, str]]]:
        try:
            found = engine_for(self.endpoint).api.containers(all=True, filters={"label": key})
        except ENGINE_ERRORS as error:
            raise SandboxError(f"cannot list the engine's containers: {explain(error)}") from None
        return [(container["Id"], dict(container.get("Labels") or {})) for container in found]

    def remove(self, sandbox_id: str) -> None:
        DockerSandbox(sandbox_id, endpoint=self.endpoint).stop()

    def labelled_leftovers(self, key: str) -> list[tuple[str, dict[str, str]]]:
        """Networks and volumes (of Compose projects) with a label `key`: a reference for
        remove_leftover() and their labels. Networks first: a volume may outlive them."""
        api = engine_for(self.endpoint).api
        found: list[tuple[str, dict[str, str]]] = []
        try:
            for network in api.networks(filters={"label": key}):
                found.append((f"network:{network['Id']}", dict(network.get("Labels") or {})))
            for volume in (api.volumes(filters={"label": key}) or {}).get("Volumes") or []:
                found.append((f"volume:{volume['Name']}", dict(volume.get("Labels") or {})))
        except ENGINE_ERRORS as error:
            log.warning("cannot list networks and volumes: %s", explain(error))
        return found

    def remove_leftover(self, reference: str) -> None:
        """Remove a network or volume labelled_leftovers() gave; in use or gone: no error."""
        kind, _, name = reference.partition(":")
        api = engine_for(self.endpoint).api
        with contextlib.suppress(docker.errors.APIError):
            if kind == "network":
                api.remove_network(name)
            else:
                api.remove_volume(name, force=True)

    def remove_labelled(self, labels: Mapping[str, str]) -> int:
        api = engine_for(self.endpoint).api
        wanted = [f"{key}={value}" for key, value in labels.items()]
        removed = 0
        try:
            found = api.containers(all=True, filters={"label": wanted})
        except ENGINE_ERRORS as error:
            raise SandboxError(f"cannot list the engine's containers: {explain(error)}") from None
        for container in found:
            DockerSandbox(container["Id"], endpoint=self.endpoint).stop()
            removed += 1
        # What Compose projects made beside their containers.
        remove_networks_and_volumes({"label": wanted}, self.endpoint)
        return removed


def _take_first_report(sandbox: DockerSandbox, spec: SandboxSpec, api: docker.APIClient) -> None:
    """Wait for the started sandbox's first process to have made the folders and run the
    start script, and keep what the script printed. An engine whose log cannot be read
    (its log driver) gets the folders through the archive API instead, and the engine
    runs the start script by exec. Removes the sandbox and raises SandboxStartError when
    it cannot be used."""
    try:
        report = read_first_report(api, sandbox.id)
        if report is None:
            if spec.directories:
                api.put_archive(sandbox.id, "/", pack_directories(spec.directories))
            return
    except (SandboxStartError, *ENGINE_ERRORS) as error:
        sandbox.stop()
        raise SandboxStartError(
            f"the sandbox from {spec.image} did not start: {explain(error)}"
        ) from None
    if report.missing:
        sandbox.stop()
        raise SandboxStartError(f"cannot make the sandbox's folders: {', '.join(report.missing)}")
    if spec.start_script is not None and report.status == 0:
        sandbox.started_with = report.output


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
        except (SandboxError, *ENGINE_ERRORS) as error:
            # The engine went away while the sandbox started (or could not be removed).
            self._error = SandboxStartError(f"the sandbox did not start: {explain(error)}")
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
