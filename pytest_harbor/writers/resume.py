"""What an earlier run of a taskset left, read back for `--harbor-resume`.

Kept: every row (a reward of 0 and masked rows included) and every terminal failure of an
episode without a row. Retried: episodes whose failure is not terminal, episodes with a
partial row (some of their steps were not selected), and episodes with nothing at all. A
line that cannot be read (a run killed while writing it) is dropped, and so is a second
row of the same episode: the files hold each episode once.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from pytest_harbor.engine.results import EpisodeResult
from pytest_harbor.writers.failures import FailureRecord
from pytest_harbor.writers.manifest import RunManifest, read_manifest
from pytest_harbor.writers.rows import read_rows

__all__ = ["EpisodeKey", "ResumePoint", "read_resume_point"]

#: (task id, repeat)
EpisodeKey = tuple[str, int]
Record = TypeVar("Record", bound=BaseModel)


@dataclass
class ResumePoint:
    taskset: str
    manifest: RunManifest | None
    #: The rows kept, as written (JSON data) and as results.
    rows: dict[EpisodeKey, dict[str, Any]] = field(default_factory=dict)
    results: dict[EpisodeKey, EpisodeResult] = field(default_factory=dict)
    kept_failures: list[FailureRecord] = field(default_factory=list)
    retried: list[FailureRecord] = field(default_factory=list)
    dropped_lines: int = 0
    #: Partial rows, dropped: their episodes run again in full.
    partial: int = 0

    @property
    def finished(self) -> set[EpisodeKey]:
        """Episodes this run does not run again."""
        return set(self.rows) | {(f.task_id, f.repeat) for f in self.kept_failures}

    @property
    def has_results(self) -> bool:
        return bool(self.rows or self.kept_failures or self.retried or self.partial)


def read_resume_point(
    taskset: str, *, rollouts: Path, failures: Path, manifest: Path
) -> ResumePoint:
    """Read the files of the run to resume (raises ManifestError for a manifest that is
    not one)."""
    point = ResumePoint(taskset, read_manifest(manifest))
    for data, result in _records(rollouts, EpisodeResult, point):
        key = (result.task_id, result.repeat)
        if result.partial:
            point.partial += 1
            continue
        if key in point.rows:
            point.dropped_lines += 1
            continue
        point.rows[key] = data
        point.results[key] = result
    seen: set[EpisodeKey] = set()
    for _, failure in _records(failures, FailureRecord, point):
        key = (failure.task_id, failure.repeat)
        if key in point.rows or key in seen:
            point.dropped_lines += 1
            continue
        seen.add(key)
        (point.retried if failure.retry else point.kept_failures).append(failure)
    return point


def _records(
    path: Path, model: type[Record], point: ResumePoint
) -> Iterator[tuple[dict[str, Any], Record]]:
    """The lines of `path` that are a `model`, with their data; the others are counted."""
    for data in _json_lines(path, point):
        try:
            yield data, model.model_validate(data)
        except ValidationError:
            point.dropped_lines += 1


def _json_lines(path: Path, point: ResumePoint) -> list[dict[str, Any]]:
    """The JSON objects of `path`'s lines; a line that holds none (a torn last line among
    them) is counted as dropped."""
    if not path.is_file():
        return []
    found = []
    for line in read_rows(path):
        if line.row is None:
            point.dropped_lines += 1
        else:
            found.append(line.row)
    return found
