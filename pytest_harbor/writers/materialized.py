"""The files written before any episode: `tasks_<agent>.jsonl` and `skipped.json`."""

from __future__ import annotations

from typing import Any

from pytest_harbor import strict_json
from pytest_harbor.run.planning import TasksetPlan
from pytest_harbor.tasks import SINGLE_STEP_TURN, Task
from pytest_harbor.writers.files import write_atomically
from pytest_harbor.writers.rollouts import ResultsLayout

__all__ = ["SkippedLog", "task_rows", "write_task_rows"]


def task_rows(plan: TasksetPlan) -> list[dict[str, Any]]:
    """One row per task and repeat: its instruction (or one per turn) and its digest."""
    rows = []
    for task in plan.tasks:
        for repeat in range(plan.repeats):
            row: dict[str, Any] = {
                "task_id": task.id,
                "taskset": plan.taskset,
                "repeat": repeat,
                "digest": task.digest,
            }
            row.update(_inputs(task))
            rows.append(row)
    return rows


def _inputs(task: Task) -> dict[str, Any]:
    if len(task.turns) == 1 and task.turns[0].name == SINGLE_STEP_TURN:
        return {"instruction": task.turns[0].instruction}
    return {"turns": [{"step": turn.name, "instruction": turn.instruction} for turn in task.turns]}


def write_task_rows(layout: ResultsLayout, agent: str, plan: TasksetPlan) -> None:
    path = layout.tasks_file(plan.taskset, agent)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = "".join(strict_json.dumps(row, sort_keys=True) + "\n" for row in task_rows(plan))
    write_atomically(path, lines)


class SkippedLog:
    """`skipped.json` per taskset: task id -> why it was left out; `{}` when none was.
    Written once the taskset's folder has begun (see RolloutsWriter), and on every change
    after that."""

    def __init__(self, layout: ResultsLayout) -> None:
        self.layout = layout
        self._entries: dict[str, dict[str, str]] = {}
        self._open: set[str] = set()

    def start(self, taskset: str, entries: dict[str, str]) -> None:
        self._entries[taskset] = dict(entries)

    def open(self, taskset: str) -> None:
        """The taskset's folder has begun: write the file, and keep it up to date."""
        self._open.add(taskset)
        self._write(taskset)

    def add(self, taskset: str, task_id: str, reason: str) -> None:
        self._entries.setdefault(taskset, {})[task_id] = reason
        if taskset in self._open:
            self._write(taskset)

    def entries(self, taskset: str) -> dict[str, str]:
        return dict(self._entries.get(taskset, {}))

    def _write(self, taskset: str) -> None:
        path = self.layout.skipped_file(taskset)
        path.parent.mkdir(parents=True, exist_ok=True)
        entries = self._entries.get(taskset, {})
        text = strict_json.dumps(dict(sorted(entries.items())), indent=2) + "\n"
        write_atomically(path, text)
