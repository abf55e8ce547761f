"""How long each task takes: recorded per results folder (`durations.json`, beside the
rows), and the expected time of a trial that orders the run longest first.

Without a record, a task is expected to take its time budget (the agent's and the
verifier's timeouts, as the episode's deadline adds them up): always more than it really
takes, so the tasks nothing is known of start first, longest budget first.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pytest_harbor import strict_json
from pytest_harbor.engine.budget import episode_budget
from pytest_harbor.engine.failures import EpisodeError
from pytest_harbor.settings import HarborSettings
from pytest_harbor.tasks.task import Task
from pytest_harbor.untrusted import load_json

__all__ = ["HISTORY_FILE", "expected_seconds", "read_history", "record_history"]

HISTORY_FILE = "durations.json"


def read_history(folder: Path) -> dict[str, dict[str, float]]:
    """task id -> {"episode_s", "build_s"} as earlier runs recorded them ({} if none)."""
    try:
        data, _ = load_json((folder / HISTORY_FILE).read_bytes())
    except OSError:
        return {}
    tasks = data.get("tasks") if isinstance(data, dict) else None
    if not isinstance(tasks, dict):
        return {}
    return {
        str(task): {
            key: number
            for key, value in record.items()
            if (number := strict_json.as_float(value)) is not None
        }
        for task, record in tasks.items()
        if isinstance(record, dict)
    }


def record_history(folder: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    """Add this run's rows to the record: each task's median episode time (seed to the
    end of its last turn) and its longest build."""
    history = read_history(folder)
    episodes: dict[str, list[float]] = {}
    builds: dict[str, float] = {}
    for row in rows:
        timings = row.get("timings") or {}
        task = str(row.get("task_id"))
        spent = sum(float(timings.get(phase) or 0.0) for phase in ("seed_s", "agent_s", "verify_s"))
        if spent > 0 and not row.get("partial"):
            episodes.setdefault(task, []).append(spent)
        build = float(timings.get("build_s") or 0.0) + float(timings.get("agent_install_s") or 0.0)
        if build > 1.0:  # found in the cache takes well under a second
            builds[task] = max(build, builds.get(task, 0.0))
    for task, values in episodes.items():
        history.setdefault(task, {})["episode_s"] = round(statistics.median(values), 3)
    for task, seconds in builds.items():
        history.setdefault(task, {})["build_s"] = round(seconds, 3)
    if not episodes and not builds:
        return
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / HISTORY_FILE
    staged = target.with_suffix(".tmp")
    staged.write_text(strict_json.dumps({"tasks": history}, indent=1, sort_keys=True) + "\n")
    staged.replace(target)


def expected_seconds(
    task: Task, settings: HarborSettings, history: Mapping[str, Mapping[str, float]]
) -> float:
    """What one trial of `task` is expected to take (see the module's docstring)."""
    record = history.get(task.id) or {}
    if "episode_s" in record:
        return record["episode_s"]
    try:
        return episode_budget(task, settings, separate_verifier=False).deadline_s
    except EpisodeError:
        return 0.0  # refused at seed: it takes no time
