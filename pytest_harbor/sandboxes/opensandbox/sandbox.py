"""One OpenSandbox sandbox, driven through its lifecycle server and its execd.

Every command goes through the engine's trusted busybox, which execd starts as the
command's user: the busybox relays the command's stdout and stderr in base64 (execd's
events carry text line by line, so raw bytes would not survive them) and ends with a
status line, so that what comes back is byte-exact and the exit status is the command's
own. Files go in and out as tar archives that the trusted busybox packs or unpacks, as
root, in a folder no one else may read, moved through execd's file API."""

from __future__ import annotations

import base64
import io
import secrets
import shlex
import tarfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from pytest_harbor.display import harbor_logger
from pytest_harbor.sandboxes.archives import pack_files, pack_folder, unpack_files
from pytest_harbor.sandboxes.base import (
    SEALED_BUSYBOX,
    TRUSTED_BUSYBOX,
    EngineUnreachable,
    ExecResult,
    SandboxError,
    SandboxStatus,
)
from pytest_harbor.sandboxes.copies import ARTIFACTS_COPY, HARNESS_COPY, CopyCapped, bounded
from pytest_harbor.sandboxes.opensandbox.api import ApiError, Lifecycle
from pytest_harbor.sandboxes.opensandbox.commands import (
    SETTING,
    SPAWN,
    CommandOutput,
    command_line,
    copy_lines,
)
from pytest_harbor.sandboxes.opensandbox.egress import EgressPolicy, policy_of
from pytest_harbor.sandboxes.opensandbox.execd import CommandEnd, DownloadStream, Execd
from pytest_harbor.sandboxes.opensandbox.terminal import Joining, TerminalPipe, open_joined
from pytest_harbor.sandboxes.opensandbox.users import Users, UserSpec, Who, parse_user

__all__ = ["INPUT_FOLDER", "IO_FOLDER", "KEPT_FOLDER", "OpenSandboxSandbox"]

log = harbor_logger()

#: Where the engine keeps the archives it moves: root's alone (0700).
IO_FOLDER = "/.pytest-harbor-io"
#: Where a command's stdin waits for it under a name of 128 random bits: a folder no one
#: else may list (0711), the file readable by the command's user.
INPUT_FOLDER = "/.pytest-harbor-in"
#: Where each command keeps a copy of what it sends (its relays' lines), read when its
#: stream fails: a folder anyone may write in but no one list, sticky (1733); each
#: command's files are its user's alone (0600), under names of 128 random bits.
KEPT_FOLDER = "/.pytest-harbor-out"


#: What travels with a command rather than by a request of its own, in base64 in its
#: environment: a stdin or an archive to unpack up to this size each (a variable may
#: hold 128 KiB), and up to _INLINE_TOTAL of archives at once.
_INLINE = 64 * 1024
_INLINE_TOTAL = 512 * 1024


class OpenSandboxSandbox:
    """A sandbox of an OpenSandbox server. `user` is who a command runs as when it
    names no one (the image's USER; empty: root)."""

    def __init__(
        self,
        sandbox_id: str,
        lifecycle: Lifecycle,
        execd: Execd,
        *,
        user: str = "",
        workdir: str = "",
        env: Mapping[str, str] | None = None,
        online: bool = True,
        egress: EgressPolicy | None = None,
    ) -> None:
        self._id = sandbox_id
        self._lifecycle = lifecycle
        self._execd = execd
        self._user = user
        #: Where a command that names no folder runs (the spec's, else execd's own: the
        #: image's WORKDIR).
        self._workdir = workdir
        self._env_has_home = "HOME" in (env or {})
        self._online = online
        #: Its egress sidecar, when the server holds its policy (phases' networks).
        self._egress = egress
        self._users = Users(self._read_file)
        self._stopped = False
        self._lock = threading.Lock()
        #: What runs the wrappers: the trusted busybox until the provider made the sealed
        #: copy (`sealed()`), then that.
        self._shell = TRUSTED_BUSYBOX
        #: The engine's files to remove, and archives to unpack (lines of a script), at
        #: the next command as root.
        self._done_with: list[str] = []
        self._unpacks: list[str] = []
        #: Archives that travel with the next command as root (variable -> base64).
        self._puts: dict[str, str] = {}
        #: Each user's copies of what its commands sent (KEPT_FOLDER), removed by its
        #: next command, or by the next as root.
        self._kept: dict[int, list[str]] = {}
        #: What the spec's start script printed (provider.py), None when none ran.
        self.started_with: str | None = None

    @property
    def id(self) -> str:
        return self._id

    def start_output(self) -> str | None:
        return self.started_with

    def sealed(self) -> None:
        """The sealed busybox is there: wrappers run from it from now on."""
        self._shell = SEALED_BUSYBOX

    def _failed(self, error: ApiError, doing: str) -> SandboxError:
        failure = EngineUnreachable if error.unreachable else SandboxError
        return failure(f"sandbox {self._id}: {doing} failed: {error}")

    # ------------------------------------------------------------------------ commands

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
        return self._exec(
            command, user=user, workdir=workdir, env=env, timeout=timeout, stdin=stdin
        )

    def _who(self, user: str | None) -> tuple[Who | None, UserSpec]:
        """The numbers a command as `user` (the sandbox's user when None) runs with, None
        when a name is not in the sandbox's files; and the user as parsed."""
        spec = parse_user(user or self._user or "0:0")
        try:
            return self._users.resolve(spec), spec
        except ApiError as error:
            raise self._failed(error, "reading its users") from None

    def _exec(
        self,
        command: Sequence[str],
        *,
        user: str | None = None,
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
        recover: bool = True,
    ) -> ExecResult:
        """exec(); without `recover`, a stream that fails is an ApiError at once (the
        reading back of a command's copy does not read back its own)."""
        who, spec = self._who(user)
        if who is None:
            message = f"unable to find user {spec.name}: no matching entries in passwd file\n"
            return ExecResult(exit_code=126, stderr_bytes=message.encode())
        pre, drop, puts = self._pending_work(who.uid)
        mark = secrets.token_hex(16)
        # The copies are kept once the folder for them is there (the start's own command
        # runs before it is made).
        sealed = self._shell == SEALED_BUSYBOX
        keep = f"{KEPT_FOLDER}/{secrets.token_hex(16)}" if sealed and recover else ""
        settings = {
            "SHELL": self._shell,
            "NONCE": mark,
            "DIR": workdir or self._workdir,
            "HOME": self._home_for(who, env),
            "INPUT": "",
            "PRE": pre,
            "KEEP": keep,
            "DROP": drop,
            "PUTS": " ".join(puts),
        }
        outcome = CommandOutput(mark)
        started = time.monotonic()
        try:
            if stdin is not None and len(stdin) <= _INLINE:
                settings["INDATA"] = base64.b64encode(stdin).decode()
            elif stdin is not None:
                settings["INPUT"] = self._put_input(stdin, as_root=who.uid == 0)
            started = time.monotonic()
            end = self._execd.run(
                command_line(list(command), shell=self._shell),
                outcome.take,
                uid=who.uid,
                gid=who.gid,
                envs={
                    **(env or {}),
                    **puts,
                    **{SETTING + key: value for key, value in settings.items()},
                    # execd's own token is in the sandbox's environment: never in a
                    # command's, from its first process on.
                    "EXECD_ACCESS_TOKEN": "",
                },
                timeout_s=timeout,
            )
            if end.broken:
                outcome, end = self._recovered(end, mark, keep, started, timeout, who)
        except ApiError as error:
            raise self._failed(error, "exec") from None
        finally:
            self._done_after(who.uid, settings.get("INPUT", ""), keep)
        if outcome.pre_failed:
            said = outcome.stderr.output.value().decode("utf-8", "replace").strip()[-300:]
            raise SandboxError(f"sandbox {self._id}: writing into the sandbox failed: {said}")
        timed_out = (
            timeout is not None and end.signalled and time.monotonic() - started >= timeout * 0.95
        )
        return outcome.result(end, timed_out)

    def _home_for(self, who: Who, env: Mapping[str, str] | None) -> str:
        """The HOME a command gets (empty: the one it has), as Docker sets it."""
        return "" if self._env_has_home or "HOME" in (env or {}) else who.home

    def _put_input(self, stdin: bytes, *, as_root: bool) -> str:
        """Where a command's stdin waits for it: root's where only root may go; anyone
        else's under a name only that user's processes can learn (it travels in the
        environment)."""
        folder = IO_FOLDER if as_root else INPUT_FOLDER
        path = f"{folder}/in-{secrets.token_hex(16)}"
        self._execd.upload({path: (stdin, 0o600 if as_root else 0o644)})
        return path

    def _done_after(self, uid: int, input_path: str, keep: str) -> None:
        """A command's stdin and its copies, to remove later."""
        if input_path:
            self._finished_with(input_path)
        if keep:
            with self._lock:
                self._kept.setdefault(uid, []).extend((f"{keep}.1", f"{keep}.2"))

    def _recovered(
        self,
        end: CommandEnd,
        mark: str,
        keep: str,
        started: float,
        timeout: float | None,
        who: Who,
    ) -> tuple[CommandOutput, CommandEnd]:
        """A command whose stream failed, followed to its end by asking execd, and what
        it sent read again whole from its copies. An ApiError when its end cannot be
        known (the command is never run again)."""
        if not keep:
            raise ApiError(f"running a command: {end.broken}")
        log.info(
            "sandbox %s: command %s: %s; asking execd how it ends",
            self._id,
            end.command_id,
            end.broken,
        )
        ended = self._execd.wait(end.command_id, None if timeout is None else started + timeout)
        outcome = CommandOutput(mark)
        for kind, copy in (("stdout", f"{keep}.1"), ("stderr", f"{keep}.2")):
            lines = self._copy(copy, who)
            if lines is None:
                outcome.note = "its output could not be read back after its stream failed"
                break
            if not all(outcome.take(kind, line) for line in lines):
                break
        return outcome, ended

    def _copy(self, path: str, who: Who) -> Iterable[str] | None:
        """The lines of a command's copy. Root's are read by execd: no one else may
        touch them. Another user's copy is that user's to change (to a link, say), so it
        is read as that user, and only what that user may read comes back; None when it
        cannot be read so."""
        if who.uid == 0:
            stream = self._execd.download(path)
            if stream is None:
                return ()
            try:
                return list(copy_lines(stream))
            finally:
                stream.close()
        read = self._exec(
            [TRUSTED_BUSYBOX, "cat", "--", path], user=f"{who.uid}:{who.gid}", recover=False
        )
        if read.exit_code != 0:
            return None
        return read.stdout_bytes.decode("ascii", "replace").splitlines()

    def _pending_work(self, uid: int) -> tuple[str, str, dict[str, str]]:
        """The engine's work to fold into a command of `uid`, taken: for root, a script
        (archives to unpack, files to remove) and the archives that travel with it; for
        anyone, that user's copies to drop. For a command as anyone else, the archives
        are unpacked first by a command of their own (what a command runs with must be
        there)."""
        with self._lock:
            if uid != 0:
                unpacks = bool(self._unpacks)
                drop = " ".join(self._kept.pop(uid, []))
            else:
                kept = [path for paths in self._kept.values() for path in paths]
                work = [
                    *self._unpacks,
                    *(f"$B rm -rf -- {shlex.quote(path)}" for path in self._done_with),
                ]
                puts = self._puts
                self._unpacks, self._done_with, self._kept, self._puts = [], [], {}, {}
                script = f"B={TRUSTED_BUSYBOX}\nset -e\n" + "\n".join(work) if work else ""
                return script, " ".join(kept), puts
        if unpacks:
            self._root("")
        return "", drop, {}

    def _root(self, script: str, *args: str, timeout: float = 120.0) -> ExecResult:
        """`script` for the trusted shell (which it finds as $B), as root; the engine's
        pending work goes first (one request less for each)."""
        return self.exec(
            [TRUSTED_BUSYBOX, "sh", "-c", f"B={TRUSTED_BUSYBOX}\n{script}", "sh", *args],
            user="0:0",
            timeout=timeout,
        )

    def _finished_with(self, path: str) -> None:
        """`path` (the engine's, in its own folders) goes at the next command as root."""
        with self._lock:
            self._done_with.append(path)

    def spawn(
        self, command: Sequence[str], *, user: str | None = None, workdir: str | None = None
    ) -> _Spawned:
        spec = parse_user(user or self._user or "0:0")
        self._pending_work(-1)
        try:
            who = self._users.resolve(spec)
            line = command_line([workdir or self._workdir, *command], SPAWN, self._shell)
            command_id = self._execd.spawn(
                line,
                uid=None if who is None else who.uid,
                gid=None if who is None else who.gid,
                envs={"EXECD_ACCESS_TOKEN": ""},
            )
        except ApiError as error:
            raise self._failed(error, "starting a command") from None
        return _Spawned(self._execd, command_id)

    def open_pipe(
        self,
        command: Sequence[str],
        *,
        user: str | None = None,
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> TerminalPipe:
        who, spec = self._who(user)
        if who is None:
            raise SandboxError(f"sandbox {self._id}: unable to find user {spec.name}")
        home = self._home_for(who, env)
        joining = Joining(self._execd, self._root, self._finished_with, INPUT_FOLDER, self._id)
        envs = {**(env or {}), **({"HOME": home} if home else {}), "EXECD_ACCESS_TOKEN": ""}
        return open_joined(
            joining, command, uid=who.uid, gid=who.gid, workdir=workdir or self._workdir, envs=envs
        )

    # --------------------------------------------------------------------------- files

    def _read_file(self, path: str) -> bytes | None:
        """A small file of the sandbox, read by execd (root), or None."""
        stream = self._execd.download(path)
        if stream is None:
            return None
        try:
            return b"".join(stream)
        finally:
            stream.close()

    def upload(self, source: Path | Mapping[str, bytes], target: str) -> None:
        data = pack_folder(source) if isinstance(source, Path) else pack_files(source)
        self.write_archive(data, target)

    def write_archive(self, data: bytes | Iterable[bytes], into: str) -> None:
        """The archive is unpacked, as root, at the start of the next command (a command
        of its own when that one is not root's): a failure to unpack is a SandboxError
        there. A small one travels with that command; a larger one is uploaded now."""
        body = data if isinstance(data, bytes) else b"".join(data)
        failed = f"|| {{ echo {shlex.quote(f'cannot unpack into {into}')} >&2; exit 1; }}"
        with self._lock:
            inline = len(body) <= _INLINE and (
                sum(len(value) for value in self._puts.values()) * 3 // 4 + len(body)
                <= _INLINE_TOTAL
            )
            if inline:
                name = f"{SETTING}PUT{len(self._puts)}"
                self._puts[name] = base64.b64encode(body).decode()
                self._unpacks.append(
                    f'printf %s "${name}" | $B base64 -d | $B tar -x -f - '
                    f"-C {shlex.quote(into)} {failed}"
                )
                return
        archive = f"{IO_FOLDER}/put-{secrets.token_hex(16)}.tar"
        try:
            self._execd.upload({archive: (body, 0o600)})
        except ApiError as error:
            raise self._failed(error, f"writing into {into}") from None
        with self._lock:
            self._unpacks.append(
                f"$B tar -x -f {shlex.quote(archive)} -C {shlex.quote(into)} {failed}"
            )
            self._done_with.append(archive)

    def iter_archive(self, source: str) -> _ArchiveDownload | None:
        """SOURCE as an archive: a small one in the packing command's output, a larger
        one downloaded."""
        archive = f"{IO_FOLDER}/get-{secrets.token_hex(16)}.tar"
        packed = self._root(_PACK, source, archive)
        if packed.exit_code == _ABSENT:
            return None
        if packed.exit_code != 0:
            self._finished_with(archive)
            raise SandboxError(
                f"sandbox {self._id}: reading {source} failed: {packed.stderr.strip()[-300:]}"
            )
        if packed.stdout_bytes:
            return _ArchiveDownload(iter((packed.stdout_bytes,)), None)
        try:
            stream = self._execd.download(archive)
        except ApiError as error:
            raise self._failed(error, f"reading {source}") from None
        if stream is None:
            raise SandboxError(f"sandbox {self._id}: the archive of {source} went missing")
        return _ArchiveDownload(stream, lambda: self._finished_with(archive))

    def read_archive(self, source: str) -> bytes | None:
        chunks = self.iter_archive(source)
        if chunks is None:
            return None
        try:
            with bounded(chunks, HARNESS_COPY, f"reading {source}") as stream:
                return b"".join(stream)
        except CopyCapped as error:
            raise SandboxError(str(error)) from None

    def download(self, source: str) -> dict[str, bytes]:
        data = self.read_archive(source)
        if data is None:
            return {}
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            first = archive.next()
        folder = first is not None and first.isdir()
        return unpack_files(data, strip_components=1 if folder else 0)

    # ------------------------------------------------------------------------- the rest

    def set_network(self, enabled: bool) -> None:
        self.set_egress(enabled, None)

    def set_egress(
        self, enabled: bool, hosts: tuple[str, ...] | None, relay: str | None = None
    ) -> None:
        """The phase's network, as the sandbox's egress policy (FiltersEgress)."""
        if relay is not None:
            raise SandboxError(
                f"sandbox {self._id}: the opensandbox provider's sandboxes cannot reach the "
                "model relay on this machine"
            )
        if self._egress is None:
            if enabled == self._online and hosts is None:
                return
            raise SandboxError(
                f"sandbox {self._id}: its network can be taken away, given back or held to "
                "an allow-list only where the server holds egress policies "
                "(sandbox_provider_options.network_policy)"
            )
        try:
            self._egress.apply(policy_of(enabled, hosts))
        except ApiError as error:
            raise self._failed(error, "setting its network") from None
        self._online = enabled

    def snapshot(self, labels: Mapping[str, str]) -> str:
        raise SandboxError("the opensandbox provider takes no snapshots")

    def status(self) -> SandboxStatus:
        try:
            record = self._lifecycle.get(self._id)
        except ApiError as error:
            raise SandboxError(
                f"sandbox {self._id}: the server does not say how it is: {error}"
            ) from None
        if record is None:
            return SandboxStatus(present=False)
        return SandboxStatus(present=True, running=record.state in ("Running", "Pending"))

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        try:
            self._lifecycle.delete(self._id)
        except ApiError as error:
            raise SandboxError(f"sandbox {self._id}: removal failed: {error}") from None
        finally:
            self._execd.close()
            if self._egress is not None:
                self._egress.close()


#: The exit status of _PACK when the source is not there.
_ABSENT = 3
#: The most of an archive written in the sandbox before it is read: one byte past the
#: largest copy the engine reads (artifacts), so that a reader at any cap sees it cut,
#: and a sparse file of terabytes cannot fill the sandbox's disk.
_ARCHIVE_CAP = ARTIFACTS_COPY.read_bytes + 1
#: Archives up to this size come back as _PACK's output.
_INLINE_READ = 1024 * 1024
#: `_PACK SOURCE ARCHIVE` (as root): SOURCE as a tar whose top entry is its base name,
#: links kept as links, written to ARCHIVE (at most _ARCHIVE_CAP bytes), or to stdout
#: when it is small; exits _ABSENT when SOURCE is not there.
_PACK = f"""B={TRUSTED_BUSYBOX}
[ -e "$1" ] || [ -L "$1" ] || exit {_ABSENT}
case $1 in /) dir=/ base=. ;; */*) dir=${{1%/*}} base=${{1##*/}} ;; *) dir=. base=$1 ;; esac
set -o pipefail
"$B" tar -c -f - -C "${{dir:-/}}" "$base" | "$B" head -c {_ARCHIVE_CAP} > "$2"
status=$? size=$("$B" stat -c %s "$2")
# Cut at the cap (tar then stops on a closed pipe): what was written is read, and cut.
[ "$status" = 0 ] || [ "$size" = {_ARCHIVE_CAP} ] || exit 1
# A small archive comes back as the command's output (no download to make).
[ "$size" -gt {_INLINE_READ} ] || {{ "$B" cat -- "$2" && "$B" rm -f -- "$2"; }}
"""


class _ArchiveDownload:
    """An archive's bytes as they come from execd; closing it ends the transfer and
    removes the archive from the sandbox."""

    def __init__(self, stream: DownloadStream | Iterator[bytes], cleanup: object) -> None:
        self._stream = stream
        self._cleanup = cleanup
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        try:
            return next(self._stream)
        except ApiError as error:
            failure = EngineUnreachable if error.unreachable else SandboxError
            raise failure(str(error)) from None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if isinstance(self._stream, DownloadStream):
            self._stream.close()
        if callable(self._cleanup):
            self._cleanup()


class _Spawned:
    """A command execd runs in the background; its exit code as execd tells it."""

    _TAIL_BYTES = 4096

    def __init__(self, execd: Execd, command_id: str) -> None:
        self._execd = execd
        self._id = command_id
        self._code: int | None = None

    def exit_code(self) -> int | None:
        if self._code is None:
            found = self._execd.status(self._id)
            if found is not None and not found[0] and found[1] is not None:
                self._code = found[1]
        return self._code

    def output_tail(self) -> str:
        return self._execd.output(self._id, self._TAIL_BYTES)
