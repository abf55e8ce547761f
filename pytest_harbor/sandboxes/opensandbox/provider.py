"""The `opensandbox` sandbox provider: sandboxes of an OpenSandbox server (its Docker
runtime, or Kubernetes with a pod per sandbox), each with an execd of its own that only
this run can drive (a token of its own), the trusted busybox copied in as root before
anything else runs, the run's labels as metadata, and a lifetime the server keeps."""

from __future__ import annotations

import contextlib
import hashlib
import math
import secrets
import time
from collections.abc import Iterator, Mapping
from typing import Any

from pytest_harbor.display import harbor_logger
from pytest_harbor.locks import Pace, Slots
from pytest_harbor.sandboxes.base import (
    SEALED_BUSYBOX,
    TRUSTED_BUSYBOX,
    TRUSTED_TOOLS,
    ImageConfig,
    ImageLayer,
    ImageSource,
    ProviderContext,
    SandboxCapabilities,
    SandboxError,
    SandboxSpec,
    SandboxStartError,
)
from pytest_harbor.sandboxes.opensandbox.api import (
    CREATE_TIMEOUT_S,
    EXECD_PORT,
    ApiError,
    Lifecycle,
    SandboxRecord,
)
from pytest_harbor.sandboxes.opensandbox.egress import EGRESS_PORT, EgressPolicy, policy_of
from pytest_harbor.sandboxes.opensandbox.execd import Execd
from pytest_harbor.sandboxes.opensandbox.images import RegistryImages
from pytest_harbor.sandboxes.opensandbox.metadata import from_metadata, to_metadata
from pytest_harbor.sandboxes.opensandbox.options import (
    OpenSandboxOptions,
    environment,
    read_options,
)
from pytest_harbor.sandboxes.opensandbox.sandbox import (
    INPUT_FOLDER,
    IO_FOLDER,
    KEPT_FOLDER,
    OpenSandboxSandbox,
)

__all__ = ["OpenSandboxProvider", "opensandbox_provider"]

log = harbor_logger()

#: What a server says when it will not create more now: asked again later.
_BUSY = (429, 503)

#: How long a new sandbox's execd may take to answer.
_EXECD_READY_S = 60.0
#: The sandbox's first process: a sleep that ends only with the sandbox (the server runs
#: it under its own bootstrap, as the image's user, root for the engine to work).
_KEEP_ALIVE = ("tail", "-f", "/dev/null")
#: Run as root right after the busybox is in: checks that the tools are the engine's alone
#: (a folder of root's, 0755, that no one else may replace), makes the sealed copy (0111)
#: and the engine's folders,
#: then the spec's directories (`MODE:PATH` arguments; `keep:PATH` makes a folder only if
#: it is missing), then runs the start script.
_SETUP = f"""B={TRUSTED_BUSYBOX}
fail() {{ echo "$*" >&2; exit 3; }}
[ -L {TRUSTED_TOOLS} ] && fail "{TRUSTED_TOOLS} is a link"
[ "$($B stat -c %u:%g:%a {TRUSTED_TOOLS})" = 0:0:755 ] \\
  || fail "{TRUSTED_TOOLS} is not root's (0755)"
[ "$($B stat -c %u:%a {TRUSTED_BUSYBOX})" = 0:755 ] || fail "{TRUSTED_BUSYBOX} is not root's"
[ -e {SEALED_BUSYBOX} ] || [ -L {SEALED_BUSYBOX} ] && fail "{SEALED_BUSYBOX} was there before"
$B cp {TRUSTED_BUSYBOX} {SEALED_BUSYBOX} && $B chmod 111 {SEALED_BUSYBOX} \\
  || fail "cannot make {SEALED_BUSYBOX}"
case $($B stat -c %A /) in ?????w???[!tT]|????????w[!tT]) fail "/ may be written by others" ;; esac
for folder in {IO_FOLDER} {INPUT_FOLDER} {KEPT_FOLDER}; do
  [ -L $folder ] && fail "$folder is a link"
done
$B mkdir -p {IO_FOLDER} {INPUT_FOLDER} {KEPT_FOLDER} \\
  && $B chown 0:0 {IO_FOLDER} {INPUT_FOLDER} {KEPT_FOLDER} \\
  && $B chmod 700 {IO_FOLDER} && $B chmod 711 {INPUT_FOLDER} && $B chmod 1733 {KEPT_FOLDER} \\
  || fail "cannot make the engine's folders"
count=$1; shift
while [ "$count" -gt 0 ]; do
  mode=${{1%%:*}} path=${{1#*:}}
  if [ "$mode" = keep ]; then
    [ -d "$path" ] || $B mkdir -p "$path" || fail "cannot make $path"
  else
    $B mkdir -p "$path" && $B chmod "$mode" "$path" || fail "cannot make $path"
  fi
  shift; count=$((count - 1))
done
script=$1; shift
[ -z "$script" ] || exec $B sh -c "$script" sh "$@"
"""


#: The most cpus a sandbox is asked for (more than any machine has: all of them).
_MOST_CPUS = 100_000


def _wait_for(execd: Execd, sandbox_id: str, started: float, seconds: float) -> None:
    """Until the sandbox's execd answers, `seconds` from `started` at the most."""
    while not execd.ping():
        if time.monotonic() >= started + seconds:
            raise SandboxStartError(
                f"sandbox {sandbox_id}: its execd did not answer within {seconds:g} s"
            )
        time.sleep(0.1)


def _set_up(sandbox: OpenSandboxSandbox, spec: SandboxSpec) -> None:
    """The spec's folders made and its start script run, as root, in one command; then
    the sandbox sealed, the script's output kept (ReportsStart)."""
    directories = [f"{mode:o}:{path}" for path, mode in spec.directories.items()]
    if spec.workdir:
        # The engine's exec makes a container's working folder when it starts.
        directories.insert(0, f"keep:{spec.workdir}")
    done = sandbox.exec(
        [
            TRUSTED_BUSYBOX,
            "sh",
            "-c",
            _SETUP,
            "sh",
            str(len(directories)),
            *directories,
            spec.start_script or "",
            *spec.start_arguments,
        ],
        user="0:0",
        workdir="/",
        timeout=120,
    )
    if done.exit_code != 0:
        raise SandboxStartError(
            f"sandbox {sandbox.id} from {spec.image} could not be set up: "
            + (done.stderr.strip()[-300:] or f"exit status {done.exit_code}")
        )
    sandbox.sealed()
    sandbox.started_with = done.stdout if spec.start_script else None


def _cpu(cpus: float | None, default: str) -> str:
    if cpus is None:
        return default
    return f"{max(1, math.ceil(min(cpus, _MOST_CPUS) * 1000))}m"


def _memory(memory_mb: int | None, default: str) -> str:
    return default if memory_mb is None else f"{memory_mb}Mi"


class OpenSandboxProvider:
    """Sandboxes on an OpenSandbox server; images made here go through a registry."""

    name = "opensandbox"

    def __init__(
        self,
        options: OpenSandboxOptions,
        server: str,
        key: str,
        context: ProviderContext | None = None,
    ) -> None:
        self.options = options
        self.capabilities = SandboxCapabilities(
            user_groups=True,
            # Held by each sandbox's egress sidecar, when the server runs it in dns+nft
            # mode (its default mode blocks names, not addresses).
            network_off=options.network_policy,
            network_allowlists=options.network_policy,
            builds=options.registry is not None,
            snapshots=False,
        )
        self.server = server
        self._lifecycle = Lifecycle(server, key, options.bounds())
        self.images = RegistryImages(options.registry)
        # Shared by every process of the run on this machine, per server.
        shared = (context or ProviderContext()).scratch_dir / (
            "opensandbox-" + hashlib.sha256(server.encode()).hexdigest()[:12]
        )
        self._starting = Slots(shared / "starting", options.max_starting)
        self._pace = Pace(shared / "pace", options.starts_per_second)

    def check_ready(self) -> None:
        """The server answers and takes the key, or SandboxStartError saying which."""
        try:
            self._lifecycle.check()
        except ApiError as error:
            hint = ""
            if error.status == 401:
                hint = " (the key: OPENSANDBOX_API_KEY, or the variable api_key_env names)"
            elif error.unreachable:
                hint = " (the address: OPENSANDBOX_DOMAIN, or sandbox_provider_options.domain)"
            raise SandboxStartError(f"{error}{hint}") from None

    # -------------------------------------------------------------------------- images

    def prepare_image(self, source: ImageSource) -> str:
        return self.images.prepare_image(source)

    def prepare_layer(self, layer: ImageLayer) -> str:
        return self.images.prepare_layer(layer)

    def image_config(self, image: str) -> ImageConfig:
        return self.images.image_config(image)

    def remove_image(self, image: str) -> None:
        pass  # nothing of the run's is made there: no snapshots

    # ----------------------------------------------------------------------- sandboxes

    def start(self, spec: SandboxSpec) -> OpenSandboxSandbox:
        config = self.image_config(spec.image)
        self._refuse(spec, config)
        token = secrets.token_urlsafe(32)
        tools = self.images.tools_binary()
        with self._turn_to_start():
            started = time.monotonic()
            record = self._create(spec, token)
            execd: Execd | None = None
            try:
                url, headers = self._lifecycle.endpoint(
                    record.id, EXECD_PORT, self.options.use_server_proxy
                )
                execd = Execd(
                    url, {**headers, "X-EXECD-ACCESS-TOKEN": token}, self.options.bounds()
                )
                _wait_for(execd, record.id, started, spec.ready_timeout_s or _EXECD_READY_S)
                egress = self._egress(record) if self.options.network_policy else None
            except BaseException as error:
                raise self._discarded(record, execd, spec, error) from None
        try:
            execd.upload({TRUSTED_BUSYBOX: (tools, 0o755)})
            sandbox = OpenSandboxSandbox(
                record.id,
                self._lifecycle,
                execd,
                user=config.user,
                workdir=spec.workdir or "",
                env=spec.env,
                online=spec.network,
                egress=egress,
            )
            _set_up(sandbox, spec)
            return sandbox
        except BaseException as error:
            raise self._discarded(record, execd, spec, error) from None

    def _egress(self, record: SandboxRecord) -> EgressPolicy:
        """The sandbox's egress sidecar, once it says it holds its policy on addresses."""
        url, headers = self._lifecycle.endpoint(
            record.id, EGRESS_PORT, self.options.use_server_proxy
        )
        egress = EgressPolicy(url, headers, self.options.bounds())
        mode = egress.enforcement()
        if "nft" not in mode.split("+"):
            egress.close()
            raise SandboxStartError(
                f"sandbox {record.id}: its egress sidecar enforces in {mode!r} mode, which "
                "blocks names, not addresses: a phase without the network or an allow-list "
                "would not hold (run the server's egress with OPENSANDBOX_EGRESS_MODE="
                "dns+nft, or leave sandbox_provider_options.network_policy unset)"
            )
        return egress

    def _discarded(
        self, record: SandboxRecord, execd: Execd | None, spec: SandboxSpec, error: BaseException
    ) -> BaseException:
        """The sandbox removed after its start failed with `error` (the server would keep
        it its lifetime); what to raise."""
        if execd is not None:
            execd.close()
        with contextlib.suppress(ApiError):
            self._lifecycle.delete(record.id)
        if isinstance(error, SandboxStartError) or not isinstance(error, ApiError | SandboxError):
            return error
        return SandboxStartError(f"sandbox {record.id} from {spec.image}: {error}")

    @contextlib.contextmanager
    def _turn_to_start(self) -> Iterator[None]:
        """One of `max_starting` places (shared by every process of the run here), held
        from the create to its execd's first answer, the create paced at
        `starts_per_second`: a run of many workers never storms the server."""
        waited = time.monotonic()
        slot = self._starting.acquire(CREATE_TIMEOUT_S + _EXECD_READY_S)
        if slot is None:
            raise SandboxStartError(
                f"no place to start a sandbox came free within "
                f"{CREATE_TIMEOUT_S + _EXECD_READY_S:g} s "
                f"(sandbox_provider_options.max_starting = {self.options.max_starting})"
            )
        try:
            self._pace.wait()
            waited = time.monotonic() - waited
            if waited > 5:
                log.info("waited %.1f s for a turn to start a sandbox", waited)
            yield
        finally:
            slot.release()

    def _refuse(self, spec: SandboxSpec, config: ImageConfig) -> None:
        """SandboxStartError for a spec this provider cannot start as the engine needs."""
        if spec.group is not None:
            raise SandboxStartError("the opensandbox provider runs no Compose projects")
        if not spec.network and not self.options.network_policy:
            raise SandboxStartError(
                "the opensandbox provider cannot start a sandbox without the network "
                "unless the server holds egress policies (sandbox_provider_options."
                "network_policy)"
            )
        if not self.images.runs_as_root(spec.image):
            raise SandboxStartError(
                f"{spec.image} runs as USER {config.user}: OpenSandbox runs its command daemon "
                "as the image's user, and the engine needs root in the sandbox (name a "
                "registry, sandbox_provider_options.registry, and the image is pushed there "
                "running as root, its USER still the commands' default)"
            )

    def _create(self, spec: SandboxSpec, token: str) -> SandboxRecord:
        """The sandbox made on the server, its execd given `token`."""
        ttl = spec.ttl_s if spec.ttl_s is not None else self.options.default_ttl_s
        given_up = time.monotonic() + CREATE_TIMEOUT_S
        delay = 0.5
        while True:
            try:
                return self._lifecycle.create(
                    image=spec.image,
                    entrypoint=_KEEP_ALIVE,
                    resources={
                        "cpu": _cpu(spec.cpus, self.options.default_cpu),
                        "memory": _memory(spec.memory_mb, self.options.default_memory),
                    },
                    timeout_s=max(60, math.ceil(min(ttl, 2**31))),
                    env={**spec.env, "EXECD_ACCESS_TOKEN": token},
                    metadata=to_metadata(spec.labels),
                    network_policy=policy_of(spec.network, spec.allowed_hosts)
                    if self.options.network_policy
                    else None,
                )
            except ApiError as error:
                # A refusal for now made nothing: asked again, later and later.
                if error.status not in _BUSY or time.monotonic() + delay > given_up:
                    raise SandboxStartError(
                        f"the OpenSandbox server did not start the sandbox: {error}"
                    ) from None
                log.info("the OpenSandbox server is busy (%s); creating again", error)
            time.sleep(delay)
            delay = min(delay * 2, 10.0)

    def labelled(self, key: str) -> list[tuple[str, dict[str, str]]]:
        try:
            records = self._lifecycle.list()
        except ApiError as error:
            raise SandboxError(f"cannot list the OpenSandbox server's sandboxes: {error}") from None
        found = []
        for record in records:
            labels = from_metadata(record.metadata)
            if key in labels:
                found.append((record.id, labels))
        return found

    def remove(self, sandbox_id: str) -> None:
        try:
            self._lifecycle.delete(sandbox_id)
        except ApiError as error:
            raise SandboxError(f"cannot remove sandbox {sandbox_id}: {error}") from None

    def remove_labelled(self, labels: Mapping[str, str]) -> int:
        try:
            records = self._lifecycle.list()
        except ApiError as error:
            raise SandboxError(f"cannot list the OpenSandbox server's sandboxes: {error}") from None
        removed = 0
        for record in records:
            held = from_metadata(record.metadata)
            if all(held.get(key) == value for key, value in labels.items()):
                self.remove(record.id)
                removed += 1
        return removed


def opensandbox_provider(
    *, options: Mapping[str, Any], context: ProviderContext
) -> OpenSandboxProvider:
    """The provider from `sandbox_provider_options` and the environment."""
    checked = read_options(options)
    environ = environment()
    return OpenSandboxProvider(checked, checked.server(environ), checked.key(environ), context)
