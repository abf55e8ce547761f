"""Reading a results folder back: the run summary, its rows, failures and check.json.

Tolerant by design: the report is also made of folders written by older versions, moved
folders and half-written (interrupted) runs. What cannot be read becomes a note on the page,
never an exception.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_harbor.strict_json import as_float
from pytest_harbor.untrusted import load_json
from pytest_harbor.writers.rollouts import CHECK, FAILURES, ROLLOUTS, SUMMARY
from pytest_harbor.writers.rows import read_rows
from pytest_harbor.writers.runs import INCOMING, LATEST, RUNS, latest_run, runs_of

__all__ = [
    "CHECK",
    "Episode",
    "ReportError",
    "TasksetResults",
    "TurnLogs",
    "as_mapping",
    "find_summaries",
    "load_taskset",
]


class ReportError(Exception):
    """No report can be made of what was given (a folder without any run summary)."""


@dataclass(frozen=True)
class TurnLogs:
    """Where one turn's verification left its files (absolute; None when absent)."""

    step: str
    verifier_dir: Path | None = None
    test_stdout: Path | None = None
    reward_file: Path | None = None
    trajectory: Path | None = None
    #: The harness's own folder and log of the turn (the oracle's output), when kept.
    agent_dir: Path | None = None
    agent_log: Path | None = None


@dataclass(frozen=True)
class Episode:
    """One task and repeat: the summary's entry, with its row (or failure row) beside."""

    task_id: str
    repeat: int
    status: str
    reward: float | None = None
    failure_kind: str | None = None
    failure_reason: str | None = None
    #: Where an episode with no result stopped (`queue`, `seed`, `turn`).
    stage: str | None = None
    skip_reason: str | None = None
    #: The task folder's digest the episode ran (None when the summary names none).
    digest: str | None = None
    logs: tuple[TurnLogs, ...] = ()
    #: The rollouts.jsonl row, as written (None without one).
    row: Mapping[str, Any] | None = None
    failure: Mapping[str, Any] | None = None

    @property
    def name(self) -> str:
        return f"{self.task_id}__r{self.repeat}"

    @property
    def duration_s(self) -> float | None:
        """Seconds from the start of the seed to the end of the last turn (or cleanup)."""
        return as_float(_timings(self.row).get("total_s"))

    @property
    def failure_name(self) -> str:
        """What the episode's failure is called: its failure kind; for a plain low score
        (the verifier ran and scored below a pass), what the report names it."""
        if self.failure_kind:
            return self.failure_kind
        if self.status == "failed":
            return f"the verifier scored {'0' if self.reward == 0 else 'below a pass'}"
        return self.status.replace("_", " ")

    @property
    def episode_dir(self) -> Path | None:
        """The episode's verifier folder (a multi-step episode's holds one per step)."""
        dirs = [logs.verifier_dir for logs in self.logs if logs.verifier_dir is not None]
        if not dirs:
            return None
        return dirs[0] if len(self.logs) == 1 else dirs[0].parent


@dataclass(frozen=True)
class TasksetResults:
    """One taskset's results folder as the report reads it."""

    folder: Path
    summary: Mapping[str, Any]
    episodes: tuple[Episode, ...]
    rows: tuple[Mapping[str, Any], ...] = ()
    failures: tuple[Mapping[str, Any], ...] = ()
    check: Mapping[str, Any] | None = None
    #: What could not be read, said on the page.
    notes: tuple[str, ...] = field(default=())

    @property
    def name(self) -> str:
        return str(self.summary.get("taskset") or self.folder.name)

    @property
    def repeats(self) -> int:
        found = max((episode.repeat + 1 for episode in self.episodes), default=0)
        declared = self.summary.get("repeats")
        return max(found, declared if isinstance(declared, int) else 0)

    def task_ids(self) -> list[str]:
        return list(dict.fromkeys(episode.task_id for episode in self.episodes))


def find_summaries(root: Path) -> list[Path]:
    """The run summaries at or under `root`: a run's folder, a taskset's folder (its latest
    run), or a folder above tasksets (the latest run of each). Given a taskset's `runs/`
    folder, every run in it."""
    if not root.is_dir():
        raise ReportError(f"{root} is not a folder")
    found = sorted(
        path
        for path in root.rglob(SUMMARY)
        if path.is_file() and _drawn(root, path.relative_to(root).parts[:-1])
    )
    if not found:
        raise ReportError(
            f"{root} holds no {SUMMARY}: give a run's folder, a taskset's results folder "
            "(results/harbor/<taskset>, or results/harbor/validation/<taskset>) or a folder "
            "above one, after a run has ended"
        )
    return found


def _drawn(root: Path, parts: tuple[str, ...]) -> bool:
    """Whether the summary in `root/<parts>` is drawn: never a staging area's; of a
    taskset's runs met from above, only its latest (or, without `latest`, its newest)."""
    if INCOMING in parts or any(part.endswith(".previous") for part in parts):
        return False
    for index, part in enumerate(parts[:-1]):
        if part == RUNS:
            taskset = root.joinpath(*parts[:index])
            if _copied_latest(taskset):
                return False
            return parts[index + 1] == _shown_run(taskset)
    return True


def _copied_latest(taskset: Path) -> bool:
    """Whether `latest` is a folder rather than a link (a copy that followed the link):
    then it is the run drawn, and its twin in runs/ is not."""
    latest = taskset / LATEST
    return latest.is_dir() and not latest.is_symlink()


def _shown_run(taskset: Path) -> str | None:
    latest = latest_run(taskset)
    if latest is not None and (latest / SUMMARY).is_file():
        return latest.name
    newest = [folder for folder in runs_of(taskset) if (folder / SUMMARY).is_file()]
    return newest[0].name if newest else None


def load_taskset(summary_file: Path) -> TasksetResults:
    """The taskset whose run summary is `summary_file`. Paths come from the summary
    (relative to its folder, so a moved folder still resolves); rows name their folders
    absolutely, and are used only when the summary has no path."""
    try:
        summary = _loads(summary_file.read_text(encoding="utf-8"))
        if not isinstance(summary, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as error:
        raise ReportError(f"{summary_file}: cannot read the run summary ({error})") from None
    return taskset_results(summary_file.parent, summary)


def taskset_results(folder: Path, summary: Mapping[str, Any]) -> TasksetResults:
    """The taskset whose run summary is `summary`, as if written in `folder` (a run in
    progress has its summary only in memory)."""
    notes: list[str] = []
    files = as_mapping(summary.get("files"))
    rows = list(_json_lines(_named(folder, files, "rollouts", ROLLOUTS), notes))
    failures = list(_json_lines(_named(folder, files, "failures", FAILURES), notes))
    rows_by_episode = {_key(row): row for row in rows}
    failures_by_episode = {_key(failure): failure for failure in failures}
    episodes = []
    entries = summary.get("episodes")
    for entry in entries if isinstance(entries, list) else ():
        if not isinstance(entry, dict) or "task_id" not in entry:
            continue
        key = (str(entry["task_id"]), _int(entry.get("repeat")))
        row = rows_by_episode.get(key)
        episodes.append(
            Episode(
                task_id=key[0],
                repeat=key[1],
                status=str(entry.get("status") or "unknown"),
                reward=as_float(entry.get("reward")),
                failure_kind=_text(entry.get("failure_kind")),
                failure_reason=_text(entry.get("failure_reason")),
                stage=_text(entry.get("stage")),
                skip_reason=_text(entry.get("skip_reason")),
                digest=_text(entry.get("digest")),
                logs=_logs(folder, entry, row),
                row=row,
                failure=failures_by_episode.get(key),
            )
        )
    return TasksetResults(
        folder=folder,
        summary=summary,
        episodes=tuple(episodes),
        rows=tuple(rows),
        failures=tuple(failures),
        check=_check(folder / CHECK, notes),
        notes=tuple(notes),
    )


def _named(folder: Path, files: Mapping[str, Any], name: str, default: str) -> Path:
    relative = files.get(name)
    return folder / (relative if isinstance(relative, str) else default)


def _json_lines(path: Path, notes: list[str]) -> Iterator[dict[str, Any]]:
    """The rows of `path` (objects with a `task_id`); the lines that are not rows are
    counted in a note."""
    try:
        # NaN and Infinity (which older versions wrote, and which are not JSON) read as null.
        lines = read_rows(path, constants="null")
    except FileNotFoundError:
        return
    except OSError as error:
        notes.append(f"{path.name}: cannot read it ({error})")
        return
    bad = 0
    for line in lines:
        if line.row is not None and "task_id" in line.row:
            yield line.row
        else:
            bad += 1
    if bad:
        notes.append(f"{path.name}: {bad} line(s) that are not rows were left out")


def _check(path: Path, notes: list[str]) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = _loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        notes.append(f"{CHECK}: cannot read it ({error})")
        return None
    if not isinstance(data, dict) or not isinstance(data.get("tasks"), dict):
        notes.append(f'{CHECK}: no "tasks" object in it')
        return None
    return data


def _logs(
    folder: Path, entry: Mapping[str, Any], row: Mapping[str, Any] | None
) -> tuple[TurnLogs, ...]:
    """The summary's paths, resolved against its folder; else the row's own folders."""
    logs = entry.get("logs")
    if isinstance(logs, list) and logs:
        return tuple(
            TurnLogs(
                step=str(turn.get("step") or ""),
                **{
                    name: _existing(folder, turn.get(name))
                    for name in (
                        "verifier_dir",
                        "test_stdout",
                        "reward_file",
                        "trajectory",
                        "agent_dir",
                        "agent_log",
                    )
                },
            )
            for turn in logs
            if isinstance(turn, dict)
        )
    if row is None:
        return ()
    found = []
    turns = row.get("turns")
    for turn in turns if isinstance(turns, list) else ():
        if not isinstance(turn, dict):
            continue
        directory = _existing(folder, turn.get("verifier_logs_dir"))
        found.append(
            TurnLogs(
                step=str(turn.get("step") or ""),
                verifier_dir=directory,
                test_stdout=_file(directory, "test-stdout.txt"),
                reward_file=_file(directory, "reward.json") or _file(directory, "reward.txt"),
                trajectory=_file(directory, "trajectory.json"),
            )
        )
    return tuple(found)


def _existing(folder: Path, relative: object) -> Path | None:
    if not isinstance(relative, str) or not relative:
        return None
    path = folder / relative
    return path if path.exists() else None


def _file(directory: Path | None, name: str) -> Path | None:
    if directory is None:
        return None
    path = directory / name
    return path if path.is_file() else None


def _key(data: Mapping[str, Any]) -> tuple[str, int]:
    return str(data.get("task_id")), _int(data.get("repeat"))


def _text(value: object) -> str | None:
    """A text field of a file a run (or a hostile task) wrote: None stays None, any other
    value shows as its text, never as an object the page would trip on."""
    return None if value is None else str(value)


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0


def _loads(text: str) -> Any:
    """JSON as a run writes it; NaN and Infinity (which older versions wrote, and which
    are not JSON) read as null. Raises ValueError with the reason a text has no value."""
    value, error = load_json(text, constants="null")
    if error is not None:
        raise ValueError(error)
    return value


def _timings(row: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return as_mapping((row or {}).get("timings"))


def as_mapping(value: object) -> Mapping[str, Any]:
    """A JSON object read from a file, or an empty one when it is something else."""
    return value if isinstance(value, dict) else {}
