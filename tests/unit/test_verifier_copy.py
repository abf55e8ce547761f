"""The copy of /logs/verifier out of a sandbox, fed archives no well-behaved verifier
would leave: nothing in them can fail the copy, and the reward is still read."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_harbor.engine import verification
from pytest_harbor.engine.verification import copy_verifier_folder
from pytest_harbor.redaction import Redactor
from pytest_harbor.sandboxes.base import SandboxError


def archive(*members: tuple[str, bytes | str | None]) -> bytes:
    """A tar stream as the engine gives one for /logs/verifier: `verifier/...` members;
    bytes for a file, a str for a symbolic link to it, None for a folder."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, content in members:
            info = tarfile.TarInfo(f"verifier/{name}" if name else "verifier")
            if content is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif isinstance(content, str):
                info.type, info.linkname = tarfile.SYMTYPE, content
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def alone(folder: bytes | None, name: str) -> bytes | None:
    """One file of a folder's archive as the engine gives it read on its own: named by its
    base name. None when the folder does not hold it."""
    if folder is None:
        return None
    buffer = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(folder)) as source,
        tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for member in source:
            if member.name == f"verifier/{name}":
                member.name = name
                tar.addfile(member, source.extractfile(member) if member.isreg() else None)
                return buffer.getvalue() + b"\0" * 1024
    return None


class FakeSandbox:
    """Answers iter_archive with the archives given, by path."""

    id = "fake"

    def __init__(self, archives: dict[str, bytes], broken_after: int | None = None) -> None:
        self.archives = archives
        self.broken_after = broken_after
        self.asked: list[str] = []

    def iter_archive(self, source: str) -> Iterator[bytes] | None:
        self.asked.append(source)
        data = self.archives.get(source)
        if data is None and source.startswith("/logs/verifier/"):
            data = alone(self.archives.get("/logs/verifier"), source.rsplit("/", 1)[1])
        if data is None:
            return None
        return self._chunks(
            data
            if self.broken_after is None or source != "/logs/verifier"
            else data[: self.broken_after]
        )

    def _chunks(self, data: bytes) -> Iterator[bytes]:
        for start in range(0, len(data), 1000):
            yield data[start : start + 1000]
        if self.broken_after is not None:
            raise SandboxError("the stream broke off")


def copy(tmp_path: Path, sandbox: FakeSandbox) -> verification._Copied:
    return copy_verifier_folder(sandbox, tmp_path / "out", Redactor(["s3cr3t-value-x"]))  # type: ignore[arg-type]


def test_names_this_machine_cannot_hold_are_left_out_and_named(tmp_path: Path) -> None:
    deep = "/".join(["d" * 200] * 25)  # over 4096 bytes with the folder's own path
    sandbox = FakeSandbox(
        {
            "/logs/verifier": archive(
                ("", None),
                (f"{deep}/far.txt", b"far"),
                ("new\nline", b"1"),
                ("bad\udcffutf8", b"2"),
                ("-dash", b"3"),
                ("link", "/etc/shadow"),
                ("reward.txt", b"1\n"),
            )
        }
    )
    copied = copy(tmp_path, sandbox)
    assert copied.rewards == {"reward.txt": b"1\n"}
    assert any(name.startswith("dddd") and "not written here" in name for name in copied.cut)
    out = tmp_path / "out"
    assert (out / "new\nline").read_bytes() == b"1" and (out / "-dash").read_bytes() == b"3"
    assert not (out / "link").exists()
    assert all("\udcff" not in name for name in copied.cut)


def test_a_stream_that_breaks_off_ends_the_copy_and_the_reward_is_read_alone(
    tmp_path: Path,
) -> None:
    full = archive(("", None), ("big", b"x" * 50_000), ("reward.json", b'{"reward": 1}'))
    # The engine names a file read on its own by its base name.
    alone_archive = io.BytesIO()
    with tarfile.open(fileobj=alone_archive, mode="w") as tar:
        info = tarfile.TarInfo("reward.json")
        info.size = len(b'{"reward": 1}')
        tar.addfile(info, io.BytesIO(b'{"reward": 1}'))
    sandbox = FakeSandbox(
        {"/logs/verifier": full, "/logs/verifier/reward.json": alone_archive.getvalue()},
        broken_after=20_000,
    )
    copied = copy(tmp_path, sandbox)
    assert copied.rewards == {"reward.json": b'{"reward": 1}'}
    assert any("broke off" in name for name in copied.cut)
    assert "/logs/verifier/reward.json" in sandbox.asked


def test_past_the_named_cap_the_copy_stops_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(verification, "FILE_COUNT_CAP", 5)
    monkeypatch.setattr(verification, "CUT_NAMES_CAP", 10)
    files = [(f"f{index}", b"x") for index in range(100)]
    sandbox = FakeSandbox({"/logs/verifier": archive(("", None), *files)})
    copied = copy(tmp_path, sandbox)
    assert len(copied.cut) == 11 and copied.cut[-1].startswith("(and ")
    assert len(list((tmp_path / "out").iterdir())) == 5


def test_a_folder_read_to_its_end_is_the_one_read(tmp_path: Path) -> None:
    """The reward files come with the folder when its copy reaches the end: no second
    read through the engine (each costs tens of milliseconds)."""
    sandbox = FakeSandbox(
        {
            "/logs/verifier": archive(
                ("", None), ("out.txt", b"log"), ("reward.json", b'{"reward": 0.5}')
            )
        }
    )
    copied = copy(tmp_path, sandbox)
    assert copied.rewards == {"reward.json": b'{"reward": 0.5}'} and copied.cut == []
    assert sandbox.asked == ["/logs/verifier"]
    assert (tmp_path / "out" / "reward.json").read_bytes() == b'{"reward": 0.5}'


def test_a_reward_file_the_copy_reached_before_a_cap_is_not_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(verification, "FILE_COUNT_CAP", 1)
    monkeypatch.setattr(verification, "CUT_NAMES_CAP", 2)
    files = [(f"f{index}", b"x") for index in range(10)]
    sandbox = FakeSandbox({"/logs/verifier": archive(("", None), ("reward.txt", b"1\n"), *files)})
    copied = copy(tmp_path, sandbox)
    assert copied.rewards == {"reward.txt": b"1\n"}
    assert sandbox.asked == ["/logs/verifier", "/logs/verifier/reward.json"]
