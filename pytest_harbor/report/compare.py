"""Two runs of a taskset side by side: per task and repeat, what changed between an older
run folder and a newer one (flips, new failures, rewards, time and cost), read with the
report's own loader. No HTML and no terminal here: the page and the table render this.

The files are untrusted (a task names itself and writes its own reasons): every value is
type-checked as it is read, and what cannot be read is a ReportError that names the file.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import Any

from pytest_harbor import strict_json
from pytest_harbor.display import one_line
from pytest_harbor.report.results import (
    Episode,
    ReportError,
    TasksetResults,
    as_mapping,
    load_taskset,
)
from pytest_harbor.untrusted import load_json
from pytest_harbor.writers.rollouts import SUMMARY

__all__ = [
    "RUNS",
    "Change",
    "Comparison",
    "EpisodeChange",
    "TaskChange",
    "compare_runs",
    "latest_two",
    "pass_at_k",
    "run_summary_file",
]

#: The folder of a taskset's results that holds one folder per run (`runs/<run-name>/`).
RUNS = "runs"
#: The statuses that mean an episode did not pass: scored below the mark, or no result.
BAD = frozenset({"failed", "no_result"})
#: How many changed tasks the header names (each is marked in the tasks too).
_NAMED = 10
#: A name shown as it is in prose; any other is quoted.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9._/-]+")


class Change(Enum):
    """How one episode (or a task, by its most telling episode) changed, most telling
    first: the order the table and the page list them in."""

    REGRESSED = "passed→failed"
    NEW_FAILURE = "new failure"
    FIXED = "failed→passed"
    REWARD = "reward changed"
    STATUS = "status changed"
    SAME = "unchanged"

    @property
    def rank(self) -> int:
        return list(Change).index(self)

    @property
    def is_flip(self) -> bool:
        return self in (Change.REGRESSED, Change.FIXED)


@dataclass(frozen=True)
class EpisodeChange:
    """One task and repeat in both runs (either side None when that run lacks it)."""

    task_id: str
    repeat: int
    before: Episode | None
    after: Episode | None

    @property
    def change(self) -> Change:
        return episode_change(self.before, self.after)

    @property
    def name(self) -> str:
        return f"{self.task_id}__r{self.repeat}"

    @property
    def time_delta(self) -> float | None:
        return _delta(_duration(self.before), _duration(self.after))

    @property
    def cost_delta(self) -> float | None:
        return _delta(_episode_cost(self.before), _episode_cost(self.after))

    @property
    def is_new_failure(self) -> bool:
        """No result, or failed, in NEW where OLD had neither (a flip to failed included)."""
        return self.change in (Change.REGRESSED, Change.NEW_FAILURE)


@dataclass(frozen=True)
class TaskChange:
    """One task present in both runs: its episodes paired by repeat, and its figures."""

    task_id: str
    episodes: tuple[EpisodeChange, ...]
    #: The two runs ran different task folders (their digests differ).
    task_changed: bool
    reward_before: float | None
    reward_after: float | None
    time_delta: float | None
    cost_delta: float | None
    pass_at_k_before: Mapping[int, float]
    pass_at_k_after: Mapping[int, float]

    @property
    def change(self) -> Change:
        return min((episode.change for episode in self.episodes), key=lambda c: c.rank)


@dataclass(frozen=True)
class Comparison:
    """An older run (OLD) and a newer one (NEW) of a taskset, task by task."""

    old: TasksetResults
    new: TasksetResults
    #: The tasks both runs have, the most telling change first.
    tasks: tuple[TaskChange, ...]
    only_old: tuple[str, ...]
    only_new: tuple[str, ...]
    #: What makes the runs less than comparable (another dataset, changed tasks), said
    #: in the header of the page and the table.
    differences: tuple[str, ...]

    def episodes(self) -> list[EpisodeChange]:
        return [episode for task in self.tasks for episode in task.episodes]

    def flips(self) -> list[EpisodeChange]:
        return [episode for episode in self.episodes() if episode.change.is_flip]

    def new_failures(self) -> list[EpisodeChange]:
        return [episode for episode in self.episodes() if episode.is_new_failure]


# ---------------------------------------------------------------------------- finding runs


def run_summary_file(folder: Path) -> Path:
    """The run summary of a run folder; a ReportError naming the path when there is none."""
    if not folder.exists():
        raise ReportError(f"{folder}: no such folder")
    if not folder.is_dir():
        raise ReportError(
            f"{folder} is a file, not a run folder: give the folder holding {SUMMARY}"
        )
    summary = folder / SUMMARY
    if not summary.is_file():
        raise ReportError(
            f"{folder} holds no {SUMMARY}: give a run's folder (one that holds it, such as "
            f"results/harbor/<taskset>/{RUNS}/<run-name>), or one taskset folder holding {RUNS}/"
        )
    return summary


def latest_two(taskset: Path) -> tuple[Path, Path]:
    """The run folders of the two latest runs under `taskset/runs/`, older first, ordered
    by their summaries' `started_at` (then by folder name)."""
    if not taskset.is_dir():
        run_summary_file(taskset)  # raises the error that names what `taskset` is
    summaries = sorted((taskset / RUNS).glob(f"*/{SUMMARY}"))
    if len(summaries) < 2:
        raise ReportError(
            f"{taskset} holds {len(summaries)} run(s) under {RUNS}/ (folders with a {SUMMARY}): "
            "comparing needs two; or give two run folders, OLD and NEW"
        )
    ordered = sorted(summaries, key=lambda path: (_started_at(path), path.parent.name))
    return ordered[-2].parent, ordered[-1].parent


def _started_at(summary_file: Path) -> datetime:
    try:
        value, error = load_json(summary_file.read_text(encoding="utf-8"), constants="null")
    except (OSError, ValueError) as failure:
        raise ReportError(f"{summary_file}: cannot read the run summary ({failure})") from None
    if error is not None or not isinstance(value, dict):
        reason = error or "not a JSON object"
        raise ReportError(f"{summary_file}: cannot read the run summary ({reason})")
    started = value.get("started_at")
    try:
        instant = datetime.fromisoformat(started) if isinstance(started, str) else None
    except ValueError:
        instant = None
    if instant is None:
        return datetime.min.replace(tzinfo=UTC)
    return instant if instant.tzinfo is not None else instant.replace(tzinfo=UTC)


# ---------------------------------------------------------------------------- comparing


def compare_runs(old_folder: Path, new_folder: Path) -> Comparison:
    """The comparison of two run folders (each holding a run summary)."""
    old = load_taskset(run_summary_file(old_folder))
    new = load_taskset(run_summary_file(new_folder))
    old_tasks, new_tasks = _by_task(old.episodes), _by_task(new.episodes)
    tasks = [
        _task_change(task_id, old_tasks[task_id], new_tasks[task_id], old, new)
        for task_id in old_tasks
        if task_id in new_tasks
    ]
    tasks.sort(key=lambda task: (task.change.rank, task.task_id))
    return Comparison(
        old=old,
        new=new,
        tasks=tuple(tasks),
        only_old=tuple(sorted(set(old_tasks) - set(new_tasks))),
        only_new=tuple(sorted(set(new_tasks) - set(old_tasks))),
        differences=tuple(_differences(old, new, tasks)),
    )


def episode_change(before: Episode | None, after: Episode | None) -> Change:
    """How an episode changed from OLD (`before`) to NEW (`after`); one table of cases."""
    was = before.status if before is not None else None
    now = after.status if after is not None else None
    if was == "passed" and now in BAD:
        return Change.REGRESSED
    if was in BAD and now == "passed":
        return Change.FIXED
    if now in BAD and (was not in BAD or (was, now) == ("failed", "no_result")):
        return Change.NEW_FAILURE
    if was != now:
        return Change.STATUS
    if before is not None and after is not None and before.reward != after.reward:
        return Change.REWARD
    return Change.SAME


def _by_task(episodes: Iterable[Episode]) -> dict[str, dict[int, Episode]]:
    found: dict[str, dict[int, Episode]] = {}
    for episode in episodes:
        found.setdefault(episode.task_id, {})[episode.repeat] = episode
    return found


def _task_change(
    task_id: str,
    before: Mapping[int, Episode],
    after: Mapping[int, Episode],
    old: TasksetResults,
    new: TasksetResults,
) -> TaskChange:
    repeats = sorted(set(before) | set(after))
    old_digest, new_digest = _digest(before.values()), _digest(after.values())
    return TaskChange(
        task_id=task_id,
        episodes=tuple(
            EpisodeChange(task_id, repeat, before.get(repeat), after.get(repeat))
            for repeat in repeats
        ),
        task_changed=None not in (old_digest, new_digest) and old_digest != new_digest,
        reward_before=_mean_reward(before.values()),
        reward_after=_mean_reward(after.values()),
        time_delta=_delta(_mean_duration(before.values()), _mean_duration(after.values())),
        cost_delta=_delta(_task_cost(old, task_id), _task_cost(new, task_id)),
        pass_at_k_before=pass_at_k(old.summary, task_id),
        pass_at_k_after=pass_at_k(new.summary, task_id),
    )


def _differences(
    old: TasksetResults, new: TasksetResults, tasks: Sequence[TaskChange]
) -> list[str]:
    found = []
    if old.name != new.name:
        found.append(
            f"different datasets: OLD is {one_line(old.name)!r}, NEW is {one_line(new.name)!r}"
        )
    old_digest = _text(old.summary.get("dataset_digest"))
    new_digest = _text(new.summary.get("dataset_digest"))
    if old_digest and new_digest and old_digest != new_digest:
        found.append(
            f"different dataset digests: OLD {_short(old_digest)}, NEW {_short(new_digest)}"
        )
    changed = [task.task_id for task in tasks if task.task_changed]
    if changed:
        named = ", ".join(_quoted(task) for task in changed[:_NAMED])
        more = f" and {len(changed) - _NAMED} more" if len(changed) > _NAMED else ""
        found.append(
            f"{len(changed)} task(s) changed between the runs (another digest): {named}{more}"
        )
    return found


def _quoted(name: str) -> str:
    """A name from the files for a line of prose: one line, and quoted unless it is a
    plain name (a comma or a space in it could read as two names)."""
    shown = one_line(name)
    return shown if _PLAIN_NAME.fullmatch(shown) else repr(shown)


def pass_at_k(summary: Mapping[str, Any], task_id: str | None = None) -> dict[int, float]:
    """The summary's pass@k by k: overall (`pass_at_k`), or one task's
    (`pass_at_k_per_task`); values that are not numbers are left out."""
    if task_id is None:
        raw = as_mapping(summary.get("pass_at_k"))
    else:
        per_k = as_mapping(summary.get("pass_at_k_per_task"))
        raw = {k: as_mapping(tasks).get(task_id) for k, tasks in per_k.items()}
    points = {}
    for k, value in raw.items():
        number = strict_json.as_float(value)
        if str(k).isdigit() and number is not None and not isinstance(value, bool):
            points[int(k)] = number
    return points


def total_cost(results: TasksetResults) -> float | None:
    """What the run's agent spent on its model (the summary's `usage.cost_usd`)."""
    return strict_json.as_float(as_mapping(results.summary.get("usage")).get("cost_usd"))


def _task_cost(results: TasksetResults, task_id: str) -> float | None:
    usage = as_mapping(as_mapping(results.summary.get("usage_per_task")).get(task_id))
    return strict_json.as_float(usage.get("cost_usd"))


def _episode_cost(episode: Episode | None) -> float | None:
    if episode is None or episode.row is None:
        return None
    return strict_json.as_float(as_mapping(episode.row.get("usage")).get("cost_usd"))


def _duration(episode: Episode | None) -> float | None:
    return None if episode is None else episode.duration_s


def _mean_reward(episodes: Iterable[Episode]) -> float | None:
    scored = [
        e.reward for e in episodes if e.status in ("passed", "failed") and e.reward is not None
    ]
    return strict_json.mean(scored) if scored else None


def _mean_duration(episodes: Iterable[Episode]) -> float | None:
    durations = [d for d in (_duration(e) for e in episodes) if d is not None]
    return strict_json.mean(durations) if durations else None


def _digest(episodes: Iterable[Episode]) -> str | None:
    return next((e.digest for e in episodes if e.digest), None)


def _delta(before: float | None, after: float | None) -> float | None:
    if before is None or after is None:
        return None
    return strict_json.as_float(after - before)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _short(digest: str) -> str:
    return digest if len(digest) <= 19 else digest[:19] + "…"
