"""Tar streams and the content hash that names built images."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

from pytest_harbor.sandboxes.archives import (
    pack_directories,
    pack_files,
    pack_folders,
    unpack_files,
)
from pytest_harbor.sandboxes.images import context_hash, image_tag_for


def test_folders_layer_later_wins_and_owner_is_root(tmp_path: Path) -> None:
    shared, step = tmp_path / "shared", tmp_path / "step"
    (shared / "sub").mkdir(parents=True)
    step.mkdir()
    (shared / "test.sh").write_text("shared")
    (shared / "sub" / "helper.py").write_text("helper")
    (step / "test.sh").write_text("step")
    os.chmod(shared / "sub" / "helper.py", 0o755)
    data = pack_folders([shared, step])
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        members = archive.getmembers()
        assert {m.uid for m in members} == {0}
        assert archive.getmember("sub/helper.py").mode & 0o111
    files = unpack_files(data, strip_components=0)
    assert files == {"test.sh": b"step", "sub/helper.py": b"helper"}


def test_pack_files_and_directories() -> None:
    assert unpack_files(pack_files({"a/b.txt": b"x"}), strip_components=0) == {"a/b.txt": b"x"}
    with tarfile.open(fileobj=io.BytesIO(pack_directories({"/logs/agent": 0o777}))) as archive:
        (member,) = archive.getmembers()
        assert (member.name, member.isdir(), member.mode) == ("logs/agent", True, 0o777)


def test_unpack_strips_the_leading_folder_and_refuses_escapes() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name in ("./reward.txt", "./../escape.txt"):
            info = tarfile.TarInfo(name)
            info.size = 1
            archive.addfile(info, io.BytesIO(b"1"))
    assert unpack_files(buffer.getvalue()) == {"reward.txt": b"1"}


def test_context_hash_follows_content_mode_and_names_only(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM debian\n")
    (tmp_path / "run.sh").write_text("echo hi\n")
    first = context_hash(tmp_path)
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "x.pyc").write_bytes(b"junk")
    (tmp_path / "notes.txt~").write_text("backup")
    assert context_hash(tmp_path) == first
    os.chmod(tmp_path / "run.sh", 0o755)
    executable = context_hash(tmp_path)
    assert executable != first
    (tmp_path / "run.sh").write_text("echo bye\n")
    changed = context_hash(tmp_path)
    assert changed not in (first, executable)
    assert image_tag_for(tmp_path) == f"hb__{changed[:32]}"


def test_context_hash_tells_apart_what_a_build_tells_apart(tmp_path: Path) -> None:
    """An empty folder, a permission bit beyond the executable one, a symlink in place of
    a copy: each changes what `COPY . /app` makes, so each changes the hash (a context
    differing only so got the other's image before). A FIFO is not opened."""
    (tmp_path / "Dockerfile").write_text("FROM debian\nCOPY . /app\n")
    (tmp_path / "data.txt").write_text("1\n")
    seen = {context_hash(tmp_path)}
    (tmp_path / "output").mkdir()
    seen.add(context_hash(tmp_path))
    os.chmod(tmp_path / "data.txt", 0o600)
    seen.add(context_hash(tmp_path))
    (tmp_path / "copy.txt").write_text("1\n")
    seen.add(context_hash(tmp_path))
    (tmp_path / "copy.txt").unlink()
    (tmp_path / "copy.txt").symlink_to("data.txt")
    seen.add(context_hash(tmp_path))
    os.mkfifo(tmp_path / "pipe")
    seen.add(context_hash(tmp_path))
    assert len(seen) == 6
