"""Copies out of a sandbox, bounded: a tar stream read within a cap on the bytes that
arrive, on its entries and on wall time, and closed (the engine's connection with it)
whenever the reader stops.

What is *kept* of a copy has caps of its own, at each caller; these bound what is *read*.
The two differ: the engine expands a sparse file in full (16 GiB of zeros for a file
`truncate -s 16G` made), and skipping the part of a file that is not kept still reads it.
A cap reached is an answer (CopyCapped, a reason to record), never a hang.
"""

from __future__ import annotations

import contextlib
import fnmatch
import tarfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from pytest_harbor.sandboxes.archives import ChunkReader
from pytest_harbor.sandboxes.base import ArchiveStream, SandboxError

__all__ = [
    "AGENT_LOGS_COPY",
    "ARTIFACTS_COPY",
    "ARTIFACTS_KEPT_BYTES",
    "ARTIFACTS_RESULTS_COPY",
    "HARNESS_COPY",
    "LOG_FILE_COPY",
    "REWARD_FILE_COPY",
    "VERIFIER_FOLDER_COPY",
    "BoundedStream",
    "CopyCapped",
    "CopyLimits",
    "RepackedArtifact",
    "bounded",
    "excluded",
    "members",
]

#: How much of a member's data is passed on at a time.
_CHUNK = 64 * 1024
MiB = 1024 * 1024
GiB = 1024 * MiB


@dataclass(frozen=True)
class CopyLimits:
    """The most a copy may read: bytes of the tar stream as they arrive, entries of it
    (None: any number), and seconds from its start."""

    read_bytes: int
    seconds: float
    entries: int | None = None


#: /logs/verifier to the results folder: above what is kept of it (256 MiB in 20,000
#: files), with room for the headers and for files cut at their own cap.
VERIFIER_FOLDER_COPY = CopyLimits(read_bytes=320 * MiB, seconds=60.0, entries=100_000)
#: Each reward file on its own, before the folder: a valid one is far below 64 KiB.
REWARD_FILE_COPY = CopyLimits(read_bytes=1 * MiB, seconds=10.0, entries=2)
#: Artifacts from the agent's sandbox into a separate verifier's (kept: 1 GiB).
ARTIFACTS_COPY = CopyLimits(read_bytes=4 * GiB, seconds=600.0, entries=100_000)
#: A turn's artifacts to the results folder (kept: 1 GiB in 20,000 files).
ARTIFACTS_RESULTS_COPY = CopyLimits(read_bytes=1280 * MiB, seconds=120.0, entries=100_000)
#: The files of /logs/agent a CLI agent's converter reads.
AGENT_LOGS_COPY = CopyLimits(read_bytes=320 * MiB, seconds=60.0, entries=100_000)
#: One log file (the oracle's): 8 MiB of it is kept.
LOG_FILE_COPY = CopyLimits(read_bytes=64 * MiB, seconds=10.0, entries=2)
#: What a harness reads through the engine's API (engine/harness_calls.py).
HARNESS_COPY = CopyLimits(read_bytes=1 * GiB, seconds=300.0, entries=100_000)


class CopyCapped(SandboxError):
    """A copy stopped at one of its limits; the message says which, for the record. A
    SandboxError, so that a reader that handles a broken stream handles this one too."""


class BoundedStream:
    """`source` within `limits`: past the bytes or the deadline it raises CopyCapped and
    closes the source. The deadline is kept by a timer too, which closes the source
    while a read waits (a sandbox that sends nothing more ends the read as well)."""

    def __init__(self, source: ArchiveStream, limits: CopyLimits, what: str) -> None:
        self._source = source
        self.limits = limits
        self.what = what
        self.read = 0
        self._deadline = time.monotonic() + limits.seconds
        self._expired = False
        self._closed = False
        self._timer = threading.Timer(limits.seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        if self._closed and not self._expired:
            raise StopIteration
        self._check_time()
        try:
            chunk = next(self._source)
        except StopIteration:
            if self._expired:
                self._check_time()  # the timer ended the read: cut, not complete
            self.close()
            raise
        except Exception:
            self._check_time()  # a read the timer ended
            self.close()
            raise
        self._check_time()
        self.read += len(chunk)
        if self.read > self.limits.read_bytes:
            self.close()
            raise CopyCapped(
                f"{self.what}: stopped after {_size(self.limits.read_bytes)} read "
                "(the cap on what a copy reads)"
            )
        return chunk

    def _check_time(self) -> None:
        if self._expired or time.monotonic() > self._deadline:
            self._expired = True
            self.close()
            raise CopyCapped(
                f"{self.what}: stopped after {self.limits.seconds:g} s "
                "(the cap on how long a copy reads)"
            )

    def _expire(self) -> None:
        self._expired = True
        self._close_source()

    def close(self) -> None:
        self._closed = True
        self._timer.cancel()
        self._close_source()

    def _close_source(self) -> None:
        # A generator being read by another thread cannot be closed from this one
        # (ValueError); the per-chunk check ends it at its next chunk instead.
        with contextlib.suppress(Exception):
            self._source.close()

    def __enter__(self) -> BoundedStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def bounded(source: ArchiveStream, limits: CopyLimits, what: str) -> BoundedStream:
    """`source` read within `limits`; `what` names the copy in a CopyCapped message."""
    return BoundedStream(source, limits, what)


def members(stream: BoundedStream) -> Iterator[tuple[tarfile.TarFile, tarfile.TarInfo]]:
    """The entries of the tar `stream`, with the archive to extract them from, one by one
    as they arrive; past the stream's entry cap, CopyCapped. The stream is closed when
    the caller stops (at the end, at a cap, or by leaving the loop)."""
    try:
        with tarfile.open(fileobj=ChunkReader(stream), mode="r|") as archive:
            for count, member in enumerate(archive, start=1):
                cap = stream.limits.entries
                if cap is not None and count > cap:
                    raise CopyCapped(
                        f"{stream.what}: stopped after {cap} entries "
                        "(the cap on how many a copy reads)"
                    )
                yield archive, member
    finally:
        stream.close()


def _size(count: int) -> str:
    if count >= GiB and count % GiB == 0:
        return f"{count // GiB} GiB"
    if count >= MiB and count % MiB == 0:
        return f"{count // MiB} MiB"
    return f"{count} bytes"


#: Of the artifacts a separate verifier gets, at most this much file content is kept.
ARTIFACTS_KEPT_BYTES = 1 * GiB
#: The permission bits an artifact keeps: set-uid, set-gid and sticky go.
_PERMISSIONS = 0o777
_KEPT_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE)


class RepackedArtifact:
    """The tar `stream` of an artifact, re-packed member by member for another sandbox,
    as it is read (nothing held whole). What comes out cannot give the process that runs
    it more than its caller has: every member is owned by root (uid and gid 0) with its
    set-uid, set-gid and sticky bits cleared, and carries no extended header (the
    `security.capability` attribute, where file capabilities live, other attributes, ACLs
    and SELinux labels all go). Devices, FIFOs and sockets are left out; a symbolic link
    is kept only when it points inside the artifact (relative, never above its top), a
    hard link only to a member already passed on. Members matching an `exclude` pattern
    (tar --exclude style: a pattern matches a member's path or any of its components, and
    what lies below) are left out. Past `kept_cap` bytes of content, or the stream's own
    caps, CopyCapped. `kept` says how much content it passed on."""

    def __init__(
        self,
        stream: BoundedStream,
        exclude: Iterable[str] = (),
        kept_cap: int = ARTIFACTS_KEPT_BYTES,
    ) -> None:
        self._stream = stream
        self._patterns = tuple(exclude)
        self._kept_cap = kept_cap
        self.kept = 0

    def __iter__(self) -> Iterator[bytes]:
        passed: set[str] = set()
        for archive, member in members(self._stream):
            if member.type not in _KEPT_TYPES or excluded(member.name, self._patterns):
                continue
            if member.issym() and not _inside(member.name, member.linkname):
                continue
            if member.islnk() and member.linkname not in passed:
                continue
            if member.isreg():
                self.kept += member.size
                if self.kept > self._kept_cap:
                    raise CopyCapped(
                        f"{self._stream.what}: more than {_size(self._kept_cap)} of files "
                        "(the cap on what a copy keeps)"
                    )
            passed.add(member.name)
            member.uid = member.gid = 0
            member.uname = member.gname = "root"
            member.mode &= _PERMISSIONS
            member.pax_headers = {}
            yield member.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
            if member.isreg():
                yield from _content(archive, member)
        yield b"\0" * (2 * tarfile.BLOCKSIZE)


def _content(archive: tarfile.TarFile, member: tarfile.TarInfo) -> Iterator[bytes]:
    data = archive.extractfile(member)
    left = member.size
    while data is not None and left > 0:
        chunk = data.read(min(_CHUNK, left))
        if not chunk:
            raise tarfile.ReadError(f"{member.name}: the stream ended inside it")
        left -= len(chunk)
        yield chunk
    yield b"\0" * (-member.size % tarfile.BLOCKSIZE)


def excluded(name: str, patterns: tuple[str, ...]) -> bool:
    """Whether the path `name` is left out by an `exclude` pattern (tar --exclude style:
    one matching the path, or any of its components or leading folders)."""
    parts = name.split("/")
    prefixes = ["/".join(parts[:end]) for end in range(1, len(parts) + 1)]
    return any(
        fnmatch.fnmatch(candidate, pattern)
        for pattern in patterns
        for candidate in (*parts, *prefixes)
    )


def _inside(name: str, target: str) -> bool:
    """Whether a symbolic link `name` to `target` stays within the artifact: a link below
    its top entry (which resolves from the folder it is in) to a relative path that never
    goes up. A lexical check of `..` is not enough, since links chain (`d -> .` and
    `x -> d/d/../../secret` read as inside, and resolve above the folder); with no `..`
    in any link, every resolution only goes down from a folder of the artifact."""
    return (
        "/" in name.strip("/")
        and bool(target)
        and not target.startswith("/")
        and ".." not in target.split("/")
    )
