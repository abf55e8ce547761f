"""The report page: one self-contained HTML file (inline CSS and SVG, a few lines of script
for sorting tables that the page does not need to be read).

Everything taken from the results (task ids, reasons, agent output, trajectories) is
escaped: an agent's output is adversarial and must show as text.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pytest_harbor import strict_json
from pytest_harbor.display import shown_number
from pytest_harbor.redaction import clip_head
from pytest_harbor.report.assets import CSS, SCRIPT
from pytest_harbor.report.charts import (
    histogram,
    histogram_svg,
    pass_at_k_svg,
    timeline,
    timeline_svg,
)
from pytest_harbor.report.live import LiveNote, live_banner, live_head
from pytest_harbor.report.results import Episode, TasksetResults, TurnLogs, as_mapping
from pytest_harbor.report.spend import spend_table
from pytest_harbor.report.transcripts import Budget, text_tail_html, transcript_html

__all__ = ["render_page"]

#: The statuses of episodes, in the order the page lists them.
STATUSES = ("passed", "failed", "masked", "partial", "no_result", "skipped", "not_run")
#: How much of each test-stdout.txt the transcripts embed (its end).
_STDOUT_TAIL = 4000
#: How much of a failure reason the failures section shows.
_REASON_LIMIT = 2000


def render_page(
    tasksets: Sequence[TasksetResults],
    out: Path,
    *,
    generated_at: str,
    budget: Budget,
    live: LiveNote | None = None,
) -> str:
    """The whole page, with links relative to `out`'s folder; with `live`, the page of a
    run in progress, which says so and refreshes itself."""
    base = out.parent
    names = ", ".join(taskset.name for taskset in tasksets)
    nav = ""
    if len(tasksets) > 1:
        nav = (
            "<nav><ul>"
            + "".join(
                f'<li><a href="#ts{index}">{escape(taskset.name)}</a> '
                f'<span class="meta">{escape(str(taskset.summary.get("agent") or ""))}</span></li>'
                for index, taskset in enumerate(tasksets)
            )
            + "</ul></nav>"
        )
    # The task check comes first: an author reads it before any score.
    checks = "".join(
        _check(taskset.name, taskset.check) for taskset in tasksets if taskset.check is not None
    )
    body = checks + "".join(
        _taskset(index, taskset, base, budget) for index, taskset in enumerate(tasksets)
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"{live_head(live)}<title>pytest-harbor report: {escape(names)}</title>"
        f"<style>{CSS}</style></head><body>"
        f'<header><h1>pytest-harbor report</h1><p class="meta">{escape(names)} · '
        f"made {escape(generated_at)}</p>{live_banner(live)}</header>{nav}{body}"
        f"<script>{SCRIPT}</script></body></html>\n"
    )


def _taskset(index: int, taskset: TasksetResults, base: Path, budget: Budget) -> str:
    summary = taskset.summary
    anchor = f"ts{index}"
    episodes = taskset.episodes
    parts = [
        f'<section class="taskset" id="{anchor}"><h2>{escape(taskset.name)}</h2>',
        _run_line(summary),
    ]
    notes = list(taskset.notes)
    if summary.get("interrupted"):
        notes.insert(
            0,
            "The run was interrupted: some episodes did not run. The same command with "
            "--harbor-resume runs only those, keeping what is here.",
        )
    parts.extend(f'<p class="note">{escape(note)}</p>' for note in notes)
    parts.append(_summary(summary))
    if not episodes:
        parts.append('<p class="empty">No episodes in this run.</p></section>')
        return "".join(parts)
    rewards = [
        episode.reward
        for episode in episodes
        if episode.status in ("passed", "failed") and episode.reward is not None
    ]
    parts.append("<h3>Rewards</h3>")
    if rewards:
        parts.append(
            f"<p>{len(rewards)} scored episode(s).</p>" + histogram_svg(histogram(rewards))
        )
    else:
        parts.append('<p class="empty">No scored episode.</p>')
    parts.append(_pass_at_k(summary))
    parts += [_task_table(anchor, taskset, base), spend_table(summary), _timeline(episodes)]
    parts.append(_failures(anchor, taskset, base))
    parts.append(_transcripts(anchor, taskset, base, budget))
    parts.append("</section>")
    return "".join(parts)


def _run_line(summary: Mapping[str, Any]) -> str:
    fields = [
        ("agent", summary.get("agent")),
        ("model", _model(summary.get("model"))),
        ("sandbox", summary.get("sandbox")),
        ("repeats", summary.get("repeats")),
        ("run", summary.get("run_id")),
        ("started", summary.get("started_at")),
        ("finished", summary.get("finished_at")),
    ]
    return (
        '<p class="meta">'
        + " · ".join(f"{name} {escape(str(value))}" for name, value in fields if value is not None)
        + "</p>"
    )


def _model(model: object) -> str | None:
    """`name at url` from the summary's model (an identity: name, base URL, parameters)."""
    if not isinstance(model, Mapping):
        return None if model is None else str(model)
    name = model.get("name")
    url = model.get("base_url") or model.get("url")
    if name and url:
        return f"{name} at {url}"
    return str(name or url) if (name or url) else None


# ---------------------------------------------------------------------------- sections


def _check(name: str, check: Mapping[str, Any]) -> str:
    tasks = check.get("tasks") or {}
    rows = []
    clean = 0
    for task_id, found in sorted(tasks.items()):
        problems = found.get("problems") if isinstance(found, dict) else None
        if not problems:
            clean += 1
            continue
        oracle = found.get("oracle_rewards") or []
        nop = found.get("nop_reward")
        for number, problem in enumerate(problems):
            problem = problem if isinstance(problem, dict) else {"kind": str(problem)}
            first = number == 0
            span = f' rowspan="{len(problems)}"' if first and len(problems) > 1 else ""
            rows.append(
                "<tr>"
                + (f"<td{span}>{escape(str(task_id))}</td>" if first else "")
                + f'<td class="kind">{escape(str(problem.get("kind", "?")))}</td>'
                + f"<td>{escape(str(problem.get('detail') or ''))}</td>"
                + (
                    f"<td{span}>{escape(', '.join(_number(value) for value in oracle))}</td>"
                    f"<td{span}>{escape(_number(nop))}</td>"
                    if first
                    else ""
                )
                + "</tr>"
            )
    with_problems = len(tasks) - clean
    head = (
        f"<p>{with_problems} task(s) with problems; {clean} task(s) without problems"
        + (
            f" (oracle run {escape(str(check['repeats']))} time(s) each)"
            if check.get("repeats")
            else ""
        )
        + ".</p>"
    )
    table = (
        '<table class="check"><thead><tr><th>Task</th><th>Problem</th><th>Detail</th>'
        "<th>Oracle rewards</th><th>nop reward</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
        if rows
        else ""
    )
    return f'<section class="task-check"><h2>Task check: {escape(name)}</h2>{head}{table}</section>'


def _summary(summary: Mapping[str, Any]) -> str:
    counts = as_mapping(summary.get("counts"))
    items = [
        ("episodes", counts.get("episodes", 0)),
        ("mean reward", _number(counts.get("mean_reward"))),
    ]
    items += [
        (status.replace("_", " "), counts.get(status, 0))
        for status in STATUSES
        if status in ("passed", "failed", "masked", "no_result") or counts.get(status)
    ]
    pass_at_k = _pass_points(summary)
    if pass_at_k:
        items += [(f"pass@{k}", _number(value)) for k, value in sorted(pass_at_k.items())]
    if isinstance(summary.get("usage"), dict):
        usage = as_mapping(summary["usage"])
        items += [
            (key.replace("_", " "), _count(usage.get(key, 0)))
            for key in ("prompt_tokens", "completion_tokens", "requests")
        ]
        cost = strict_json.as_float(usage.get("cost_usd"))
        if cost is not None:
            items.append(("cost", f"${cost:.4f}"))
    cells = "".join(
        f'<div class="figure"><span class="value">{escape(str(value))}</span>'
        f'<span class="label">{escape(label)}</span></div>'
        for label, value in items
    )
    return f'<h3>Summary</h3><div class="figures">{cells}</div>'


def _pass_points(summary: Mapping[str, Any]) -> dict[int, float]:
    raw = summary.get("pass_at_k")
    points = {}
    for k, value in raw.items() if isinstance(raw, dict) else ():
        if str(k).isdigit() and isinstance(value, int | float):
            points[int(k)] = float(value)
    return points


def _pass_at_k(summary: Mapping[str, Any]) -> str:
    points = _pass_points(summary)
    if not points:
        return ""
    if len(points) == 1:
        ((k, value),) = points.items()
        return f'<h3>pass@k</h3><p class="pass-at-k">pass@{k} = {value:.3f}</p>'
    return "<h3>pass@k</h3>" + pass_at_k_svg(points)


def _task_table(anchor: str, taskset: TasksetResults, base: Path) -> str:
    repeats = max(1, taskset.repeats)
    by_task: dict[str, dict[int, tuple[int, Episode]]] = {}
    for number, episode in enumerate(taskset.episodes):
        by_task.setdefault(episode.task_id, {})[episode.repeat] = (number, episode)
    head = (
        "<tr><th>Task</th><th>Status</th>"
        + "".join(f"<th>r{repeat}</th>" for repeat in range(repeats))
        + "<th>Mean reward</th><th>Failure kinds</th><th>Mean duration</th></tr>"
    )
    rows = []
    for task_id, found in by_task.items():
        episodes = [episode for _, episode in found.values()]
        statuses = Counter(episode.status for episode in episodes)
        status = ", ".join(
            f"{statuses[name]} {name.replace('_', ' ')}" for name in STATUSES if statuses[name]
        )
        scored = [
            e.reward for e in episodes if e.status in ("passed", "failed") and e.reward is not None
        ]
        mean = strict_json.mean(scored) if scored else None
        kinds = Counter(e.failure_kind for e in episodes if e.failure_kind)
        durations = [e.duration_s for e in episodes if e.duration_s is not None]
        duration = strict_json.mean(durations) if durations else None
        cells = []
        for repeat in range(repeats):
            if repeat not in found:
                cells.append('<td class="absent" data-sort="">\u2013</td>')
                continue
            number, episode = found[repeat]
            cells.append(_repeat_cell(f"{anchor}-ep{number}", episode, base))
        rows.append(
            f'<tr><td data-sort="{escape(task_id)}">{escape(task_id)}</td>'
            f'<td data-sort="{escape(status)}">{escape(status)}</td>'
            + "".join(cells)
            + f'<td data-sort="{_sort_number(mean)}">{_number(mean)}</td>'
            f"<td>{escape(', '.join(f'{kind} ({count})' for kind, count in kinds.items()))}</td>"
            f'<td data-sort="{_sort_number(duration)}">{_duration(duration)}</td></tr>'
        )
    return (
        f'<h3>Tasks</h3><table class="tasks sortable"><thead>{head}</thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _repeat_cell(episode_anchor: str, episode: Episode, base: Path) -> str:
    shown = (
        _number(episode.reward) if episode.reward is not None else episode.status.replace("_", " ")
    )
    title = episode.status + (f": {episode.failure_kind}" if episode.failure_kind else "")
    links = _links(episode, base, compact=True)
    duration = episode.duration_s
    return (
        f'<td class="s-{escape(episode.status)}" title="{escape(title)}" '
        f'data-sort="{_sort_number(episode.reward)}">'
        f'<a href="#{episode_anchor}">{escape(shown)}</a>'
        + (f'<div class="links">{links}</div>' if links else "")
        + (f'<div class="meta">{_duration(duration)}</div>' if duration is not None else "")
        + "</td>"
    )


def _links(episode: Episode, base: Path, *, compact: bool) -> str:
    """Links to the episode's verifier folder and, for a single-step episode, its
    test-stdout.txt and trajectory.json (a multi-step one has them per step)."""
    links = []
    if episode.episode_dir is not None:
        links.append(_link(episode.episode_dir, base, "dir" if compact else "verifier folder"))
    if len(episode.logs) == 1:
        logs = episode.logs[0]
        links += _file_links(logs, base, compact)
    return " ".join(links)


def _file_links(logs: TurnLogs, base: Path, compact: bool) -> list[str]:
    links = []
    if logs.test_stdout is not None:
        links.append(_link(logs.test_stdout, base, "out" if compact else "test-stdout.txt"))
    if logs.trajectory is not None:
        links.append(_link(logs.trajectory, base, "traj" if compact else "trajectory.json"))
    if logs.agent_log is not None:
        links.append(_link(logs.agent_log, base, "agent" if compact else logs.agent_log.name))
    elif logs.agent_dir is not None:
        links.append(_link(logs.agent_dir, base, "agent" if compact else "agent folder"))
    return links


def _timeline(episodes: Iterable[Episode]) -> str:
    chart = timeline(episodes)
    if not chart.lanes:
        return '<h3>Timeline</h3><p class="empty">No episode recorded its times.</p>'
    untimed = (
        f" {chart.untimed} episode(s) without recorded times are left out." if chart.untimed else ""
    )
    return (
        "<h3>Timeline</h3><p>One lane per worker; each episode's phases laid end to end from "
        f"its recorded start and durations.{untimed}</p>" + timeline_svg(chart)
    )


def _failures(anchor: str, taskset: TasksetResults, base: Path) -> str:
    groups: dict[str, list[tuple[int, Episode]]] = {}
    for number, episode in enumerate(taskset.episodes):
        if episode.status in ("passed", "skipped", "not_run") and not episode.failure_kind:
            continue
        # Nothing went wrong but the grade: that group shows the verifier's own words.
        groups.setdefault(episode.failure_name, []).append((number, episode))
    if not groups:
        return '<h3>Failures</h3><p class="empty">No failures.</p>'
    parts = ["<h3>Failures</h3>"]
    for kind, members in sorted(groups.items(), key=lambda item: (-len(item[1]), item[0])):
        rows = "".join(
            f'<tr><td><a href="#{anchor}-ep{number}">{escape(episode.name)}</a></td>'
            f'<td class="s-{escape(episode.status)}">{_status(episode.status)}</td>'
            f"<td>{escape(episode.stage or '')}</td>"
            f'<td class="reason">{_reason(episode)}</td>'
            f"<td>{_links(episode, base, compact=False)}</td></tr>"
            for number, episode in members
        )
        parts.append(
            f'<details class="failure-kind" open><summary><strong>{escape(kind)}</strong> '
            f"({len(members)})</summary><table><thead><tr><th>Episode</th><th>Status</th>"
            "<th>Stage</th><th>Reason</th><th>Logs</th></tr></thead>"
            f"<tbody>{rows}</tbody></table></details>"
        )
    return "".join(parts)


def _reason(episode: Episode) -> str:
    """Why an episode failed, on the page without a click: its reason; else (a plain low
    reward) the last lines of its test-stdout.txt."""
    if episode.failure_reason:
        return escape(_cut(episode.failure_reason, _REASON_LIMIT))
    lines = _last_lines(episode)
    if not lines:
        return '<span class="empty">(the verifier printed nothing)</span>'
    return f'<pre class="log">{escape(chr(10).join(lines))}</pre>'


def _last_lines(episode: Episode, count: int = 6) -> list[str]:
    for logs in reversed(episode.logs):
        if logs.test_stdout is None:
            continue
        try:
            with logs.test_stdout.open("rb") as stream:
                size = stream.seek(0, 2)
                stream.seek(max(0, size - 4000))
                text = stream.read().decode("utf-8", errors="replace")
        except OSError:
            return []
        lines = [line for line in text.splitlines() if line.strip()][-count:]
        return [_cut(line, 300) for line in lines]
    return []


def _transcripts(anchor: str, taskset: TasksetResults, base: Path, budget: Budget) -> str:
    parts = ["<h3>Episodes and transcripts</h3>"]
    for number, episode in enumerate(taskset.episodes):
        reward = "" if episode.reward is None else f" · reward {_number(episode.reward)}"
        parts.append(
            f'<details class="episode" id="{anchor}-ep{number}"><summary>'
            f'<span class="s-{escape(episode.status)}">{escape(episode.status.replace("_", " "))}'
            f"</span> {escape(episode.name)}{escape(reward)}</summary>"
        )
        facts = [
            ("failure kind", episode.failure_kind),
            ("reason", episode.failure_reason),
            ("stage", episode.stage),
            ("skipped", episode.skip_reason),
            ("worker", (episode.row or {}).get("worker")),
            ("duration", _duration(episode.duration_s) if episode.duration_s is not None else None),
        ]
        parts.append(
            "<dl>"
            + "".join(
                f"<dt>{name}</dt><dd>{escape(_cut(str(value), _REASON_LIMIT))}</dd>"
                for name, value in facts
                if value
            )
            + "</dl>"
        )
        turns = {
            str(turn.get("step")): turn
            for turn in (episode.row or {}).get("turns") or ()
            if isinstance(turn, dict)
        }
        for logs in episode.logs:
            parts.append(_turn(logs, turns.get(logs.step), len(episode.logs) > 1, base, budget))
        if not episode.logs:
            parts.append('<p class="empty">No verifier logs.</p>')
        parts.append("</details>")
    return "".join(parts)


def _turn(
    logs: TurnLogs, turn: Mapping[str, Any] | None, named: bool, base: Path, budget: Budget
) -> str:
    parts = ['<div class="turn">']
    if named:
        reward = "" if turn is None else f" · reward {_number(turn.get('reward'))}"
        parts.append(f"<h4>{escape(logs.step)}{escape(reward)}</h4>")
    if logs.verifier_dir is None:
        parts.append('<p class="empty">No verifier logs.</p></div>')
        return "".join(parts)
    links = [_link(logs.verifier_dir, base, "verifier folder")]
    links += _file_links(logs, base, compact=False)
    if logs.reward_file is not None:
        links.append(_link(logs.reward_file, base, logs.reward_file.name))
    parts.append(f'<p class="links">{" · ".join(links)}</p>')
    if logs.test_stdout is not None:
        parts.append(
            "<details><summary>test-stdout.txt (its end)</summary>"
            + text_tail_html(logs.test_stdout, _STDOUT_TAIL, budget)
            + "</details>"
        )
    if logs.trajectory is not None:
        parts.append(
            '<details class="trajectory"><summary>transcript</summary>'
            + transcript_html(logs.trajectory, _href(logs.trajectory, base), budget)
            + "</details>"
        )
    else:
        parts.append('<p class="empty">No trajectory.json.</p>')
    parts.append("</div>")
    return "".join(parts)


# ---------------------------------------------------------------------------- pieces


def _href(path: Path, base: Path) -> str:
    """A link relative to the report's folder (so the folder can move), escaped for an
    attribute. Quoting also keeps a path from reading as a scheme (`javascript:`)."""
    relative = os.path.relpath(path, base).replace(os.sep, "/")
    if path.is_dir():
        relative += "/"
    return escape(quote(relative, safe="/"))


def _link(path: Path, base: Path, label: str) -> str:
    return f'<a href="{_href(path, base)}">{escape(label)}</a>'


def _number(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "\u2013"
    return shown_number(value)


def _count(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int) or value.bit_length() > 64:
        return "\u2013"
    return f"{value:,}"


def _sort_number(value: float | None) -> str:
    return "" if value is None else f"{value:.6f}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "\u2013"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"


def _status(status: str) -> str:
    return escape(status.replace("_", " "))


def _cut(text: str, limit: int) -> str:
    return clip_head(text, limit)
