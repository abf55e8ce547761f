"""The result files of a run: rollouts.jsonl, rollouts_failures.jsonl and one verifier/
folder per verification."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pytest_harbor import strict_json
from pytest_harbor.engine.results import EpisodeResult, episode_id
from pytest_harbor.redaction import Redactor
from pytest_harbor.tasks.task import SINGLE_STEP_TURN
from pytest_harbor.writers.failures import FailureRecord
from pytest_harbor.writers.files import write_atomically
from pytest_harbor.writers.resume import ResumePoint
from pytest_harbor.writers.runs import INCOMING, RUNS, point_latest

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
    """Where files go: each run of a taskset in a folder of its own,
    `<results>/harbor/<taskset>/runs/<run>/` (`.../harbor/validation/<taskset>/runs/<run>/`
    for the oracle), the newest as `<taskset>/latest` (see writers/runs.py).

    `runs` names each taskset's run folder; the controller settles it as the run starts
    and hands it to the workers. `verifier_root` (the `artifacts_dir` setting) moves the
    verifier folders elsewhere: `<verifier_root>/[validation/]<taskset>/runs/<run>/<episode>/`.
    """

    results_dir: Path
    validation: bool
    verifier_root: Path | None = None
    runs: dict[str, str] = field(default_factory=dict)

    def root_dir(self, taskset: str) -> Path:
        """The taskset's folder: its runs, `latest`, and what all its runs share."""
        base = self.results_dir / "harbor"
        return (base / "validation" if self.validation else base) / taskset

    def use_run(self, taskset: str, name: str) -> None:
        """This run writes `taskset`'s files in `runs/<name>/`."""
        self.runs[taskset] = name

    def run_name(self, taskset: str) -> str:
        try:
            return self.runs[taskset]
        except KeyError:
            raise LookupError(f"no run folder was settled for {taskset}") from None

    def taskset_dir(self, taskset: str) -> Path:
        """This run's folder of `taskset`: `<taskset>/runs/<run>/`."""
        return self.root_dir(taskset) / RUNS / self.run_name(taskset)

    def point_latest(self, taskset: str) -> None:
        """`<taskset>/latest` names this run."""
        point_latest(self.root_dir(taskset), self.run_name(taskset))

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

    def verifier_home_of(self, taskset: str) -> Path | None:
        """The taskset's folder under `verifier_root` (None without one): split like the
        results folder, so that an agent run and a validation run of one taskset never
        share each other's folders."""
        if self.verifier_root is None:
            return None
        root = self.verifier_root / "validation" if self.validation else self.verifier_root
        return root / taskset

    def verifier_root_of(self, taskset: str) -> Path:
        home = self.verifier_home_of(taskset)
        if home is not None:
            return home / RUNS / self.run_name(taskset)
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
        return self.root_dir(taskset) / INCOMING / run_id

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

    Each run writes a folder of its own (`<taskset>/runs/<run>/`, see writers/runs.py): a
    fresh run begins it as the run starts; a resumed one begins once it has something of
    an episode to write (a row, or an episode's failure other than the run's
    interruption), rewriting the rows it keeps, so that a resume that runs nothing leaves
    the run as it was. `on_begin` writes the run's own files (its manifest, say). The
    taskset's `latest` names the run once it has written a result; a fresh run that wrote
    none is removed at its end. What workers wrote for an episode in the staging area
    moves into place with its row or failure.

    Values the redactor knows (secrets, the model's key) are replaced by `***` in every
    line and file it writes.
    """

    def __init__(self, layout: ResultsLayout, redactor: Redactor, run_id: str = "run") -> None:
        self.layout = layout
        self.redactor = redactor
        self.run_id = run_id
        self._plans: dict[str, _Planned] = {}
        self._begun: set[str] = set()
        self._wrote: set[str] = set()

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

    def wrote(self, taskset: str) -> bool:
        """Whether the run wrote a result (a row or a failure) of `taskset`."""
        return taskset in self._wrote

    def begin(self, taskset: str) -> None:
        """Begin the taskset's run folder now (once): empty files for a fresh run, the kept
        rows of a resumed one; then the run's own files."""
        if taskset in self._begun:
            return
        self._begun.add(taskset)
        planned = self._plans.get(taskset, _Planned())
        folder = self.layout.taskset_dir(taskset)
        folder.mkdir(parents=True, exist_ok=True)
        if planned.resume is not None:
            self._keep(planned.resume)
        else:
            (folder / ROLLOUTS).write_text("")
            (folder / FAILURES).write_text("")
        self._forget_stale_staging(taskset)
        if planned.on_begin is not None:
            planned.on_begin()

    def _written(self, taskset: str) -> None:
        if taskset not in self._wrote:
            self._wrote.add(taskset)
            self.layout.point_latest(taskset)

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
        self._written(result.taskset)

    def append_failure(self, failure: FailureRecord, *, begins: bool = True) -> bool:
        """Append an episode that ended with no result to rollouts_failures.jsonl, flushed.
        With `begins` false (the run's interruption) it is written only when the taskset
        has begun already; returns whether it was written."""
        if not begins and not self.begun(failure.taskset):
            return False
        self.begin(failure.taskset)
        self._place(failure.taskset, episode_id(failure.task_id, failure.repeat))
        self._append(self.layout.failures_file(failure.taskset), failure.model_dump(mode="json"))
        self._written(failure.taskset)
        return True

    def finish(self, taskset: str, *, ran: bool = True) -> None:
        """At the end of the run: what is still staged moves into place (files a harness
        wrote while its session closed, say) when the taskset began, and is dropped when
        it did not. A fresh run that ran nothing of the taskset (`ran` false: it selected
        none of it, or collection stopped) and wrote no result leaves no folder; one that
        did is the taskset's `latest`."""
        staged = self.layout.incoming_dir(taskset, self.run_id)
        if staged.is_dir() and self.begun(taskset):
            for kind in KINDS:
                for episode in sorted((staged / kind).glob("*")):
                    self._move(episode, self._final(taskset, kind, episode.name), merge=True)
        shutil.rmtree(staged, ignore_errors=True)
        with contextlib.suppress(OSError):
            staged.parent.rmdir()  # only when empty
        planned = self._plans.get(taskset, _Planned())
        if not self.begun(taskset) or self.wrote(taskset) or planned.resume is not None:
            return
        if ran:
            self._written(taskset)
            return
        shutil.rmtree(self.layout.taskset_dir(taskset), ignore_errors=True)
        with contextlib.suppress(OSError):
            self.layout.taskset_dir(taskset).parent.rmdir()  # only when empty
        if self.layout.verifier_root is not None:
            shutil.rmtree(self.layout.verifier_root_of(taskset), ignore_errors=True)
        self._begun.discard(taskset)

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
