"""Every run of a taskset keeps a folder of its own, and no run deletes another's.

`<taskset>/runs/<start>-<agent>[-<model>]/` holds one run's files; `<taskset>/latest`
names the run that last wrote a result (a relative symbolic link, replaced atomically);
what belongs to the taskset rather than to one run (the lock, the key of the secrets'
fingerprints, the record of durations, the staging area) stays in `<taskset>/`.

The layout before this one kept the newest run in `<taskset>/` itself and earlier ones in
`<taskset>.previous/<start>/`; `migrate` moves both into `runs/` the first time a run
meets them, rewriting the absolute folders the rows name.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pytest_harbor import strict_json
from pytest_harbor.writers.files import write_atomically

__all__ = [
    "INCOMING",
    "LATEST",
    "RUNS",
    "Migrated",
    "latest_run",
    "migrate",
    "point_latest",
    "run_folder_name",
    "runs_of",
    "unused_name",
]

#: `<taskset>/runs/<run>/`: one folder per run.
RUNS = "runs"
#: `<taskset>/latest`: the run that last wrote a result.
LATEST = "latest"
#: Where workers stage what they write during a run (`<taskset>/.incoming/<run id>/`).
INCOMING = ".incoming"
#: The old layout's folder of earlier runs, beside the taskset's.
_PREVIOUS = ".previous"
#: What belongs to the taskset's folder rather than to one run.
_STAYS = frozenset({RUNS, LATEST, INCOMING, ".run.lock", ".secrets_key", "durations.json"})
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
#: What the earlier layout wrote of a run, and what shows one was there.
_RUN_MARKS = ("rollouts.jsonl", "rollouts_failures.jsonl", "rollouts_manifest.json")
_RUN_FILES = frozenset(
    {
        *_RUN_MARKS,
        "rollouts_run_summary.json",
        "report.html",
        "check.json",
        "skipped.json",
        "compare.html",
    }
)
_RUN_FOLDERS = frozenset({"verifier", "agent", "artifacts"})
_RUN_PATTERNS = ("tasks_*.jsonl", "run_config_*.yaml")
#: How the earlier layout named a run set aside: its start, `-2` when taken.
_STAMPED = re.compile(r"(\d{8}T\d{6}|\d{1,14}|unknown)(-\d+)?")
_NAME_PART = 48


def run_folder_name(started_at: str, agent: str, model: str | None) -> str:
    """`20261207T223000-shell-agent-gpt-4o`: when the run started (UTC), its agent and
    model, each part kept to letters, digits, `.`, `_` and `-`."""
    parts = [_stamp(started_at), _safe(agent)]
    if model:
        parts.append(_safe(model))
    return "-".join(part for part in parts if part)


def unused_name(root: Path, name: str) -> str:
    """`name`, or `name-2`, `name-3` ... when a run of that name is in `root` already."""
    candidate, number = name, 1
    while (root / RUNS / candidate).exists():
        number += 1
        candidate = f"{name}-{number}"
    return candidate


def runs_of(root: Path) -> list[Path]:
    """The run folders of a taskset, newest first (by the start their manifests name, or
    their folders' names when a manifest does not say)."""
    folder = root / RUNS
    if not folder.is_dir():
        return []
    found = [path for path in folder.iterdir() if path.is_dir() and not path.is_symlink()]
    return sorted(found, key=lambda path: (_started(path) or "", path.name), reverse=True)


def latest_run(root: Path) -> Path | None:
    """The run `<taskset>/latest` names, when it names one of the taskset's runs."""
    link = root / LATEST
    try:
        target = os.readlink(link)
    except OSError:
        return None
    folder = (root / target).resolve()
    runs = (root / RUNS).resolve()
    return folder if folder.parent == runs and folder.is_dir() else None


def point_latest(root: Path, name: str) -> None:
    """Make `<taskset>/latest` name `runs/<name>` (a reader sees the old link or the new
    one, never none)."""
    link = root / LATEST
    temporary = root / f".{LATEST}.{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    os.symlink(f"{RUNS}/{name}", temporary)
    if link.is_dir() and not link.is_symlink():
        # Not ours to replace: a folder a user made there. It keeps its place.
        temporary.unlink()
        return
    os.replace(temporary, link)


@dataclass(frozen=True)
class Migrated:
    """A run of the old layout, now in `runs/`."""

    came_from: Path
    now_in: Path

    def message(self, taskset: str) -> str:
        return f"{taskset}: the run in {self.came_from} is now in {self.now_in}"


def migrate(root: Path, elsewhere: Path | None = None) -> list[Migrated]:
    """Move the old layout's runs into `runs/`: the earlier ones of `<taskset>.previous/`,
    then the one in `<taskset>/` itself (which `latest` then names). `elsewhere` is the
    taskset's folder of verifier folders kept apart (the `artifacts_dir` setting), whose
    runs move the same way. Nothing is deleted; the rows' folders are rewritten to match."""
    moved: list[Migrated] = []
    previous = root.parent / f"{root.name}{_PREVIOUS}"
    earlier = _earlier_runs(previous)
    if earlier:
        for old in earlier:
            apart = None if elsewhere is None else _previous_of(elsewhere) / old.name
            moved.append(_move_run(root, old, list(old.iterdir()), elsewhere, apart))
        with contextlib.suppress(OSError):
            previous.rmdir()
        if elsewhere is not None:
            with contextlib.suppress(OSError):
                _previous_of(elsewhere).rmdir()
    flat = _flat_files(root)
    if flat:
        apart = None
        if elsewhere is not None and elsewhere.is_dir():
            apart = elsewhere
        moved.append(_move_run(root, root, flat, elsewhere, apart))
        point_latest(root, moved[-1].now_in.name)
    return moved


def _previous_of(folder: Path) -> Path:
    return folder.parent / f"{folder.name}{_PREVIOUS}"


def _flat_files(root: Path) -> list[Path]:
    """The files of a run the earlier layout kept in the taskset's folder itself: only
    names that layout wrote, and only when its rows or manifest are there (a folder of
    another kind, another taskset's say, is never taken for one)."""
    if not root.is_dir() or not any((root / name).is_file() for name in _RUN_MARKS):
        return []
    return sorted(path for path in root.iterdir() if _of_a_run(path))


def _of_a_run(path: Path) -> bool:
    if path.is_symlink():
        return False
    if path.is_dir():
        return path.name in _RUN_FOLDERS
    return path.name in _RUN_FILES or any(path.match(pattern) for pattern in _RUN_PATTERNS)


def _earlier_runs(previous: Path) -> list[Path]:
    """The earlier layout's runs set aside in `<taskset>.previous/`: folders named by a
    start that hold a run. Nothing when the folder is a taskset's of this layout (a
    dataset named `<taskset>.previous`)."""
    if not previous.is_dir() or (previous / RUNS).exists() or (previous / LATEST).exists():
        return []
    return sorted(
        path
        for path in previous.iterdir()
        if path.is_dir()
        and not path.is_symlink()
        and _STAMPED.fullmatch(path.name)
        and any((path / name).is_file() for name in _RUN_MARKS)
    )


def _move_run(
    root: Path, old: Path, files: list[Path], elsewhere: Path | None, apart: Path | None
) -> Migrated:
    manifest = _manifest(old)
    model = manifest.get("model")
    name = run_folder_name(
        str(manifest.get("started_at") or _newest(files)),
        str(manifest.get("agent") or "unknown"),
        str(model.get("name")) if isinstance(model, dict) and model.get("name") else None,
    )
    name = unused_name(root, name)
    target = root / RUNS / name
    target.mkdir(parents=True)
    for path in files:
        shutil.move(str(path), str(target / path.name))
    if old != root:
        with contextlib.suppress(OSError):
            old.rmdir()
    # Rows name the folders where the run wrote them (an earlier run's, before it was set
    # aside, name the taskset's folder): both now mean the run's folder.
    renamed = {str(old): str(target), str(root): str(target)}
    if elsewhere is not None and apart is not None and apart.is_dir():
        kept_apart = elsewhere / RUNS / name
        kept_apart.mkdir(parents=True)
        for path in sorted(apart.iterdir()):
            if path.name != RUNS:
                shutil.move(str(path), str(kept_apart / path.name))
        renamed.update({str(apart): str(kept_apart), str(elsewhere): str(kept_apart)})
        if apart != elsewhere:
            with contextlib.suppress(OSError):
                apart.rmdir()
    for rows in ("rollouts.jsonl", "rollouts_failures.jsonl"):
        _rewrite_folders(target / rows, renamed)
    return Migrated(came_from=old, now_in=target)


def _rewrite_folders(path: Path, renamed: dict[str, str]) -> None:
    """The rows of `path` with the folders they name moved as `renamed` says; a line that
    is not a JSON object is kept as it is."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    except (OSError, UnicodeDecodeError):
        return
    out = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            out.append(line)
            continue
        if not isinstance(row, dict):
            out.append(line)
            continue
        out.append(strict_json.dumps(_renamed(row, renamed), sort_keys=True) + "\n")
    write_atomically(path, "".join(out))


def _renamed(value: Any, renamed: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {
            key: _moved_path(item, renamed)
            if isinstance(key, str) and key.endswith("_dir") and isinstance(item, str)
            else _renamed(item, renamed)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_renamed(item, renamed) for item in value]
    return value


def _moved_path(path: str, renamed: dict[str, str]) -> str:
    """`path` under the first of `renamed`'s old folders that holds it, moved; a path in
    a folder of the new layout (`runs/`) is never one of the old layout's."""
    for old, new in renamed.items():
        if path == old or path.startswith(old + os.sep):
            rest = path[len(old) :]
            if rest.startswith(os.sep + RUNS + os.sep):
                continue
            return new + rest
    return path


def _manifest(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / "rollouts_manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _started(folder: Path) -> str | None:
    started = _manifest(folder).get("started_at")
    return started if isinstance(started, str) and started else None


def _newest(files: list[Path]) -> str:
    newest = max((path.stat().st_mtime for path in files), default=0.0)
    return datetime.fromtimestamp(newest, UTC).isoformat(timespec="seconds")


def _stamp(started_at: str) -> str:
    """`20261201T204100` from an ISO time, whatever the form it came in."""
    digits = "".join(char for char in started_at[:19] if char.isdigit())
    return f"{digits[:8]}T{digits[8:14]}" if len(digits) >= 14 else (digits or "unknown")


def _safe(part: str) -> str:
    return _UNSAFE.sub("_", part).strip("._-")[:_NAME_PART]
