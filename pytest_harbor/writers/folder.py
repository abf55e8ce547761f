"""A taskset's results folder across runs: what an earlier run left is set aside whole, not
deleted, when a fresh run has a result of its own to write; and what workers write while
an episode runs is staged, so that nothing of the earlier run is touched before then."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

__all__ = [
    "INCOMING",
    "KEPT_PREVIOUS",
    "PREVIOUS_SUFFIX",
    "EarlierRun",
    "SetAside",
    "earlier_run",
    "set_aside",
]

#: How many earlier runs of a taskset are kept beside its folder (the oldest go first).
KEPT_PREVIOUS = 3
#: `<taskset>.previous/<when the run started>/` holds an earlier run set aside.
PREVIOUS_SUFFIX = ".previous"
#: Where workers stage what they write during this run (`<taskset>/.incoming/<run id>/`).
INCOMING = ".incoming"
#: What belongs to the folder rather than to one run: its lock, the key of its secrets'
#: fingerprints, the record of episode durations, and the staging area.
_STAYS = frozenset({INCOMING, ".run.lock", ".secrets_key", "durations.json"})


@dataclass(frozen=True)
class SetAside:
    """An earlier run moved out of the way: how many rows it had, when it started, where
    it is now."""

    rows: int
    started_at: str
    kept_in: Path

    def message(self, taskset: str) -> str:
        return (
            f"{taskset}: replaced {self.rows} row{'s' if self.rows != 1 else ''} of the run of "
            f"{_shown(self.started_at)} (kept in {self.kept_in})"
        )


@dataclass(frozen=True)
class EarlierRun:
    """What a results folder holds from an earlier run."""

    rows: int
    started_at: str

    def message(self, taskset: str, folder: Path) -> str:
        return (
            f"{taskset}: nothing of this run was written; {folder} still holds the run of "
            f"{_shown(self.started_at)} ({self.rows} row{'s' if self.rows != 1 else ''})"
        )


def _run_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(path for path in folder.iterdir() if path.name not in _STAYS)


def earlier_run(folder: Path) -> EarlierRun | None:
    """The results an earlier run left in `folder` (rows, failures, an episode's folders),
    or None when it left none (nothing, or only the description of a run that ran
    nothing: replacing that loses nothing)."""
    rows = _count_rows(folder / "rollouts.jsonl")
    results = (
        rows
        or _count_rows(folder / "rollouts_failures.jsonl")
        or any(
            any(path.iterdir()) for path in (folder / "verifier", folder / "agent") if path.is_dir()
        )
    )
    if not results:
        return None
    return EarlierRun(rows=rows, started_at=_started(folder))


def set_aside(
    folder: Path, *, also: Path | None = None, keep: int = KEPT_PREVIOUS
) -> SetAside | None:
    """Move everything of an earlier run out of `folder` (its lock, secrets key, duration
    record and staging area stay) into `<folder>.previous/<start of that run>/`, and
    `also` (a verifier folder kept elsewhere, `artifacts_dir`) into `<also>.previous/...`
    beside it. Only the newest `keep` earlier runs are kept. None when there was nothing."""
    found = earlier_run(folder)
    if found is None:
        for path in _run_files(folder):  # the description of a run that ran nothing
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        return None
    stamp = _stamp(found.started_at)
    target = _free(folder.parent / f"{folder.name}{PREVIOUS_SUFFIX}" / stamp)
    target.mkdir(parents=True)
    for path in _run_files(folder):
        shutil.move(str(path), str(target / path.name))
    if also is not None and also.is_dir() and any(also.iterdir()):
        elsewhere = _free(also.parent / f"{also.name}{PREVIOUS_SUFFIX}" / stamp)
        elsewhere.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(also), str(elsewhere))
        _prune(elsewhere.parent, keep)
    _prune(target.parent, keep)
    return SetAside(rows=found.rows, started_at=found.started_at, kept_in=target)


def _count_rows(path: Path) -> int:
    try:
        with path.open("rb") as handle:
            return sum(1 for line in handle if line.strip())
    except OSError:
        return 0


def _started(folder: Path) -> str:
    """When the run that left `folder` started: its manifest says; else the time its
    newest file was written."""
    try:
        manifest = json.loads((folder / "rollouts_manifest.json").read_text(encoding="utf-8"))
        started = manifest.get("started_at") if isinstance(manifest, dict) else None
        if isinstance(started, str) and started:
            return started
    except (OSError, ValueError):
        pass
    newest = max((path.stat().st_mtime for path in _run_files(folder)), default=0.0)
    return datetime.fromtimestamp(newest, UTC).isoformat(timespec="seconds")


def _stamp(started_at: str) -> str:
    """A folder name from a time: `20261201T204100`, whatever the form it came in."""
    digits = "".join(char for char in started_at[:19] if char.isdigit())
    return f"{digits[:8]}T{digits[8:14]}" if len(digits) >= 14 else (digits or "unknown")


def _free(path: Path) -> Path:
    """`path`, or `path-2`, `path-3` ... when it is taken."""
    candidate, number = path, 1
    while candidate.exists():
        number += 1
        candidate = path.with_name(f"{path.name}-{number}")
    return candidate


def _prune(folder: Path, keep: int) -> None:
    runs = sorted((path for path in folder.iterdir() if path.is_dir()), key=lambda p: p.name)
    for old in runs[: max(0, len(runs) - keep)]:
        shutil.rmtree(old, ignore_errors=True)


def _shown(started_at: str) -> str:
    """`2026-12-01 20:41 UTC` from an ISO time; as given when it is not one."""
    try:
        when = datetime.fromisoformat(started_at)
    except ValueError:
        return started_at
    if when.tzinfo is not None:
        when = when.astimezone(UTC)
    return when.strftime("%Y-%m-%d %H:%M") + " UTC"
