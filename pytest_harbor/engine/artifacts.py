"""A turn's artifacts, copied out of its sandbox into the results folder once the turn is
verified, laid out as Harbor lays them out: `/logs/artifacts` at `logs/artifacts/`, each
declared artifact at its `destination`, else at its source path (a relative source is
read from the working directory), and a `manifest.json` of what each entry gave.

The copy is read through the engine's archive API as a stream, bounded in bytes read,
entries and seconds for the whole set, and written file by file with secrets masked in
content and names: nothing in the sandbox can fail the turn through it. Only regular files
and folders are kept; links, devices and FIFOs are named in the manifest and left out.
An entry whose place overlaps an earlier one's is skipped (the first keeps it).
"""

from __future__ import annotations

import json
import shutil
import tarfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import IO, Any

from pytest_harbor.engine.masked_names import MaskedPaths
from pytest_harbor.engine.scripts import ARTIFACTS
from pytest_harbor.redaction import Redactor
from pytest_harbor.sandboxes.base import Sandbox, SandboxError, service_of
from pytest_harbor.sandboxes.copies import (
    ARTIFACTS_RESULTS_COPY,
    CopyCapped,
    bounded,
    excluded,
    members,
)
from pytest_harbor.tasks.config import ArtifactConfig

__all__ = [
    "ARTIFACTS_DIR",
    "KEPT_BYTES",
    "KEPT_FILES",
    "MANIFEST",
    "collect_artifacts",
]

ARTIFACTS_DIR = ARTIFACTS
MANIFEST = "manifest.json"
#: Of a turn's artifacts, at most this much file content is kept, in this many files.
KEPT_BYTES = 1024 * 1024 * 1024
KEPT_FILES = 20_000
_CHUNK = 64 * 1024


@dataclass
class _Tally:
    started: float = field(default_factory=time.monotonic)
    read: int = 0
    kept: int = 0
    files: int = 0
    notes: list[str] = field(default_factory=list)


def collect_artifacts(
    sandbox: Sandbox,
    artifacts: Sequence[ArtifactConfig],
    workdir: str,
    into: Path,
    redactor: Redactor,
) -> list[str]:
    """Copy `/logs/artifacts` and each of `artifacts` into the folder `into` (emptied
    first) with its manifest, or remove `into` when there was nothing to keep; return a
    note for each entry cut or left out. Raises nothing for what the sandbox holds or
    does; a sandbox the engine cannot reach gives a note per entry."""
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True, exist_ok=True)
    tally = _Tally()
    names = MaskedPaths(redactor)
    claimed: list[PurePosixPath] = []
    manifest: list[dict[str, Any]] = []
    convention = ArtifactConfig(source=ARTIFACTS_DIR)
    for artifact in (convention, *artifacts):
        source = _absolute(artifact.source, workdir)
        place = _place(artifact, source)
        entry: dict[str, Any] = {
            "source": artifact.source,
            "destination": str(place),
            "service": artifact.service or "main",
        }
        manifest.append(entry)
        overlap = next(
            (taken for taken in (PurePosixPath(MANIFEST), *claimed) if _overlaps(taken, place)),
            None,
        )
        if overlap is not None:
            entry["status"] = "skipped"
            entry["reason"] = f"its place overlaps {overlap}, which is taken"
            continue
        claimed.append(place)
        entry["status"], reason = _copy_one(
            sandbox, artifact, source, place, into, redactor, names, tally
        )
        if reason:
            entry["reason"] = reason
            if entry["status"] != "missing":
                tally.notes.append(f"{artifact.source}: {reason}")
    try:
        (into / MANIFEST).write_text(
            json.dumps({"artifacts": manifest}, indent=2, ensure_ascii=False) + "\n"
        )
    except (OSError, ValueError) as error:
        tally.notes.append(f"{MANIFEST}: not written ({type(error).__name__})")
    if tally.files == 0 and not tally.notes:
        shutil.rmtree(into, ignore_errors=True)
    return [f"artifacts: {note}" for note in tally.notes]


def _absolute(source: str, workdir: str) -> str:
    if source.startswith("/"):
        return source
    return f"{workdir.rstrip('/')}/{source}"


def _place(artifact: ArtifactConfig, source: str) -> PurePosixPath:
    """Where an entry goes below the folder: its destination, else its source path."""
    text = artifact.destination if artifact.destination else source
    parts = [part for part in PurePosixPath(text).parts if part not in ("/", "", ".", "..")]
    return PurePosixPath(*parts) if parts else PurePosixPath(".")


def _overlaps(one: PurePosixPath, other: PurePosixPath) -> bool:
    return one == other or one in other.parents or other in one.parents or str(one) == "."


def _copy_one(
    sandbox: Sandbox,
    artifact: ArtifactConfig,
    source: str,
    place: PurePosixPath,
    into: Path,
    redactor: Redactor,
    names: MaskedPaths,
    tally: _Tally,
) -> tuple[str, str | None]:
    """(status, reason) of one entry's copy."""
    limits = replace(
        ARTIFACTS_RESULTS_COPY,
        read_bytes=max(ARTIFACTS_RESULTS_COPY.read_bytes - tally.read, 1),
        seconds=max(ARTIFACTS_RESULTS_COPY.seconds - (time.monotonic() - tally.started), 0.001),
    )
    try:
        origin = sandbox
        if artifact.service not in (None, "main"):
            origin = service_of(origin, artifact.service)
        chunks = origin.iter_archive(source)
    except SandboxError as error:
        return "failed", f"not read: {_shown(str(error))}"
    if chunks is None:
        return "missing", "not there"
    stream = bounded(chunks, limits, source)
    left_out: list[str] = []
    try:
        for archive, member in members(stream):
            parts = member.name.split("/")[1:]
            if any(part in ("", ".", "..") for part in parts):
                continue
            relative = "/".join(parts)
            if parts and excluded(relative, tuple(artifact.exclude)):
                continue
            if member.isdir():
                continue
            shown = _shown("/".join((str(place), *parts)))
            if not member.isreg():
                left_out.append(f"{shown} ({_kind(member)})")
                continue
            if tally.files >= KEPT_FILES or tally.kept + member.size > KEPT_BYTES:
                left_out.append(f"{shown} (over the cap of {KEPT_FILES} files or 1 GiB kept)")
                continue
            data = archive.extractfile(member)
            if data is None:
                continue
            target = names.place([*place.parts, *parts])
            if not _write(into, target, redactor.stream(_read(data, member.size))):
                left_out.append(f"{shown} (not written here)")
                continue
            tally.kept += member.size
            tally.files += 1
    except CopyCapped as error:
        return "partial", f"the copy stopped: {_shown(str(error))}"
    except (tarfile.TarError, OSError, SandboxError, ValueError) as error:
        return "partial", f"reading it broke off: {_shown(str(error))}"
    finally:
        stream.close()
        tally.read += stream.read
    if left_out:
        shown = ", ".join(left_out[:20]) + (
            f" and {len(left_out) - 20} more" if len(left_out) > 20 else ""
        )
        return "partial", f"left out: {shown}"
    return "ok", None


def _write(into: Path, parts: list[str], chunks: Iterator[bytes]) -> bool:
    try:
        target = into.joinpath(*parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("wb") as handle:
            for chunk in chunks:
                handle.write(chunk)
    except (OSError, ValueError):
        return False
    return True


def _read(source: IO[bytes], size: int) -> Iterator[bytes]:
    while size > 0:
        chunk = source.read(min(_CHUNK, size))
        if not chunk:
            return
        size -= len(chunk)
        yield chunk


def _shown(name: str) -> str:
    text = name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return text if len(text) <= 300 else text[:280] + "[...]"


def _kind(member: tarfile.TarInfo) -> str:
    if member.issym() or member.islnk():
        return "a link, not copied"
    if member.isfifo():
        return "a FIFO, not copied"
    if member.isdev():
        return "a device, not copied"
    return "not a file, not copied"
