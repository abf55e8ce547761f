"""Images for a cluster: a task's prebuilt image goes to the server as it is named; one
built from a Dockerfile (and an agent's install layer) is made on this machine's Docker
engine, as the docker provider makes it, then pushed to the registry the options name,
once per content tag. The images' configs are read here, from this machine's engine."""

from __future__ import annotations

import contextlib
import dataclasses
import threading

import docker.errors

from pytest_harbor.display import harbor_logger
from pytest_harbor.labels import CACHE_LABEL, OWNER_LABEL, RUN_LABEL
from pytest_harbor.sandboxes.base import (
    ImageConfig,
    ImageLayer,
    ImageSource,
    SandboxStartError,
    is_root_user,
)
from pytest_harbor.sandboxes.docker.engine import ENGINE_ERRORS, engine_for, explain
from pytest_harbor.sandboxes.docker.provider import DockerProvider
from pytest_harbor.sandboxes.images import build_lock

__all__ = ["CLUSTER_SUFFIX", "REPOSITORY", "RegistryImages", "no_registry"]

log = harbor_logger()

#: The repository under the registry that images made here are pushed to.
REPOSITORY = "pytest-harbor"
#: The end of the name of an image as it is pushed (made here from one of ours).
CLUSTER_SUFFIX = "-cluster"


def no_registry(what: str) -> str:
    return (
        f"{what} is built on this machine, and the OpenSandbox cluster cannot see this "
        "machine's images: name a registry it can pull from (sandbox_provider_options."
        "registry)"
    )


class RegistryImages:
    """Images built on this machine's engine and pushed to `registry`."""

    def __init__(self, registry: str | None, builder: str = "auto") -> None:
        self.registry = registry
        # Its builds run as the docker provider's do, under the border of this machine's
        # engine (held by a watchdog of this process's there, which sweeps nothing).
        self._engine = DockerProvider(builder=builder)
        self.local = self._engine.images
        #: The image each pushed reference was made from here.
        self._made_from: dict[str, str] = {}
        self._pushed: set[str] = set()
        #: Pushed images made to run as root from one whose USER is not.
        self._as_root: set[str] = set()
        self._lock = threading.Lock()

    def prepare_image(self, source: ImageSource) -> str:
        if source.docker_image is not None:
            if self.registry is None or is_root_user(self.image_config(source.docker_image).user):
                return source.docker_image
            return self._push(self._here(source.docker_image))
        if self.registry is None:
            raise SandboxStartError(no_registry("the task's environment"))
        return self._push(self.local.prepare_image(source))

    def prepare_layer(self, layer: ImageLayer) -> str:
        if self.registry is None:
            raise SandboxStartError(no_registry(layer.what))
        base = self._here(layer.base)
        return self._push(self.local.prepare_layer(dataclasses.replace(layer, base=base)))

    def image_config(self, image: str) -> ImageConfig:
        """The config of the image `image` was made from: its USER is the one commands
        run as by default, even where the pushed image runs as root."""
        return self.local.image_config(self._here(image))

    def runs_as_root(self, image: str) -> bool:
        """The sandbox's own processes (execd among them) run as root from `image`."""
        with self._lock:
            if image in self._as_root:
                return True
        return is_root_user(self.image_config(image).user)

    def tools_binary(self) -> bytes:
        return self.local.tools_binary()

    def _here(self, image: str) -> str:
        """The image on this machine's engine that `image` stands for (pulled here when it
        is a prebuilt one this engine lacks)."""
        found = self._made_from.get(image)
        if found is not None:
            return found
        return self.local.prepare_image(
            ImageSource(docker_image=image, context_dir=None, build_timeout_sec=600.0)
        )

    def _push(self, local: str) -> str:
        """`local` in the registry (pushed unless the registry has it; as root when its
        USER is someone else: OpenSandbox's command daemon runs as the image's user, and
        the engine needs root); its reference there."""
        assert self.registry is not None
        as_root = not is_root_user(self.local.image_config(local).user)
        source = self._for_cluster(local, as_root)
        name = source.replace("/", "-").replace(":", "-")
        remote = f"{self.registry}/{REPOSITORY}:{name}"
        with self._lock:
            if remote in self._pushed:
                return remote
        api = engine_for(None).api
        with build_lock(f"push-{remote.replace('/', '_').replace(':', '_')}"):
            try:
                api.inspect_distribution(remote)
                known = True
            except docker.errors.APIError:
                known = False
            if not known:
                try:
                    api.tag(source, f"{self.registry}/{REPOSITORY}", remote.rsplit(":", 1)[1])
                    for message in api.push(remote, stream=True, decode=True):
                        if isinstance(message, dict) and message.get("error"):
                            raise SandboxStartError(
                                f"pushing {local} to {remote} failed: {message['error']}"
                            )
                except ENGINE_ERRORS as error:
                    raise SandboxStartError(
                        f"pushing {local} to {remote} failed: {explain(error)}"
                    ) from None
                log.info("pushed %s to %s", local, remote)
        with self._lock:
            self._pushed.add(remote)
            self._made_from[remote] = local
            if as_root:
                self._as_root.add(remote)
        return remote

    def _for_cluster(self, local: str, as_root: bool) -> str:
        """`local` as it is pushed, made here once (a commit of an unstarted container):
        without the labels naming the run and process that built it (a build of ours
        carries them, and a sandbox the server starts from it would carry them too, where
        a docker provider's reaper on the same engine would take it for a dead run's), and
        running as root when `as_root`."""
        suffix = CLUSTER_SUFFIX + ("-root" if as_root else "")
        name = f"{local.replace('/', '-').replace(':', '-')}{suffix}"
        api = engine_for(None).api
        with build_lock(f"cluster-{name}"):
            try:
                api.inspect_image(name)
                return name
            except docker.errors.ImageNotFound:
                pass
            except ENGINE_ERRORS as error:
                raise SandboxStartError(f"cannot inspect {name}: {explain(error)}") from None
            changes = [f"LABEL {RUN_LABEL}=", f"LABEL {OWNER_LABEL}="]
            if as_root:
                changes.append("USER root")
            try:
                helper = api.create_container(local, labels={CACHE_LABEL: "cluster-helper"})
                try:
                    api.commit(helper["Id"], repository=name, changes=changes)
                finally:
                    with contextlib.suppress(docker.errors.APIError):
                        api.remove_container(helper["Id"], force=True)
            except ENGINE_ERRORS as error:
                raise SandboxStartError(
                    f"cannot make {local} ready to push: {explain(error)}"
                ) from None
        return name
