"""In-memory tar streams: one stream per upload, one per download."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

__all__ = [
    "ChunkReader",
    "pack_directories",
    "pack_files",
    "pack_folder",
    "pack_folders",
    "pack_tree",
    "unpack_files",
]


def _root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def pack_folder(folder: Path) -> bytes:
    """The contents of `folder` (not the folder itself), owned by root, modes kept."""
    return pack_folders([folder])


def pack_folders(folders: Iterable[Path]) -> bytes:
    """Several folders' contents layered into one stream: a later folder's file wins. A
    symlinked file goes in as its target's content (the loader keeps targets inside the
    task folder)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", dereference=True) as archive:
        for folder in folders:
            for entry in sorted(os.listdir(folder)):
                archive.add(folder / entry, arcname=entry, filter=_root_owned)
    return buffer.getvalue()


def pack_tree(folders: Mapping[str, Iterable[Path]], files: Mapping[str, bytes]) -> bytes:
    """One stream to unpack at `/`: each folder's contents under its prefix (later
    folders of a prefix win; a symlinked file as its target's content), then named files
    (relative paths), all owned by root."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", dereference=True) as archive:
        for prefix, sources in folders.items():
            for folder in sources:
                for entry in sorted(os.listdir(folder)):
                    archive.add(folder / entry, arcname=f"{prefix}/{entry}", filter=_root_owned)
        for name, data in sorted(files.items()):
            info = _root_owned(tarfile.TarInfo(name))
            info.size = len(data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def pack_files(files: Mapping[str, bytes], mode: int = 0o644) -> bytes:
    """Named files (relative paths) as a tar stream, owned by root."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in sorted(files.items()):
            info = _root_owned(tarfile.TarInfo(name))
            info.size = len(data)
            info.mode = mode
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def pack_directories(directories: Mapping[str, int]) -> bytes:
    """Empty directories (absolute path -> mode), owned by root, for extraction at `/`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path, mode in sorted(directories.items()):
            info = _root_owned(tarfile.TarInfo(path.strip("/")))
            info.type = tarfile.DIRTYPE
            info.mode = mode
            archive.addfile(info)
    return buffer.getvalue()


def unpack_files(data: bytes, strip_components: int = 1) -> dict[str, bytes]:
    """Regular files of a tar stream, keyed by path with the leading components removed."""
    files: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as archive:
        for member in archive:
            if not member.isreg():
                continue
            parts = member.name.split("/")[strip_components:]
            if not parts or any(part in ("", "..") for part in parts):
                continue
            extracted = archive.extractfile(member)
            if extracted is not None:
                files["/".join(parts)] = extracted.read()
    return files


class ChunkReader(io.RawIOBase):
    """A file object over chunks of bytes, read once, front to back."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._pending = chunk
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size
