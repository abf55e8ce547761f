"""The result files of a run: rollouts.jsonl, rollouts_failures.jsonl and one verifier/
folder per verification."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pytest_harbor import strict_json
from pytest_harbor.engine.results import EpisodeResult, episode_id
from pytest_harbor.redaction import Redactor
from pytest_harbor.tasks.task import SINGLE_STEP_TURN
from pytest_harbor.writers.failures import FailureRecord
from pytest_harbor.writers.files import write_atomically
from pytest_harbor.writers.folder import INCOMING, SetAside, set_aside
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
ARTIFACTS = "artifacts"
SKIPPED = "skipped.json"
#: The folders of each episode's files, staged by workers and placed with its row.
KINDS = (VERIFIER, AGENT, ARTIFACTS)


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

    def artifacts_root_of(self, taskset: str) -> Path:
        return self.taskset_dir(taskset) / ARTIFACTS

    def artifacts_dir(self, taskset: str, episode_id: str) -> Path:
        """`artifacts/<episode>/`: what each turn left to keep (a multi-step episode's
        turns in `<step>/` below it)."""
        return self.artifacts_root_of(taskset) / episode_id

    def root_of(self, taskset: str, kind: str) -> Path:
        """The folder of each episode's `verifier/`, `agent/` or `artifacts/` folders."""
        if kind == VERIFIER:
            return self.verifier_root_of(taskset)
        return self.taskset_dir(taskset) / kind

    def incoming_dir(self, taskset: str, run_id: str) -> Path:
        """Where the workers of run `run_id` write an episode's folders (`verifier/`,
        `agent/`) until the controller moves them into place with its row."""
        return self.taskset_dir(taskset) / INCOMING / run_id

    def staged_verifier_dir(self, taskset: str, run_id: str, episode_id: str) -> Path:
        return self.incoming_dir(taskset, run_id) / VERIFIER / episode_id

    def staged_agent_dir(self, taskset: str, run_id: str, episode_id: str) -> Path:
        return self.incoming_dir(taskset, run_id) / AGENT / episode_id

    def staged_artifacts_dir(self, taskset: str, run_id: str, episode_id: str) -> Path:
        return self.incoming_dir(taskset, run_id) / ARTIFACTS / episode_id

    def placed(self, taskset: str, run_id: str, staged: str) -> str:
        """The final place of a path in the staging area (others unchanged)."""
        root = self.incoming_dir(taskset, run_id)
        try:
            relative = Path(staged).relative_to(root)
        except ValueError:
            return staged
        kind, *rest = relative.parts
        return str(self.root_of(taskset, kind).joinpath(*rest))


class RolloutsWriter:
    """The only writer of a run's result files (the xdist controller, or the sole process).

    A taskset's folder is not touched until the run has something of an episode to write
    there (a row, or an episode's failure other than the run's interruption): a run that
    selects nothing, stops at a collection error or is interrupted before its first
    episode ends leaves the earlier results as they were. Then the folder begins: a fresh
    run sets the earlier run aside whole (`<taskset>.previous/`, see writers/folder.py), a
    resumed one rewrites the rows it keeps; `on_begin` writes the run's own files (its
    manifest, say). What workers wrote for an episode in the staging area moves into place
    with its row or failure.

    Values the redactor knows (secrets, the model's key) are replaced by `***` in every
    line and file it writes.
    """

    def __init__(self, layout: ResultsLayout, redactor: Redactor, run_id: str = "run") -> None:
        self.layout = layout
        self.redactor = redactor
        self.run_id = run_id
        self._plans: dict[str, _Planned] = {}
        self._begun: set[str] = set()
        #: The earlier run each fresh taskset set aside, when there was one.
        self.set_aside: dict[str, SetAside] = {}

    def plan(
        self,
        taskset: str,
        *,
        resume: ResumePoint | None = None,
        on_begin: Callable[[], None] | None = None,
    ) -> None:
        """Say how `taskset` begins once it has something to write (nothing happens now)."""
        self._plans[taskset] = _Planned(resume, on_begin)

    def begun(self, taskset: str) -> bool:
        return taskset in self._begun

    def begin(self, taskset: str) -> None:
        """Begin the taskset's folder now (once): set the earlier run aside, or rewrite
        the kept rows of a resumed one, then write the run's own files."""
        if taskset in self._begun:
            return
        self._begun.add(taskset)
        planned = self._plans.get(taskset, _Planned())
        folder = self.layout.taskset_dir(taskset)
        folder.mkdir(parents=True, exist_ok=True)
        if planned.resume is not None:
            self._keep(planned.resume)
        else:
            elsewhere = self.layout.verifier_root_of(taskset)
            aside = set_aside(
                folder, also=elsewhere if self.layout.verifier_root is not None else None
            )
            if aside is not None:
                self.set_aside[taskset] = aside
            (folder / ROLLOUTS).write_text("")
            (folder / FAILURES).write_text("")
        self._forget_stale_staging(taskset)
        if planned.on_begin is not None:
            planned.on_begin()

    def _keep(self, point: ResumePoint) -> None:
        """Go on from an earlier run: keep its rows and terminal failures (each episode
        once), drop the failures that this run retries, keep verifier/."""
        folder = self.layout.taskset_dir(point.taskset)
        write_atomically(folder / ROLLOUTS, "".join(self._line(row) for row in point.rows.values()))
        write_atomically(
            folder / FAILURES,
            "".join(self._line(failure.model_dump(mode="json")) for failure in point.kept_failures),
        )
        (folder / SUMMARY).unlink(missing_ok=True)
        # A report or check left from the run before would show that run as this one's.
        (folder / REPORT).unlink(missing_ok=True)
        (folder / CHECK).unlink(missing_ok=True)

    def append_row(self, result: EpisodeResult) -> None:
        """Append the episode's row to rollouts.jsonl, flushed (its staged folders moved
        into place first)."""
        self.begin(result.taskset)
        self._place(result.taskset, episode_id(result.task_id, result.repeat))
        self._append(self.layout.rollouts_file(result.taskset), result.row())

    def append_failure(self, failure: FailureRecord, *, begins: bool = True) -> bool:
        """Append an episode that ended with no result to rollouts_failures.jsonl, flushed.
        With `begins` false (the run's interruption) it is written only when the taskset
        has begun already; returns whether it was written."""
        if not begins and not self.begun(failure.taskset):
            return False
        self.begin(failure.taskset)
        self._place(failure.taskset, episode_id(failure.task_id, failure.repeat))
        self._append(self.layout.failures_file(failure.taskset), failure.model_dump(mode="json"))
        return True

    def finish(self, taskset: str) -> None:
        """At the end of the run: what is still staged moves into place (files a harness
        wrote while its session closed, say) when the taskset began, and is dropped when
        it did not."""
        staged = self.layout.incoming_dir(taskset, self.run_id)
        if staged.is_dir() and self.begun(taskset):
            for kind in KINDS:
                for episode in sorted((staged / kind).glob("*")):
                    self._move(episode, self._final(taskset, kind, episode.name), merge=True)
        shutil.rmtree(staged, ignore_errors=True)
        with contextlib.suppress(OSError):
            staged.parent.rmdir()  # only when empty

    def _place(self, taskset: str, episode: str) -> None:
        staged = self.layout.incoming_dir(taskset, self.run_id)
        for kind in KINDS:
            source = staged / kind / episode
            if source.exists():
                self._move(source, self._final(taskset, kind, episode), merge=False)

    def _final(self, taskset: str, kind: str, episode: str) -> Path:
        return self.layout.root_of(taskset, kind) / episode

    @staticmethod
    def _move(source: Path, target: Path, *, merge: bool) -> None:
        """`source` to `target`: replacing what is there (an earlier attempt of the same
        episode, resuming), or with `merge`, adding to it."""
        if merge and target.is_dir():
            for entry in source.rglob("*"):
                if entry.is_file():
                    destination = target / entry.relative_to(source)
                    destination.parent.mkdir(parents=True, exist_ok=True)
                    shutil.move(str(entry), str(destination))
            shutil.rmtree(source, ignore_errors=True)
            return
        if target.exists():
            shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(source), str(target))

    def _forget_stale_staging(self, taskset: str) -> None:
        """Staging areas of runs that were killed before they could clear theirs."""
        incoming = self.layout.incoming_dir(taskset, self.run_id).parent
        for other in incoming.glob("*"):
            if other.name != self.run_id:
                shutil.rmtree(other, ignore_errors=True)

    def _line(self, data: Mapping[str, object]) -> str:
        return strict_json.dumps(self.redactor.data(data), sort_keys=True) + "\n"

    def _append(self, path: Path, data: Mapping[str, object]) -> None:
        """One line, flushed; a write that fails (a full disk) is taken back whole, so
        the file ends with the last good line and the next append starts a line."""
        line = self._line(data).encode()
        with path.open("ab") as handle:
            start = handle.tell()
            try:
                handle.write(line)
                handle.flush()
            except OSError:
                with contextlib.suppress(OSError):
                    handle.truncate(start)
                raise


@dataclass(frozen=True)
class _Planned:
    resume: ResumePoint | None = None
    on_begin: Callable[[], None] | None = None
