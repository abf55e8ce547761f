"""A sandbox of the docker provider: one container, every call through the engine's API;
a Compose project's `main` service."""

from __future__ import annotations

import contextlib
import copy
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import docker
import docker.errors
import docker.tls
import requests

from pytest_harbor.display import harbor_logger
from pytest_harbor.labels import COMPOSE_PROJECT_LABEL, COMPOSE_SERVICE_LABEL
from pytest_harbor.sandboxes.archives import pack_files, pack_folder, unpack_files
from pytest_harbor.sandboxes.base import (
    RELAY_NAME,
    ROOT_USER,
    TRUSTED_BUSYBOX,
    ArchiveStream,
    EngineUnreachable,
    ExecResult,
    SandboxError,
    SandboxStatus,
)
from pytest_harbor.sandboxes.copies import HARNESS_COPY, CopyCapped, bounded
from pytest_harbor.sandboxes.docker.archive import open_archive
from pytest_harbor.sandboxes.docker.channel import ChannelPool
from pytest_harbor.sandboxes.docker.engine import (
    ENGINE_ERRORS,
    KILL_GRACE_S,
    TRANSPORT_ERRORS,
    Endpoint,
    engine_for,
    explain,
)
from pytest_harbor.sandboxes.docker.filtering import Egress, check_relay
from pytest_harbor.sandboxes.docker.networks import host_address
from pytest_harbor.sandboxes.docker.pipes import PID_FIRST, DockerPipe
from pytest_harbor.sandboxes.docker.projects import (
    remove_container,
    remove_project,
)
from pytest_harbor.sandboxes.docker.stream import EngineExec, OutputReader, start_exec
from pytest_harbor.threads import join

log = harbor_logger()

#: The network a sandbox with network access is on (and that a phase without it leaves).
DEFAULT_NETWORK = "bridge"
#: The directory bit of the file mode the engine reports (Go's os.ModeDir).
_GO_MODE_DIR = 1 << 31

#: Run by the trusted busybox shell: prints its pid (the command exec'd keeps it and leads
#: its process group) on stderr before anything else, so a deadline can kill the whole
#: group; then runs the command found on PATH by its full path (a bare name would run the
#: busybox applet of that name instead of the image's program).
#: Pauses before an exec whose process the runtime could not start is tried again.
_NOT_STARTED_PAUSES_S = (0.1, 0.5, 1.5)

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


class DockerSandbox:
    """One container; every call goes through the Docker engine API.

    `user` is who a command runs as when it names no one: the image's user (root when
    the image names none). None: the container's own user (a Compose sidecar's); a
    sandbox the provider started runs its keep-alive as KEEPALIVE_USER, never a command.

    Every command goes by plain exec, but those of the view `for_agent()` gives (a
    harness's), which go through the sandbox's command channels (channel/, opened on
    first use) when they have a deadline and one can carry them.
    """

    def __init__(
        self,
        container_id: str,
        online: bool = True,
        network: str = DEFAULT_NETWORK,
        endpoint: Endpoint | None = None,
        user: str | None = None,
    ) -> None:
        self._id = container_id
        self._endpoint = endpoint
        self._stopped = False
        self._online = online
        self._network = network
        self._user = None if user is None else (user or "0")
        self._channels = ChannelPool(container_id, endpoint, self._kill_group)
        #: This view's commands go through the channels (for_agent).
        self._by_channel = False
        #: What the spec's start script printed (set by the provider; ReportsStart).
        self.started_with: str | None = None
        #: The sandbox's egress, when it was started `filtered` (filtering.py).
        self.egress: Egress | None = None
        self._host_address: str | None = None

    @property
    def id(self) -> str:
        return self._id

    def start_output(self) -> str | None:
        return self.started_with

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
        if self._by_channel and timeout is not None:
            carried = self._channels.run(
                list(command),
                user=user or self._user or "",
                workdir=workdir,
                env=env,
                timeout=timeout,
                stdin=stdin,
            )
            if carried is not None:
                return carried
        return self._plain_exec(command, user, workdir, env, timeout, stdin)

    def for_agent(self) -> DockerSandbox:
        """This sandbox, its commands with a deadline through the command channels: a
        harness's. The engine's own steps never go this way: a channel is a process of
        the engine's in the sandbox, which a root agent can end, and one that needs
        processes the sandbox's cap may not leave."""
        view = copy.copy(self)
        view._by_channel = True
        return view

    def _plain_exec(
        self,
        command: Sequence[str],
        user: str | None,
        workdir: str | None,
        env: Mapping[str, str] | None,
        timeout: float | None,
        stdin: bytes | None,
    ) -> ExecResult:
        engine = engine_for(self._endpoint)
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
        if timeout is None:
            return self._exec_once(argv, user, workdir, env, timeout, stdin)[0]
        argv = [TRUSTED_BUSYBOX, "sh", "-c", _PID_WRAPPER, "sh", *argv]
        for pause in (*_NOT_STARTED_PAUSES_S, None):
            result, started = self._exec_once(argv, user, workdir, env, timeout, stdin)
            # The wrapper's first act is to say its pid: without it, the runtime could not
            # start the process at all (a sandbox at its pids cap can make runc's own
            # threads fail), and nothing of the command ran: it is tried again.
            if started or result.exit_code != 126 or result.timed_out or pause is None:
                return result
            time.sleep(pause)
        raise AssertionError("unreachable")

    def _exec_once(
        self,
        argv: list[str],
        user: str | None,
        workdir: str | None,
        env: Mapping[str, str] | None,
        timeout: float | None,
        stdin: bytes | None,
    ) -> tuple[ExecResult, bool]:
        """One exec, and whether its command started (known only with a timeout)."""
        running = self._start_exec(argv, user, workdir, env, stdin=stdin is not None)
        connection = running.connection
        reader = OutputReader(connection, reads_pid=timeout is not None)
        threads = [threading.Thread(target=reader.run, name="harbor-exec-out", daemon=True)]
        if stdin is not None:
            threads.append(
                threading.Thread(
                    target=connection.send_all, args=(stdin,), name="harbor-exec-in", daemon=True
                )
            )
        for thread in threads:
            thread.start()
        timed_out = not join(threads[0], timeout)
        if timed_out or reader.capped:
            # Past its deadline, or its output past what is read: the command ends.
            self._kill_group(reader.wait_for_pid(KILL_GRACE_S))
            if not join(threads[0], KILL_GRACE_S):
                connection.close()
                join(threads[0], 1.0)
        connection.close()
        try:
            exit_code = running.exit_code()
        except ENGINE_ERRORS as error:
            raise SandboxError(f"sandbox {self._id[:12]}: exec lost: {explain(error)}") from None
        if reader.broken is not None and not timed_out:
            raise SandboxError(
                f"sandbox {self._id[:12]}: the output of {argv[0]} was lost ({reader.broken})"
            )
        result = ExecResult(
            exit_code=-1 if exit_code is None else exit_code,
            stdout_bytes=reader.out.value(),
            stderr_bytes=reader.stderr(),
            timed_out=timed_out,
        )
        return result, reader.wait_for_pid(0) is not None

    def spawn(
        self, command: Sequence[str], *, user: str | None = None, workdir: str | None = None
    ) -> _Spawned:
        return _Spawned(self._start_exec(list(command), user, workdir, None))

    def open_pipe(
        self,
        command: Sequence[str],
        *,
        user: str | None = None,
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> DockerPipe:
        argv = [TRUSTED_BUSYBOX, "sh", "-c", PID_FIRST, "sh", *command]
        started = self._start_exec(argv, user, workdir, env, stdin=True)
        return DockerPipe(
            started.connection, self._kill_group, f"sandbox {self._id[:12]}: {command[0]}"
        )

    def _start_exec(
        self,
        argv: list[str],
        user: str | None,
        workdir: str | None,
        env: Mapping[str, str] | None,
        *,
        stdin: bool = False,
    ) -> EngineExec:
        """An exec of `argv` started (stream.start_exec) as `user`, else the sandbox's
        user; SandboxError (EngineUnreachable) when the engine would not start it."""
        try:
            return start_exec(
                engine_for(self._endpoint).api,
                self._id,
                argv,
                user=user or self._user or "",
                stdin=stdin,
                workdir=workdir,
                env=env,
            )
        except ENGINE_ERRORS as error:
            raise _exec_failed(self._id, error) from None

    def _kill_group(self, pid: int | None) -> None:
        if pid is None:
            return
        # Negative pid: the whole process group the command leads.
        script = f"kill -9 -{pid} 2>/dev/null; kill -9 {pid} 2>/dev/null; true"
        with contextlib.suppress(SandboxError):
            self._plain_exec(
                [TRUSTED_BUSYBOX, "sh", "-c", script], ROOT_USER, None, None, None, None
            )

    def upload(self, source: Path | Mapping[str, bytes], target: str) -> None:
        data = pack_folder(source) if isinstance(source, Path) else pack_files(source)
        try:
            engine_for(self._endpoint).api.put_archive(self._id, target, data)
        except ENGINE_ERRORS as error:
            raise SandboxError(
                f"sandbox {self._id[:12]}: upload to {target} failed: {explain(error)}"
            ) from None

    def _path_missing(self, error: docker.errors.NotFound) -> None:
        """A path that is not there is an answer; a sandbox that is not there (removed
        under the run) is not, and must not read as a verifier that wrote nothing."""
        if "no such container" in explain(error).lower():
            raise SandboxError(f"sandbox {self._id[:12]} is gone: {explain(error)}") from None

    def read_archive(self, source: str) -> bytes | None:
        chunks = self.iter_archive(source)
        if chunks is None:
            return None
        with bounded(chunks, HARNESS_COPY, f"reading {source}") as stream:
            return b"".join(stream)

    def write_archive(self, data: bytes | Iterable[bytes], into: str) -> None:
        try:
            engine_for(self._endpoint).api.put_archive(self._id, into, data)
        except ENGINE_ERRORS as error:
            raise SandboxError(
                f"sandbox {self._id[:12]}: writing into {into} failed: {explain(error)}"
            ) from None

    def download(self, source: str) -> dict[str, bytes]:
        what = f"sandbox {self._id[:12]}: download of {source}"
        try:
            chunks, stat = open_archive(engine_for(self._endpoint).api, self._id, source)
            with bounded(chunks, HARNESS_COPY, what) as stream:
                data = b"".join(stream)
        except docker.errors.NotFound as error:
            self._path_missing(error)
            return {}
        except ENGINE_ERRORS as error:
            raise SandboxError(f"{what} failed: {explain(error)}") from None
        except CopyCapped as error:
            raise SandboxError(str(error)) from None
        # A folder comes back as `folder/...`: drop that first part. A file as itself.
        is_folder = bool((stat or {}).get("mode", 0) & _GO_MODE_DIR)
        return unpack_files(data, strip_components=1 if is_folder else 0)

    def iter_archive(self, source: str) -> ArchiveStream | None:
        try:
            chunks, _ = open_archive(engine_for(self._endpoint).api, self._id, source)
        except docker.errors.NotFound as error:
            self._path_missing(error)
            return None
        except ENGINE_ERRORS as error:
            raise SandboxError(
                f"sandbox {self._id[:12]}: reading {source} failed: {explain(error)}"
            ) from None
        return chunks

    def set_network(self, enabled: bool) -> None:
        self.set_egress(enabled, None)

    def _set_plain_network(self, enabled: bool) -> None:
        if enabled == self._online:
            return
        if self._network == "host":
            raise SandboxError(
                f"sandbox {self._id[:12]} is on the host network, which cannot be "
                "taken away or given back"
            )
        api = engine_for(self._endpoint).api
        try:
            if enabled:
                api.connect_container_to_network(self._id, self._network)
            else:
                api.disconnect_container_from_network(self._id, self._network, force=True)
        except ENGINE_ERRORS as error:
            raise SandboxError(
                f"sandbox {self._id[:12]}: cannot {'connect' if enabled else 'disconnect'} "
                f"its network: {explain(error)}"
            ) from None
        self._online = enabled

    def host_address(self) -> str:
        """This machine's address on the sandbox's outside network (networks.host_address):
        the egress's when it has one, else the network it was started on. Asked once."""
        if self._host_address is None:
            outside = self._network if self.egress is None else self.egress.outside
            try:
                self._host_address = host_address(self._endpoint, outside)
            except SandboxError as error:
                raise SandboxError(f"sandbox {self._id[:12]}: {error}") from None
        return self._host_address

    def set_egress(
        self, enabled: bool, hosts: tuple[str, ...] | None, relay: str | None = None
    ) -> None:
        """The policy first, then the route: the outside network is taken away before an
        allow-list or no network holds, and given back only once the egress passes all.
        Every policy written carries `relay`, the public one too."""
        egress = self.egress
        if egress is None:
            if relay is not None:
                raise SandboxError(
                    f"sandbox {self._id[:12]} was not started `filtered`: without an egress "
                    f"it cannot reach the model relay as {RELAY_NAME}"
                )
            if enabled and hosts is not None:
                raise SandboxError(f"sandbox {self._id[:12]} was not started with an egress")
            self._set_plain_network(enabled)
            return
        if relay is not None:
            check_relay(relay)  # before anything changes
        outside = enabled and hosts is None
        if outside:
            egress.set_policy("public", relay=relay)
        api = engine_for(self._endpoint).api
        try:
            if outside and not self._online:
                api.connect_container_to_network(self._id, egress.outside)
            elif not outside and self._online:
                api.disconnect_container_from_network(self._id, egress.outside, force=True)
        except ENGINE_ERRORS as error:
            raise SandboxError(
                f"sandbox {self._id[:12]}: cannot change its network: {explain(error)}"
            ) from None
        self._online = outside
        if not outside:
            egress.set_policy("allowlist" if enabled else "none", hosts or (), relay)

    def snapshot(self, labels: Mapping[str, str]) -> str:
        try:
            made = engine_for(self._endpoint).api.commit(
                self._id,
                repository="pytest-harbor-snapshot",
                tag=uuid.uuid4().hex[:12],
                # The container runs its keep-alive as KEEPALIVE_USER; the snapshot runs
                # as the image did.
                conf={"Labels": dict(labels), "User": self._user or ""},
            )
        except ENGINE_ERRORS as error:
            raise SandboxError(
                f"sandbox {self._id[:12]}: snapshot failed: {explain(error)}"
            ) from None
        return str(made["Id"])

    def _state(self) -> dict[str, Any] | None:
        """The engine's State of the sandbox; None when it is gone or being removed (its
        first process was killed for that, and the container stays a moment after)."""
        try:
            state = engine_for(self._endpoint).api.inspect_container(self._id).get("State")
        except docker.errors.NotFound:
            return None
        except ENGINE_ERRORS as error:
            raise SandboxError(
                f"sandbox {self._id[:12]}: the engine does not say how it is: {explain(error)}"
            ) from None
        state = state or {}
        return None if state.get("Status") in ("removing", "dead") else state

    def status(self) -> SandboxStatus:
        state = self._state()
        if state is None:
            return SandboxStatus(present=False)
        running = bool(state.get("Running"))
        return SandboxStatus(
            present=True,
            running=running,
            out_of_memory=bool(state.get("OOMKilled")),
            out_of_processes=running and self._at_pids_cap(),
            exit_code=None if running else _int_or_none(state.get("ExitCode")),
        )

    def alive(self) -> bool:
        state = self._state()
        return state is not None and bool(state.get("Running"))

    def _at_pids_cap(self) -> bool:
        """Whether the sandbox holds as many processes as its cap allows (or nearly)."""
        try:
            stats = engine_for(self._endpoint).api.stats(self._id, stream=False, one_shot=True)
        except (docker.errors.DockerException, *TRANSPORT_ERRORS, TypeError):
            return False
        pids = stats.get("pids_stats") or {}
        current, limit = pids.get("current"), pids.get("limit")
        if not isinstance(current, int) or not isinstance(limit, int) or limit <= 0:
            return False
        return current >= limit - 2

    def stop(self) -> None:
        if self._stopped:
            return
        self._channels.close()
        remove_container(self._id, self._endpoint)
        if self.egress is not None:
            self.egress.remove()
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

    def _set_plain_network(self, enabled: bool) -> None:
        if enabled != self._online:
            raise SandboxError(
                "a Compose project keeps one network for all its phases (its services "
                "must reach each other)"
            )

    def set_egress(
        self, enabled: bool, hosts: tuple[str, ...] | None, relay: str | None = None
    ) -> None:
        """Behind an egress, the project's networks are internal in every phase: a phase
        is an allow-list or no network, only the egress's policy changes (with `relay`)."""
        if self.egress is None:
            super().set_egress(enabled, hosts, relay)
        elif enabled and hosts is None:
            raise SandboxError(
                "a Compose project behind an allow-list keeps it for all its phases: a "
                "phase cannot have the whole network"
            )
        else:
            self.egress.set_policy("allowlist" if enabled else "none", hosts or (), relay)

    def service(self, name: str) -> DockerSandbox:
        """Another service's container, to run a command in or copy from."""
        found = engine_for(self._endpoint).api.containers(
            filters={
                "label": [
                    f"{COMPOSE_PROJECT_LABEL}={self.project}",
                    f"{COMPOSE_SERVICE_LABEL}={name}",
                ]
            }
        )
        if not found:
            raise SandboxError(f"the Compose project has no running service {name!r}")
        return DockerSandbox(
            found[0]["Id"], online=self._online, network=self._network, endpoint=self._endpoint
        )

    def stop(self) -> None:
        if self._stopped:
            return
        self._channels.close()
        remove_project(self.project, self._endpoint)
        if self.egress is not None:
            self.egress.remove()
        self._stopped = True


def _exec_failed(container_id: str, error: Exception) -> SandboxError:
    """What an exec the engine would not create or start raises: EngineUnreachable when
    its connection was refused or dropped (not a timeout, which a busy sandbox can cause)."""
    unreachable = isinstance(error, requests.exceptions.ConnectionError) and not isinstance(
        error, requests.exceptions.Timeout
    )
    failure = EngineUnreachable if unreachable else SandboxError
    return failure(f"sandbox {container_id[:12]}: exec failed: {explain(error)}")


class _Spawned:
    """A running exec, drained in a thread of its own; its exit code comes from the engine
    when its output ends."""

    _TAIL_BYTES = 4096

    def __init__(self, started: EngineExec) -> None:
        self._exec = started
        self._connection = started.connection
        self._tail = bytearray()
        self._code: int | None = None
        self._thread = threading.Thread(target=self._watch, name="harbor-spawned", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        with contextlib.suppress(OSError, ValueError), contextlib.closing(self._connection):
            for _, data in self._connection.frames():
                self._tail += data
                del self._tail[: -self._TAIL_BYTES]
        try:
            self._code = self._exec.exit_code()
        except ENGINE_ERRORS:
            return  # the sandbox went away: nothing to tell

    def exit_code(self) -> int | None:
        return self._code

    def output_tail(self) -> str:
        return bytes(self._tail).decode("utf-8", errors="replace")


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
