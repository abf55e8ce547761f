"""A comparison of two runs as one self-contained HTML page (the report's style sheet and
sorting script inline; nothing from the network), opened from disk.

Everything taken from the results (task ids, reasons, failure kinds, paths) is escaped
here, and the caller escapes control and format characters in the whole page: a task
names itself, and a hostile one must show as text.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from html import escape
from pathlib import Path

from pytest_harbor.display import escape_controls, shown_number
from pytest_harbor.redaction import clip_head
from pytest_harbor.report.assets import CSS, SCRIPT
from pytest_harbor.report.compare import (
    Change,
    Comparison,
    EpisodeChange,
    TaskChange,
)
from pytest_harbor.report.compare_table import (
    overall_figures,
    shown_cost,
    shown_seconds,
    shown_side,
)
from pytest_harbor.report.results import Episode, TasksetResults, as_mapping
from pytest_harbor.writers.files import write_atomically

__all__ = ["COMPARISON", "render_comparison", "write_comparison"]

#: The page's name in the NEW run's folder, unless told otherwise.
COMPARISON = "compare.html"

#: How much of a failure reason the page shows.
_REASON_LIMIT = 2000
#: Marks that tell the two flips apart without colour.
_MARKS = {Change.REGRESSED: "▼", Change.FIXED: "▲", Change.NEW_FAILURE: "✗"}
_EXTRA_CSS = """
.change-regressed,.change-new-failure{background:#fbe3e1}.change-fixed{background:#e3f4e1}
td.change{font-weight:600;white-space:nowrap}
.task-changed{background:#fff6d6;border-radius:4px;padding:0 4px;font-size:12px}
table.runs th{text-align:right}
"""


def render_comparison(comparison: Comparison, *, generated_at: str) -> str:
    """The whole page."""
    old, new = comparison.old, comparison.new
    title = f"{old.name} → {new.name}" if old.name != new.name else old.name
    parts = [
        _runs(old, new),
        *(f'<p class="note difference">{escape(text)}</p>' for text in comparison.differences),
        _overall(comparison),
        _flips(comparison.flips()),
        _new_failures(comparison.new_failures()),
        _tasks(comparison.tasks),
        _only("Only in OLD", "only-old", comparison.only_old, old),
        _only("Only in NEW", "only-new", comparison.only_new, new),
    ]
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>pytest-harbor comparison: {escape(title)}</title>"
        f"<style>{CSS}{_EXTRA_CSS}</style></head><body>"
        f'<header><h1>pytest-harbor comparison</h1><p class="meta">{escape(title)} · '
        f"made {escape(generated_at)}</p></header>"
        + "".join(parts)
        + f"<script>{SCRIPT}</script></body></html>\n"
    )


def _runs(old: TasksetResults, new: TasksetResults) -> str:
    facts = [
        ("folder", str(old.folder), str(new.folder)),
        ("taskset", old.name, new.name),
        *(
            (label, _fact(old, key), _fact(new, key))
            for key, label in (
                ("agent", "agent"),
                ("model", "model"),
                ("sandbox", "sandbox"),
                ("repeats", "repeats"),
                ("run_id", "run"),
                ("started_at", "started"),
                ("finished_at", "finished"),
                ("dataset_digest", "dataset digest"),
            )
        ),
    ]
    rows = "".join(
        f"<tr><th>{escape(label)}</th><td>{escape(before)}</td><td>{escape(after)}</td>"
        + ("<td>differs</td>" if before != after else "<td></td>")
        + "</tr>"
        for label, before, after in facts
    )
    return (
        '<h2>Runs</h2><table class="runs"><thead><tr><th></th><th>OLD</th><th>NEW</th>'
        f"<th></th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _fact(results: TasksetResults, key: str) -> str:
    value = results.summary.get(key)
    if key == "model":
        model = as_mapping(value)
        value = model.get("name") if model else value
    return "\u2013" if value is None else str(value)


def _overall(comparison: Comparison) -> str:
    rows = "".join(
        f"<tr><th>{escape(label)}</th><td>{escape(before)}</td><td>{escape(after)}</td></tr>"
        for label, before, after in overall_figures(comparison)
    )
    flips = comparison.flips()
    down = sum(episode.change is Change.REGRESSED for episode in flips)
    return (
        '<h2>Overall</h2><table class="overall"><thead><tr><th></th><th>OLD</th><th>NEW</th>'
        f"</tr></thead><tbody>{rows}</tbody></table>"
        f'<p class="counts">{down} passed→failed · {len(flips) - down} failed→passed · '
        f"{len(comparison.new_failures())} new failure(s) · {len(comparison.tasks)} task(s) "
        f"in both runs</p>"
    )


def _flips(flips: Sequence[EpisodeChange]) -> str:
    if not flips:
        return '<h2 id="flips">Flips</h2><p class="empty">No episode flipped.</p>'
    rows = "".join(
        f'<tr class="flip {_css(episode.change)}"><td>{escape(episode.task_id)}</td>'
        f"<td>r{episode.repeat}</td>{_status_cell(episode.before)}"
        f"{_status_cell(episode.after)}{_change_cell(episode.change)}</tr>"
        for episode in flips
    )
    return (
        '<h2 id="flips">Flips</h2><table class="flips"><thead><tr><th>Task</th>'
        "<th>Repeat</th><th>OLD</th><th>NEW</th><th>Change</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )


def _new_failures(failures: Sequence[EpisodeChange]) -> str:
    head = '<h2 id="new-failures">New failures</h2>'
    if not failures:
        return head + '<p class="empty">No new failure.</p>'
    rows = []
    for episode in failures:
        after = episode.after
        kind = after.failure_name if after is not None else ""
        reason = (after.failure_reason if after is not None else None) or ""
        stage = (after.stage if after is not None else None) or ""
        rows.append(
            f'<tr class="new-failure"><td>{escape(episode.name)}</td>'
            f"{_status_cell(episode.before)}{_status_cell(episode.after)}"
            f'<td class="kind">{escape(kind)}</td><td>{escape(stage)}</td>'
            f'<td class="reason">{escape(clip_head(reason, _REASON_LIMIT))}</td></tr>'
        )
    return (
        head
        + '<p>No result, or failed, in NEW where OLD had neither.</p><table class="new-failures">'
        "<thead><tr><th>Episode</th><th>OLD</th><th>NEW</th><th>Failure kind</th>"
        f"<th>Stage</th><th>Reason</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _tasks(tasks: Sequence[TaskChange]) -> str:
    if not tasks:
        return '<h2 id="tasks">Tasks</h2><p class="empty">No task is in both runs.</p>'
    rows = "".join(_task_row(task) for task in tasks)
    return (
        '<h2 id="tasks">Tasks</h2><p>Every task both runs have, the most telling change '
        "first; with repeats, each repeat's reward below. A click on a column's head sorts."
        '</p><table class="tasks sortable"><thead><tr><th>Task</th><th>OLD</th><th>NEW</th>'
        "<th>Change</th><th>Δtime</th><th>Δcost (USD)</th><th>pass@k OLD</th>"
        f"<th>pass@k NEW</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _task_row(task: TaskChange) -> str:
    before = shown_side((e.before for e in task.episodes), task.reward_before)
    after = shown_side((e.after for e in task.episodes), task.reward_after)
    marker = ' <span class="task-changed">task changed</span>' if task.task_changed else ""
    repeats = ""
    if len(task.episodes) > 1:
        repeats = "".join(
            f'<div class="meta">r{e.repeat}: {escape(_side(e.before))} → {escape(_side(e.after))}'
            f"{' · ' + escape(e.change.value) if e.change is not Change.SAME else ''}</div>"
            for e in task.episodes
        )
    return (
        f'<tr class="task {_css(task.change)}"><td data-sort="{escape(task.task_id)}">'
        f"{escape(task.task_id)}{marker}</td>"
        f'<td data-sort="{_sort(task.reward_before)}">{escape(before)}</td>'
        f'<td data-sort="{_sort(task.reward_after)}">{escape(after)}{repeats}</td>'
        f'<td data-sort="{task.change.rank}" class="change {_css(task.change)}">'
        f"{_mark(task.change)}{escape(task.change.value)}</td>"
        f'<td data-sort="{_sort(task.time_delta)}">{escape(shown_seconds(task.time_delta))}</td>'
        f'<td data-sort="{_sort(task.cost_delta)}">{escape(shown_cost(task.cost_delta))}</td>'
        f"<td>{escape(_points(task.pass_at_k_before.items()))}</td>"
        f"<td>{escape(_points(task.pass_at_k_after.items()))}</td></tr>"
    )


def _only(title: str, anchor: str, tasks: Sequence[str], results: TasksetResults) -> str:
    """The tasks one run has, each with its episodes' statuses in that run."""
    if not tasks:
        return ""
    statuses: dict[str, list[str]] = {}
    for episode in results.episodes:
        statuses.setdefault(episode.task_id, []).append(_side(episode))
    items = "".join(
        f'<li>{escape(task)} <span class="meta">{escape(", ".join(statuses.get(task, [])))}'
        "</span></li>"
        for task in tasks
    )
    return f'<h2 id="{anchor}">{escape(title)} ({len(tasks)})</h2><ul class="{anchor}">{items}</ul>'


def _status_cell(episode: Episode | None) -> str:
    if episode is None:
        return '<td class="absent">\u2013</td>'
    return f'<td class="s-{escape(episode.status)}">{escape(_side(episode))}</td>'


def _change_cell(change: Change) -> str:
    return f'<td class="change {_css(change)}">{_mark(change)}{escape(change.value)}</td>'


def _side(episode: Episode | None) -> str:
    if episode is None:
        return "\u2013"
    status = episode.status.replace("_", " ")
    if episode.reward is None:
        return status
    return f"{status} {shown_number(episode.reward)}"


def _mark(change: Change) -> str:
    mark = _MARKS.get(change)
    return f"{mark} " if mark else ""


def _css(change: Change) -> str:
    return "change-" + change.name.lower().replace("_", "-")


def _points(points: Iterable[tuple[int, float]]) -> str:
    return ", ".join(f"pass@{k} {shown_number(value)}" for k, value in sorted(points)) or "\u2013"


def _sort(value: float | None) -> str:
    return "" if value is None else f"{value:.6f}"


def write_comparison(comparison: Comparison, out: Path) -> Path:
    """Write the comparison's page to `out` (atomically), control and format characters
    anywhere in it escaped as text (a bidi override cannot make a name read otherwise)."""
    generated_at = datetime.now(UTC).isoformat(timespec="seconds")
    write_atomically(out, escape_controls(render_comparison(comparison, generated_at=generated_at)))
    return out
