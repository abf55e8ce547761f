"""A comparison of two runs as a plain-text table for the terminal: the runs, the overall
figures, then the tasks that changed (flips and new failures first); the unchanged ones
are counted, not listed, unless asked for. Colour only on a terminal."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from pytest_harbor import strict_json
from pytest_harbor.display import escape_controls, shown_number
from pytest_harbor.report.compare import (
    Change,
    Comparison,
    EpisodeChange,
    TaskChange,
    pass_at_k,
    total_cost,
)
from pytest_harbor.report.results import Episode, TasksetResults, as_mapping

__all__ = ["comparison_table", "overall_figures", "shown_cost", "shown_seconds", "shown_side"]

COLUMNS = ("task", "before", "after", "change", "Δtime", "Δcost")
#: The widest a task's name is shown in the table (longer ones end in `…`).
NAME_WIDTH = 48
_DASH = "\u2013"
_RED, _GREEN, _RESET = "\x1b[31m", "\x1b[32m", "\x1b[0m"


def comparison_table(
    comparison: Comparison, *, show_all: bool = False, colour: bool = False
) -> str:
    """The whole text: a header naming both runs, what makes them differ, the overall
    figures, the table of tasks and the tasks only one run has."""
    lines = [
        f"OLD: {_run_line(comparison.old)}",
        f"NEW: {_run_line(comparison.new)}",
        *(f"! {difference}" for difference in comparison.differences),
        "",
    ]
    lines += _grid(("", "OLD", "NEW"), [list(row) for row in overall_figures(comparison)])
    flips, failures = comparison.flips(), comparison.new_failures()
    lines += [
        "",
        f"{sum(e.change is Change.REGRESSED for e in flips)} passed→failed, "
        f"{sum(e.change is Change.FIXED for e in flips)} failed→passed, "
        f"{len(failures)} new failure(s)",
        "",
    ]
    shown = [task for task in comparison.tasks if show_all or task.change is not Change.SAME]
    lines = [escape_controls(line) for line in lines]
    # The table's cells are escaped as the grid is laid out; colour comes after, as the
    # escaping would write its codes as text.
    lines += _task_lines(shown, colour)
    tail: list[str] = []
    hidden = len(comparison.tasks) - len(shown)
    if hidden:
        tail.append(f"{hidden} unchanged task(s) not shown (--all shows them)")
    tail += _new_failure_kinds(failures)
    for label, tasks in (
        ("only in OLD", comparison.only_old),
        ("only in NEW", comparison.only_new),
    ):
        if tasks:
            tail.append(f"{label} ({len(tasks)}): " + ", ".join(map(_name, tasks)))
    return "\n".join(lines + [escape_controls(line) for line in tail]) + "\n"


def _task_lines(tasks: Sequence[TaskChange], colour: bool) -> list[str]:
    """The table of `tasks`; with repeats, a changed task's repeats below it."""
    rows: list[list[str]] = []
    changes: list[Change] = []
    for task in tasks:
        rows.append(_task_row(task))
        changes.append(task.change)
        if len(task.episodes) > 1 and task.change is not Change.SAME:
            rows += [_episode_row(episode) for episode in task.episodes]
            changes += [episode.change for episode in task.episodes]
    if not rows:
        return ["(no task changed)"]
    head, *lines = _grid(COLUMNS, rows)
    if colour:
        lines = [_coloured(line, change) for line, change in zip(lines, changes, strict=True)]
    return [head, *lines]


def overall_figures(comparison: Comparison) -> list[tuple[str, str, str]]:
    """The figures of both runs, one (label, OLD, NEW) a line: counts, mean reward,
    pass@k, cost."""
    old, new = comparison.old.summary, comparison.new.summary
    old_counts, new_counts = as_mapping(old.get("counts")), as_mapping(new.get("counts"))
    figures = [
        (label, _count(old_counts.get(key)), _count(new_counts.get(key)))
        for key, label in (
            ("episodes", "episodes"),
            ("passed", "passed"),
            ("failed", "failed"),
            ("masked", "masked"),
            ("no_result", "no result"),
        )
    ]
    old_mean, new_mean = old_counts.get("mean_reward"), new_counts.get("mean_reward")
    figures.append(("mean reward", _reward(old_mean), _reward(new_mean)))
    old_k, new_k = pass_at_k(old), pass_at_k(new)
    for k in sorted(set(old_k) | set(new_k)):
        figures.append((f"pass@{k}", _reward(old_k.get(k)), _reward(new_k.get(k))))
    old_cost, new_cost = total_cost(comparison.old), total_cost(comparison.new)
    if old_cost is not None or new_cost is not None:
        figures.append(("cost (USD)", _money(old_cost), _money(new_cost)))
    return figures


def shown_side(episodes: Iterable[Episode | None], reward: float | None) -> str:
    """One side of a task or an episode: its (mean) reward, with how many passed when
    there are repeats; else its status."""
    present = [episode for episode in episodes if episode is not None]
    if not present:
        return _DASH
    if reward is None:
        statuses = dict.fromkeys(episode.status.replace("_", " ") for episode in present)
        return ", ".join(statuses)
    if len(present) == 1:
        return shown_number(reward)
    passed = sum(episode.status == "passed" for episode in present)
    return f"{shown_number(reward)} ({passed}/{len(present)} passed)"


def shown_seconds(delta: float | None) -> str:
    return _DASH if delta is None else f"{delta:+.1f} s"


def shown_cost(delta: float | None) -> str:
    return _DASH if delta is None else f"{delta:+.4f}"


def _task_row(task: TaskChange) -> list[str]:
    change = task.change.value + (" (task changed)" if task.task_changed else "")
    return [
        _name(task.task_id),
        shown_side((e.before for e in task.episodes), task.reward_before),
        shown_side((e.after for e in task.episodes), task.reward_after),
        change,
        shown_seconds(task.time_delta),
        shown_cost(task.cost_delta),
    ]


def _episode_row(episode: EpisodeChange) -> list[str]:
    def side(found: Episode | None) -> str:
        return shown_side([found], None if found is None else _scored(found))

    return [
        f"  r{episode.repeat}",
        side(episode.before),
        side(episode.after),
        episode.change.value,
        shown_seconds(episode.time_delta),
        shown_cost(episode.cost_delta),
    ]


def _new_failure_kinds(failures: Sequence[EpisodeChange]) -> list[str]:
    if not failures:
        return []
    lines = ["", "new failures:"]
    for episode in failures:
        after = episode.after
        kind = after.failure_name if after is not None else _DASH
        lines.append(f"  {_name(episode.name)}: {_name(kind)}")
    return lines


def _scored(episode: Episode) -> float | None:
    return episode.reward if episode.status in ("passed", "failed") else None


def _grid(head: Sequence[str], cells: Sequence[Sequence[str]]) -> list[str]:
    """Columns padded to their widest cell, each cell escaped and on one line."""
    rows = [[_one_line(cell) for cell in row] for row in cells]
    widths = [max(len(cells[column]) for cells in (head, *rows)) for column in range(len(head))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()
        for cells in (head, *rows)
    ]


def _coloured(line: str, change: Change) -> str:
    if change in (Change.REGRESSED, Change.NEW_FAILURE):
        return f"{_RED}{line}{_RESET}"
    if change is Change.FIXED:
        return f"{_GREEN}{line}{_RESET}"
    return line


def _run_line(results: TasksetResults) -> str:
    summary = results.summary
    facts = [
        str(results.folder),
        f"taskset {results.name}",
        *(
            f"{label} {summary[key]}"
            for key, label in (("agent", "agent"), ("run_id", "run"), ("started_at", "started"))
            if isinstance(summary.get(key), str | int)
        ),
    ]
    return _name(" · ".join(facts), 400)


def _one_line(text: str) -> str:
    return escape_controls(text).replace("\n", "\\n").replace("\t", "\\t")


def _name(text: str, width: int = NAME_WIDTH) -> str:
    """A name from the files, on one line and at most `width` characters."""
    shown = _one_line(text)
    if len(shown) <= width:
        return shown
    # Two long names alike in their first characters stay apart: a mark of the whole.
    mark = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:6]
    return f"{shown[: width - 8]}…~{mark}"


def _count(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int) or value.bit_length() > 64:
        return _DASH
    return str(value)


def _reward(value: object) -> str:
    number = strict_json.as_float(value)
    return _DASH if number is None else shown_number(number)


def _money(value: float | None) -> str:
    return _DASH if value is None else f"{value:.4f}"
