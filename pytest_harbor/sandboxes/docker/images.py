"""The images of one engine: the trusted tools' volume, prebuilt images pulled or copied
from another engine, builds of task folders (with `builders.py`'s BuildKit or classic
builder) and install layers, each made once."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import docker
import docker.errors
import docker.tls

from pytest_harbor.display import harbor_logger
from pytest_harbor.labels import CACHE_LABEL, CONTENT_HASH_LABEL
from pytest_harbor.sandboxes.archives import (
    pack_files,
    unpack_files,
)
from pytest_harbor.sandboxes.base import (
    RUN_LABEL,
    BuildOptions,
    ImageConfig,
    ImageLayer,
    ImageSource,
    SandboxError,
    SandboxStartError,
)
from pytest_harbor.sandboxes.docker.builders import (
    BUILDER_SETTING,
    ClassicBuild,
    ClassicRefusal,
    builder_hint,
    buildkit_build,
    buildx_answers,
    buildx_options,
    classic_options,
    failed_build,
    note_failed_build,
)
from pytest_harbor.sandboxes.docker.dockerfiles import classic_dockerfile, only_buildkit_reads
from pytest_harbor.sandboxes.docker.engine import (
    ENGINE_ERRORS,
    KILL_GRACE_S,
    Endpoint,
    engine_for,
    explain,
    tail_lines,
)
from pytest_harbor.sandboxes.images import build_lock, image_tag_for
from pytest_harbor.threads import join

log = harbor_logger()

_BUDGET = "[environment].build_timeout_sec"

#: The applets of the trusted busybox the engine's scripts run (engine/scripts.py and the
#: docker provider's keep-alive and exec wrapper).
REQUIRED_APPLETS = frozenset(
    {"awk", "chmod", "chown", "id", "kill", "mkdir", "mktemp", "mv", "nsenter", "rm", "sh"}
    | {"head", "sleep", "tail", "tar", "timeout", "usleep"}
)
#: The image the trusted tools come from: its /bin/busybox must be statically linked.
#: Pulled when missing, like a task's image; PYTEST_HARBOR_TOOLS_IMAGE names another.
TOOLS_IMAGE = os.environ.get("PYTEST_HARBOR_TOOLS_IMAGE", "busybox:musl")
#: Where an install script waits in the image while it runs (removed after).
_INSTALL_SCRIPT = "/tmp/pytest-harbor-install.sh"
#: First pause between image pulls; it doubles each try.
_PULL_BACKOFF_S = 0.5
#: The engine's helper image's build context (the egress, the watchdog and the border):
#: the one build the border does not confine, as it makes what holds the border.
HELPER_CONTEXT = Path(__file__).parent / "egress"


class EngineImages:
    """The images of one engine (`endpoint`; None: the one the environment names): each
    made, pulled or copied from a peer engine once, and remembered."""

    def __init__(self, endpoint: Endpoint | None = None, builder: str = "auto") -> None:
        self.endpoint = endpoint
        #: The images of the run's other engines, which one missing here may come from.
        self.peers: list[EngineImages] = []
        self._builder_option = builder
        self._builder: str | None = None
        self._buildx: bool | None = None
        self._present: set[str] = set()
        self._tags: dict[tuple[Path, BuildOptions], str] = {}
        self._configs: dict[str, ImageConfig] = {}
        self._tools_volume: str | None = None
        self._tools_lock = threading.Lock()
        self._tools_binary: bytes | None = None
        #: The network a task's build steps join once the border holds on the engine (the
        #: provider's; it raises SandboxStartError when the border cannot be held); None:
        #: builds are not confined (this engine's images are not a provider's).
        self.guard: Callable[[], str] | None = None

    def tools_volume(self) -> str:
        """The volume holding the trusted busybox, made once per tools image and engine
        (and kept, as a cache); every sandbox mounts it read-only at TRUSTED_TOOLS."""
        with self._tools_lock:
            if self._tools_volume is None:
                self._tools_volume = self._make_tools_volume()
            return self._tools_volume

    def tools_binary(self) -> bytes:
        """The trusted busybox itself (/bin/busybox of the tools image), read once: a
        provider whose sandboxes cannot mount the tools volume copies it in."""
        with self._tools_lock:
            if self._tools_binary is None:
                api = engine_for(self.endpoint).api
                image = self._prebuilt(TOOLS_IMAGE, retries=2)
                try:
                    helper = api.create_container(
                        image, entrypoint=["/bin/busybox"], labels={CACHE_LABEL: "tools-helper"}
                    )
                    try:
                        chunks, _ = api.get_archive(helper["Id"], "/bin/busybox")
                        data = b"".join(chunks)
                    finally:
                        with contextlib.suppress(docker.errors.APIError):
                            api.remove_container(helper["Id"], force=True)
                except ENGINE_ERRORS as error:
                    raise SandboxStartError(
                        f"cannot read /bin/busybox of {image}: {explain(error)}"
                    ) from None
                self._tools_binary = unpack_files(data, strip_components=0)["busybox"]
            return self._tools_binary

    def _make_tools_volume(self) -> str:
        api = engine_for(self.endpoint).api
        try:
            image = self._prebuilt(TOOLS_IMAGE, retries=2)
        except SandboxStartError as error:
            raise SandboxStartError(
                f"{error}; pytest-harbor runs its verification with the static busybox of "
                f"{TOOLS_IMAGE} (pull it, or make one: .ci/setup shows how)"
            ) from None
        digest = str(api.inspect_image(image)["Id"]).split(":")[-1]
        name = f"pytest-harbor-tools-{digest[:16]}"
        # A second, empty volume says the first is complete: one question to the engine,
        # where looking inside the volume takes a helper container.
        ready = f"{name}-ready"
        if self._volume_exists(api, ready, "tools-ready") and self._volume_exists(
            api, name, "tools"
        ):
            return name
        with self._lock(name):
            try:
                api.create_volume(name, labels={CACHE_LABEL: "tools"})
                # An existing volume of that name is returned as it is: ours, or refused.
                self._volume_exists(api, name, "tools")
                helper = api.create_container(
                    image,
                    entrypoint=["/bin/busybox"],
                    command=["--list"],
                    labels={CACHE_LABEL: "tools-helper"},
                    host_config=api.create_host_config(
                        binds={name: {"bind": "/fill", "mode": "rw"}}
                    ),
                )
            except ENGINE_ERRORS as error:
                raise SandboxStartError(f"cannot make the tools volume: {explain(error)}") from None
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
                _check_applets(api, helper["Id"], image)
            except ENGINE_ERRORS as error:
                raise SandboxStartError(
                    f"cannot copy /bin/busybox of {image} into the tools volume: {explain(error)}"
                ) from None
            finally:
                with contextlib.suppress(docker.errors.APIError):
                    api.remove_container(helper["Id"], force=True)
            try:
                api.create_volume(ready, labels={CACHE_LABEL: "tools-ready"})
                self._volume_exists(api, ready, "tools-ready")
            except ENGINE_ERRORS as error:
                raise SandboxStartError(f"cannot make the tools volume: {explain(error)}") from None
        return name

    @staticmethod
    def _volume_exists(api: docker.APIClient, name: str, role: str) -> bool:
        """Whether the volume `name` is on the engine, made by pytest-harbor for `role`
        (its label says so, which no task can set: a Compose file's labels of ours are
        refused, and its volumes are named after their episode). One of that name with
        another label is refused rather than mounted into every sandbox."""
        try:
            labels = api.inspect_volume(name).get("Labels") or {}
        except docker.errors.NotFound:
            return False
        except ENGINE_ERRORS as error:
            raise SandboxStartError(f"cannot ask for the tools volume: {explain(error)}") from None
        if labels.get(CACHE_LABEL) != role:
            raise SandboxStartError(
                f"the volume {name} on this engine was not made by pytest-harbor (no label "
                f"{CACHE_LABEL}={role}); remove it (docker volume rm {name})"
            )
        return True

    def prepare_image(self, source: ImageSource) -> str:
        if source.docker_image is not None:
            return self._prebuilt(source.docker_image, source.pull_retries)
        if source.context_dir is None:
            raise SandboxStartError("the task names neither a docker_image nor a build context")
        # Hash each build context (with its options) once per run, not once per trial.
        key = (source.context_dir, source.build)
        tag = self._tags.get(key)
        if tag is None:
            tag = self._tags[key] = image_tag_for(source.context_dir, source.build)
        if self._has_image(tag):
            return tag
        run = source.labels.get(RUN_LABEL, "")
        with self._lock(tag):
            if not self._has_image(tag) and not self._from_peer(tag):
                # A build that failed in this run is not tried again: every trial of the
                # task gets its failure (the builds ahead and the episodes share it).
                failed = failed_build(tag, run)
                if failed is not None:
                    raise SandboxStartError(failed)
                try:
                    self._build(source, tag)
                except SandboxStartError as error:
                    note_failed_build(tag, run, str(error))
                    raise
        return tag

    def prepare_layer(self, layer: ImageLayer) -> str:
        # One image per (base image, key): the same install on another task's image is
        # another image.
        try:
            base_id = str(engine_for(self.endpoint).api.inspect_image(layer.base)["Id"])
        except ENGINE_ERRORS as error:
            raise SandboxStartError(
                f"cannot inspect image {layer.base}: {explain(error)}"
            ) from None
        content_hash = hashlib.sha256(f"{base_id}\n{layer.key}".encode()).hexdigest()
        tag = f"hb-layer__{content_hash[:32]}"
        with self._lock(tag):
            stale: str | None = None
            if self._has_image(tag) or self._from_peer(tag):
                if not self._stale(tag, layer):
                    return tag
                stale = str(engine_for(self.endpoint).api.inspect_image(tag)["Id"])
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
                    labels={**layer.labels, CACHE_LABEL: "layer", CONTENT_HASH_LABEL: content_hash},
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
                    engine_for(self.endpoint).api.remove_image(stale)
        return tag

    def _stale(self, tag: str, layer: ImageLayer) -> bool:
        """With `rebuild_unless`, an image there counts only when it carries that label."""
        if layer.rebuild_unless is None:
            return False
        key, value = layer.rebuild_unless
        labels = (engine_for(self.endpoint).api.inspect_image(tag).get("Config") or {}).get(
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
                api = engine_for(self.endpoint).api
                for message in api.load_image(engine_for(peer.endpoint).api.get_image(name)):
                    if isinstance(message, dict) and message.get("error"):
                        raise SandboxError(str(message["error"]))
            except (SandboxError, *ENGINE_ERRORS) as error:
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
            engine_for(self.endpoint).api.inspect_image(name)
        except docker.errors.ImageNotFound:
            return False
        except ENGINE_ERRORS as error:
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
                engine_for(self.endpoint).api.pull(name)
            except ENGINE_ERRORS as error:
                if attempt == retries:
                    raise SandboxStartError(
                        f"image {name} is not on this machine and pulling it failed "
                        f"({attempt + 1} attempt{'s' if attempt else ''}): {explain(error)}"
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
            config = engine_for(self.endpoint).api.inspect_image(image).get("Config") or {}
        except ENGINE_ERRORS as error:
            raise SandboxStartError(f"cannot inspect image {image}: {explain(error)}") from None
        self._configs[image] = ImageConfig(
            entrypoint=tuple(config.get("Entrypoint") or ()),
            cmd=tuple(config.get("Cmd") or ()),
            workdir=config.get("WorkingDir") or "",
            user=config.get("User") or "",
            env=tuple(config.get("Env") or ()),
            labels=dict(config.get("Labels") or {}),
            healthcheck=tuple((config.get("Healthcheck") or {}).get("Test") or ()),
        )
        return self._configs[image]

    def _build(self, source: ImageSource, tag: str) -> None:
        assert source.context_dir is not None
        options = source.build
        with tempfile.TemporaryDirectory(prefix="harbor-dockerfile-") as scratch:
            dockerfile = options.dockerfile
            what = f"building {dockerfile or source.context_dir / 'Dockerfile'}"
            if options.dockerfile_inline is not None:
                # Outside the context: BuildKit reads it from there, and docker-py sends
                # it inside the context for the classic builder.
                dockerfile = Path(scratch) / "Dockerfile"
                dockerfile.write_text(options.dockerfile_inline)
                what = f"building the dockerfile_inline of {source.context_dir}"
            if options.target is not None:
                what += f" (target {options.target})"
            build = functools.partial(
                self._run_build,
                source.context_dir,
                tag=tag,
                # The run's labels win over the file's.
                labels={**dict(options.labels), **source.labels},
                what=what,
                nocache=options.no_cache,
                options=options,
                budget_name=_BUDGET,
            )
            started = time.monotonic()
            budget = source.build_timeout_sec
            try:
                if self._builder_for(options, what) == "buildkit":
                    build(dockerfile=dockerfile, builder="buildkit", budget=budget)
                else:
                    classic = _in_classic_words(source.context_dir, dockerfile, scratch)
                    build(dockerfile=classic, budget=budget)
            except ClassicRefusal as refusal:
                if self._builder_option != "auto":
                    raise
                if not self._buildx_answers():
                    raise SandboxStartError(
                        f"{refusal}\n(docker buildx does not answer here: with its plugin "
                        "installed, BuildKit builds what the classic builder cannot read)"
                    ) from None
                # What is left of the build's budget: a refusal the classic builder made
                # after running steps does not buy BuildKit a second budget.
                left = budget - (time.monotonic() - started)
                if left <= 0:
                    raise
                log.info("%s: the classic builder cannot read it; building with BuildKit", what)
                try:
                    build(
                        dockerfile=dockerfile,
                        builder="buildkit",
                        budget=left,
                        budget_name=f"what the classic builder left of [environment]"
                        f".build_timeout_sec ({budget:g} s)",
                    )
                except SandboxStartError as error:
                    raise SandboxStartError(
                        f"the classic builder cannot read it ({refusal.refusal}), so BuildKit "
                        f"built it, its RUN steps offline: {error}"
                    ) from None
        if not self._has_image(tag):
            raise SandboxStartError(f"{what} produced no image {tag}")

    @property
    def builder(self) -> str:
        """`classic` (the engine's API; `auto` picks it: its steps can join a network the
        border holds) or `buildkit` (through the buildx CLI plugin, its steps offline), as
        the provider option `builder` names."""
        if self._builder is None:
            self._builder = "classic" if self._builder_option == "auto" else self._builder_option
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
        options: BuildOptions | None = None,
        dockerfile: Path | None = None,
        builder: str | None = None,
    ) -> None:
        builder = builder or self.builder
        options = self._confined(context, options or BuildOptions(), builder)
        if builder == "buildkit":
            buildkit_build(
                context,
                tag=tag,
                labels=labels,
                nocache=nocache,
                what=what,
                budget=budget,
                budget_name=budget_name,
                endpoint=self.endpoint,
                flags=buildx_options(options, dockerfile),
            )
            return
        build = ClassicBuild(
            engine_for(self.endpoint).api,
            path=str(context),
            tag=tag,
            rm=True,
            forcerm=True,
            labels=dict(labels),
            nocache=nocache,
            decode=True,
            **classic_options(options, dockerfile),
        )
        thread = threading.Thread(target=build.run, name="harbor-build", daemon=True)
        thread.start()
        if not join(thread, budget):
            # The build stream cannot be cut from here; killing the step's container
            # makes the engine end the build.
            build.stop()
            join(thread, KILL_GRACE_S)
            build.remove_steps()
            raise SandboxStartError(
                f"{what} took longer than {budget_name} = {budget:g} s\n{tail_lines(build.log)}"
            )
        if build.error is not None:
            build.remove_steps()
            message = f"{what} failed: {build.error}\n{tail_lines(build.log)}\n" + builder_hint(
                "classic"
            )
            if only_buildkit_reads(build.error):
                raise ClassicRefusal(message, refusal=build.error)
            raise SandboxStartError(message)

    def _builder_for(self, options: BuildOptions, what: str) -> str:
        """The builder of a task's build: the run's; BuildKit for one with `extra_hosts` or
        no network, as the classic builder's cache keys a step by its command alone (its
        layer would serve another task's build of the same lines made without them)."""
        if self.builder == "buildkit" or not (options.extra_hosts or options.network == "none"):
            return self.builder
        if self._builder_option == "auto" and self._buildx_answers():
            return "buildkit"
        raise SandboxStartError(
            f"{what}: a build with extra_hosts or network: none is built with BuildKit, "
            "whose cache keys a step by them (the classic builder's does not: its layer "
            "would serve another task's build of the same lines); "
            + (
                "docker buildx does not answer here"
                if self._builder_option == "auto"
                else f"the run's {BUILDER_SETTING} is classic"
            )
        )

    def _buildx_answers(self) -> bool:
        """Whether the buildx CLI plugin answers for this engine (asked once)."""
        if self._buildx is None:
            self._buildx = buildx_answers(self.endpoint)
        return self._buildx

    def _confined(self, context: Path, options: BuildOptions, builder: str) -> BuildOptions:
        """A task's build (anything but the engine's helper image) reaches what a sandbox
        does: the classic builder's steps join the network the border holds (`guard()`,
        which holds it first), BuildKit's steps go offline (on the engine's own driver they
        run on its default bridge, which no border holds); a build that asks for no network
        keeps none."""
        if self.guard is None or context == HELPER_CONTEXT or options.network == "none":
            return options
        network = "none" if builder == "buildkit" else self.guard()
        return dataclasses.replace(options, network=network)

    def remove_image(self, image: str) -> None:
        try:
            engine_for(self.endpoint).api.remove_image(image, force=True)
        except docker.errors.NotFound:
            pass
        except ENGINE_ERRORS as error:
            raise SandboxError(f"cannot remove image {image[:19]}: {explain(error)}") from None


def _in_classic_words(context: Path, dockerfile: Path | None, scratch: str) -> Path | None:
    """The Dockerfile to give the classic builder: `dockerfile` (the context's own when
    None) or, when BuildKit and the classic builder read its form differently, a copy in
    the classic builder's words in `scratch` (docker-py sends it inside the context)."""
    path = dockerfile or context / "Dockerfile"
    try:
        rewritten = classic_dockerfile(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError):
        return dockerfile
    if rewritten is None:
        return dockerfile
    copy = Path(scratch) / "classic.Dockerfile"
    copy.write_text(rewritten)
    return copy


def _check_applets(api: docker.APIClient, helper: str, image: str) -> None:
    """Raise SandboxStartError unless the busybox of `image` (in the helper container
    `helper`, whose command lists its applets) has every applet the engine runs."""
    api.start(helper)
    api.wait(helper, timeout=60)
    listed = set(api.logs(helper, stdout=True, stderr=False).decode(errors="replace").split())
    missing = sorted(REQUIRED_APPLETS - listed)
    if missing:
        raise SandboxStartError(
            f"the busybox of {image} lacks {', '.join(missing)}, which pytest-harbor's "
            "verification runs (PYTEST_HARBOR_TOOLS_IMAGE names another image)"
        )
