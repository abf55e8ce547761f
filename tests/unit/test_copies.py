"""Bounded copies (pytest_harbor/sandboxes/copies.py): caps on bytes read, entries and
time, the source closed whenever the reader stops, and artifacts re-packed so that no
set-id bit, owner, file capability, device or link out reaches another sandbox."""

from __future__ import annotations

import io
import tarfile
import threading
import time
from collections.abc import Iterator

import pytest

from pytest_harbor.sandboxes.copies import (
    BoundedStream,
    CopyCapped,
    CopyLimits,
    RepackedArtifact,
    bounded,
    members,
)


class Source:
    """An ArchiveStream over `data` in chunks; a read after `stall_after` chunks waits
    until the stream is closed. Records whether it was closed."""

    def __init__(self, data: bytes, chunk: int = 1000, stall_after: int | None = None) -> None:
        self._chunks = [data[i : i + chunk] for i in range(0, len(data), chunk)]
        self._stall_after = stall_after
        self._given = 0
        self.closed = threading.Event()

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        if self._stall_after is not None and self._given >= self._stall_after:
            self.closed.wait(30)
            raise OSError("closed under the read")
        if self.closed.is_set() or self._given >= len(self._chunks):
            raise StopIteration
        self._given += 1
        return self._chunks[self._given - 1]

    def close(self) -> None:
        self.closed.set()


def tar(*members: tarfile.TarInfo, content: dict[str, bytes] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for member in members:
            data = (content or {}).get(member.name)
            if data is not None:
                member.size = len(data)
            archive.addfile(member, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def info(name: str, kind: bytes = tarfile.REGTYPE, **fields: object) -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.type = kind
    for key, value in fields.items():
        setattr(member, key, value)
    return member


LIMITS = CopyLimits(read_bytes=10_000, seconds=10.0, entries=5)


def test_the_bytes_read_are_capped_and_the_source_closed() -> None:
    source = Source(b"x" * 50_000)
    stream = bounded(source, LIMITS, "the folder")
    with pytest.raises(CopyCapped, match="the folder: stopped after 10000 bytes read"):
        b"".join(stream)
    assert source.closed.is_set()


def test_a_read_that_waits_ends_at_the_deadline() -> None:
    source = Source(b"x" * 5000, stall_after=2)
    stream = bounded(source, CopyLimits(read_bytes=10**9, seconds=0.5), "the log")
    started = time.monotonic()
    with pytest.raises(CopyCapped, match=r"stopped after 0\.5 s"):
        b"".join(stream)
    assert time.monotonic() - started < 5
    assert source.closed.is_set()


def test_entries_past_the_cap_stop_the_copy_and_leaving_early_closes_it() -> None:
    data = tar(*(info(f"top/f{i}") for i in range(10)), content={})
    source = Source(data)
    with pytest.raises(CopyCapped, match="after 5 entries"):
        list(members(bounded(source, LIMITS, "x")))
    assert source.closed.is_set()
    early = Source(data)
    for _ in members(bounded(early, LIMITS, "x")):
        break
    assert early.closed.is_set()


def test_a_complete_stream_is_read_whole() -> None:
    data = tar(info("top", tarfile.DIRTYPE), info("top/a"), content={"top/a": b"abc"})
    stream = bounded(Source(data), CopyLimits(read_bytes=len(data), seconds=5), "x")
    assert isinstance(stream, BoundedStream)
    assert b"".join(stream) == data


def repacked(
    data: bytes, exclude: tuple[str, ...] = (), kept_cap: int = 10**9
) -> dict[str, tarfile.TarInfo]:
    limits = CopyLimits(read_bytes=10**9, seconds=10.0, entries=1000)
    out = b"".join(RepackedArtifact(bounded(Source(data), limits, "artifacts"), exclude, kept_cap))
    with tarfile.open(fileobj=io.BytesIO(out)) as archive:
        return {member.name: member for member in archive}


def test_artifacts_lose_set_id_bits_owners_and_file_capabilities() -> None:
    capability = {"SCHILY.xattr.security.capability": "\x01\x00\x00\x02\x80"}
    data = tar(
        info("artifacts", tarfile.DIRTYPE, mode=0o1777, uid=1000),
        info(
            "artifacts/perl", mode=0o6755, uid=1000, gid=1000, uname="agent", pax_headers=capability
        ),
        content={"artifacts/perl": b"#!binary"},
    )
    members = repacked(data)
    perl = members["artifacts/perl"]
    assert (perl.mode, perl.uid, perl.gid, perl.uname) == (0o755, 0, 0, "root")
    assert not any("xattr" in key for key in perl.pax_headers)
    assert members["artifacts"].mode == 0o777


def test_devices_fifos_links_out_and_excluded_members_are_left_out() -> None:
    data = tar(
        info("a", tarfile.DIRTYPE),
        info("a/file"),
        info("a/fifo", tarfile.FIFOTYPE),
        info("a/disk", tarfile.BLKTYPE, devmajor=8, devminor=0),
        info("a/tty", tarfile.CHRTYPE, devmajor=5, devminor=0),
        info("a/out", tarfile.SYMTYPE, linkname="/etc/shadow"),
        info("a/up", tarfile.SYMTYPE, linkname="../../etc/shadow"),
        info("a/in", tarfile.SYMTYPE, linkname="file"),
        info("a/hard", tarfile.LNKTYPE, linkname="a/file"),
        info("a/hard-out", tarfile.LNKTYPE, linkname="etc/shadow"),
        info("a/skip.log"),
        content={"a/file": b"1", "a/skip.log": b"s"},
    )
    assert set(repacked(data, exclude=("*.log",))) == {"a", "a/file", "a/in", "a/hard"}


def test_links_that_chain_out_of_the_artifact_are_left_out() -> None:
    """`d -> .` makes `d/d/../../x` read as inside while it resolves above the folder:
    no link with `..` is kept, and no top entry that is itself a link."""
    data = tar(
        info("a", tarfile.DIRTYPE),
        info("a/d", tarfile.SYMTYPE, linkname="."),
        info("a/answer.txt", tarfile.SYMTYPE, linkname="d/d/../../tests/expected.txt"),
        info("a/sub", tarfile.DIRTYPE),
        info("a/sub/up", tarfile.SYMTYPE, linkname="../d"),
        info("a/sub/down", tarfile.SYMTYPE, linkname="./deeper/file"),
        info("top", tarfile.SYMTYPE, linkname="."),
    )
    assert set(repacked(data)) == {"a", "a/d", "a/sub", "a/sub/down"}


def test_artifacts_over_the_kept_cap_stop_the_copy() -> None:
    data = tar(info("a/one"), info("a/two"), content={"a/one": b"x" * 600, "a/two": b"y" * 600})
    with pytest.raises(CopyCapped, match="more than 1000 bytes of files"):
        repacked(data, kept_cap=1000)
