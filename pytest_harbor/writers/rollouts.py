"""The result files of a run: rollouts.jsonl, rollouts_failures.jsonl and one verifier/
folder per verification."""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pytest_harbor import strict_json
from pytest_harbor.engine.results import EpisodeResult
from pytest_harbor.redaction import Redactor
from pytest_harbor.tasks.task import SINGLE_STEP_TURN
from pytest_harbor.writers.failures import FailureRecord
from pytest_harbor.writers.files import write_atomically
from pytest_harbor.writers.resume import ResumePoint

__all__ = ["ResultsLayout", "RolloutsWriter"]

ROLLOUTS = "rollouts.jsonl"
FAILURES = "rollouts_failures.jsonl"
SUMMARY = "rollouts_run_summary.json"
#: The HTML report of the run (pytest_harbor.report).
REPORT = "report.html"
#: The author check's findings (`--harbor-check`), which the report shows.
CHECK = "check.json"
MANIFEST = "rollouts_manifest.json"
VERIFIER = "verifier"
AGENT = "agent"
SKIPPED = "skipped.json"


@dataclass(frozen=True)
class ResultsLayout:
    """Where files go: `<results>/harbor/<taskset>/`, or `.../harbor/validation/<taskset>/`.

    `verifier_root` (the `artifacts_dir` setting) moves the verifier folders elsewhere:
    `<verifier_root>/<taskset>/<episode>/`, or `<verifier_root>/validation/<taskset>/...`
    for the oracle.
    """

    results_dir: Path
    validation: bool
    verifier_root: Path | None = None

    def taskset_dir(self, taskset: str) -> Path:
        base = self.results_dir / "harbor"
        return (base / "validation" if self.validation else base) / taskset

    def rollouts_file(self, taskset: str) -> Path:
        return self.taskset_dir(taskset) / ROLLOUTS

    def failures_file(self, taskset: str) -> Path:
        return self.taskset_dir(taskset) / FAILURES

    def summary_file(self, taskset: str) -> Path:
        return self.taskset_dir(taskset) / SUMMARY

    def report_file(self, taskset: str) -> Path:
        return self.taskset_dir(taskset) / REPORT

    def check_file(self, taskset: str) -> Path:
        return self.taskset_dir(taskset) / CHECK

    def manifest_file(self, taskset: str) -> Path:
        return self.taskset_dir(taskset) / MANIFEST

    def tasks_file(self, taskset: str, agent: str) -> Path:
        return self.taskset_dir(taskset) / f"tasks_{agent}.jsonl"

    def skipped_file(self, taskset: str) -> Path:
        return self.taskset_dir(taskset) / SKIPPED

    def verifier_root_of(self, taskset: str) -> Path:
        if self.verifier_root is not None:
            # Split like the results folder, so that an agent run and a validation run of
            # one taskset never share (or delete) each other's folders.
            root = self.verifier_root / "validation" if self.validation else self.verifier_root
            return root / taskset
        return self.taskset_dir(taskset) / VERIFIER

    def verifier_dir(self, taskset: str, episode_id: str, step: str = SINGLE_STEP_TURN) -> Path:
        """`verifier/<episode>/` for a single-step task, `verifier/<episode>/<step>/` per turn."""
        folder = self.verifier_root_of(taskset) / episode_id
        return folder if step == SINGLE_STEP_TURN else folder / step

    def agent_root_of(self, taskset: str) -> Path:
        return self.taskset_dir(taskset) / AGENT

    def agent_dir(self, taskset: str, episode_id: str) -> Path:
        """`agent/<episode>/`: the files a harness keeps on the host (a multi-step
        episode's turns in `<step>/` below it)."""
        return self.agent_root_of(taskset) / episode_id


class RolloutsWriter:
    """The only writer of a run's result files (the xdist controller, or the sole process).

    Values the redactor knows (secrets, the model's key) are replaced by `***` in every
    line and file it writes.
    """

    def __init__(self, layout: ResultsLayout, redactor: Redactor | None = None) -> None:
        self.layout = layout
        self.redactor = redactor or Redactor()
        self._started: set[str] = set()

    def start(self, tasksets: Iterable[str]) -> None:
        """Begin a fresh run: empty each taskset's rows, failures and verifier/ folder, and
        remove the summary of the run before."""
        for taskset in tasksets:
            self._start(taskset)

    def _start(self, taskset: str) -> None:
        if taskset in self._started:
            return
        folder = self.layout.taskset_dir(taskset)
        folder.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.layout.verifier_root_of(taskset), ignore_errors=True)
        shutil.rmtree(self.layout.agent_root_of(taskset), ignore_errors=True)
        (folder / ROLLOUTS).write_text("")
        (folder / FAILURES).write_text("")
        (folder / SUMMARY).unlink(missing_ok=True)
        # A report or check left from the run before would show that run as this one's.
        (folder / REPORT).unlink(missing_ok=True)
        (folder / CHECK).unlink(missing_ok=True)
        self._started.add(taskset)

    def resume(self, point: ResumePoint) -> None:
        """Go on from an earlier run: keep its rows and terminal failures (each episode
        once), drop the failures that this run retries, keep verifier/."""
        folder = self.layout.taskset_dir(point.taskset)
        folder.mkdir(parents=True, exist_ok=True)
        write_atomically(folder / ROLLOUTS, "".join(self._line(row) for row in point.rows.values()))
        write_atomically(
            folder / FAILURES,
            "".join(self._line(failure.model_dump(mode="json")) for failure in point.kept_failures),
        )
        (folder / SUMMARY).unlink(missing_ok=True)
        # A report or check left from the run before would show that run as this one's.
        (folder / REPORT).unlink(missing_ok=True)
        (folder / CHECK).unlink(missing_ok=True)
        self._started.add(point.taskset)

    def append_row(self, result: EpisodeResult) -> None:
        """Append the episode's row to rollouts.jsonl, flushed."""
        self._start(result.taskset)
        self._append(self.layout.rollouts_file(result.taskset), result.row())

    def append_failure(self, failure: FailureRecord) -> None:
        """Append an episode that ended with no result to rollouts_failures.jsonl, flushed."""
        self._start(failure.taskset)
        self._append(self.layout.failures_file(failure.taskset), failure.model_dump(mode="json"))

    def _line(self, data: Mapping[str, object]) -> str:
        return strict_json.dumps(self.redactor.data(data), sort_keys=True) + "\n"

    def _append(self, path: Path, data: Mapping[str, object]) -> None:
        with path.open("a", encoding="utf-8") as handle:
            handle.write(self._line(data))
            handle.flush()
