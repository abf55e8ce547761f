"""The result files of a run: rollouts.jsonl and one verifier/ folder per verification."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pytest_harbor.engine.results import EpisodeResult
from pytest_harbor.tasks.task import SINGLE_STEP_TURN

__all__ = ["ResultsLayout", "RolloutsWriter"]

ROLLOUTS = "rollouts.jsonl"
VERIFIER = "verifier"
SKIPPED = "skipped.json"


@dataclass(frozen=True)
class ResultsLayout:
    """Where files go: `<results>/harbor/<taskset>/`, or `.../harbor/validation/<taskset>/`.

    `verifier_root` (the `artifacts_dir` setting) moves the verifier folders elsewhere:
    `<verifier_root>/<taskset>/<episode>/`.
    """

    results_dir: Path
    validation: bool
    verifier_root: Path | None = None

    def taskset_dir(self, taskset: str) -> Path:
        base = self.results_dir / "harbor"
        return (base / "validation" if self.validation else base) / taskset

    def rollouts_file(self, taskset: str) -> Path:
        return self.taskset_dir(taskset) / ROLLOUTS

    def tasks_file(self, taskset: str, agent: str) -> Path:
        return self.taskset_dir(taskset) / f"tasks_{agent}.jsonl"

    def skipped_file(self, taskset: str) -> Path:
        return self.taskset_dir(taskset) / SKIPPED

    def verifier_root_of(self, taskset: str) -> Path:
        if self.verifier_root is not None:
            return self.verifier_root / taskset
        return self.taskset_dir(taskset) / VERIFIER

    def verifier_dir(self, taskset: str, episode_id: str, step: str = SINGLE_STEP_TURN) -> Path:
        """`verifier/<episode>/` for a single-step task, `verifier/<episode>/<step>/` per turn."""
        folder = self.verifier_root_of(taskset) / episode_id
        return folder if step == SINGLE_STEP_TURN else folder / step


class RolloutsWriter:
    """The only writer of a run's result files (the xdist controller, or the sole process).

    Values of `secrets` are replaced by `***` in every verifier file it writes.
    """

    def __init__(self, layout: ResultsLayout, secrets: Iterable[str] = ()) -> None:
        self.layout = layout
        self._secrets = sorted(
            {value.encode() for value in secrets if value}, key=len, reverse=True
        )
        self._started: set[str] = set()

    def start(self, tasksets: Iterable[str]) -> None:
        """Begin a fresh run: empty each taskset's rollouts.jsonl and verifier/ folder."""
        for taskset in tasksets:
            self._start(taskset)

    def _start(self, taskset: str) -> None:
        if taskset in self._started:
            return
        folder = self.layout.taskset_dir(taskset)
        folder.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.layout.verifier_root_of(taskset), ignore_errors=True)
        (folder / ROLLOUTS).write_text("")
        self._started.add(taskset)

    def write_turn_files(
        self, taskset: str, episode_id: str, step: str, files: Mapping[str, bytes]
    ) -> Path:
        """Write what a turn's verifier left in /logs/verifier; returns the folder."""
        self._start(taskset)
        folder = self.layout.verifier_dir(taskset, episode_id, step)
        _write_files(folder, {name: self._scrub(data) for name, data in files.items()})
        return folder

    def append_row(self, result: EpisodeResult) -> None:
        """Append the episode's row to rollouts.jsonl, flushed."""
        self._start(result.taskset)
        with self.layout.rollouts_file(result.taskset).open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(result.row(), sort_keys=True) + "\n")
            handle.flush()

    def _scrub(self, data: bytes) -> bytes:
        for secret in self._secrets:
            data = data.replace(secret, b"***")
        return data


def _write_files(folder: Path, files: Mapping[str, bytes]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        target = (folder / name).resolve()
        if not target.is_relative_to(folder.resolve()):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
