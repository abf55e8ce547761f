"""A trajectory (ATIF) drawn as a readable transcript, within a size budget: past it, the
page links to the full file instead of embedding it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from pytest_harbor.redaction import CUT
from pytest_harbor.untrusted import load_json

__all__ = ["TOTAL_LIMIT", "TRAJECTORY_LIMIT", "Budget", "text_tail_html", "transcript_html"]

#: Characters of one trajectory's text the page embeds; the rest is a link to the file.
TRAJECTORY_LIMIT = 200_000
#: Characters of trajectory and log text the whole page embeds.
TOTAL_LIMIT = 10_000_000
#: A trajectory file larger than this is not parsed at all (only its start is shown).
_PARSE_LIMIT = 20_000_000


@dataclass
class Budget:
    """What the page may still embed, shared by every transcript of one report."""

    remaining: int = TOTAL_LIMIT
    per_trajectory: int = TRAJECTORY_LIMIT

    def take(self, wanted: int) -> int:
        """How much of `wanted` characters fits; that much is spent."""
        granted = max(0, min(wanted, self.remaining))
        self.remaining -= granted
        return granted


def transcript_html(path: Path, link: str, budget: Budget) -> str:
    """The steps of the trajectory at `path` (who spoke, what was said, tool calls and what
    they returned), cut short past the budget with a link to the whole file."""
    if budget.remaining <= 0:
        return _note(
            f"Not embedded: the report reached its cap of {_size(TOTAL_LIMIT)} of text. "
            f'<a href="{link}">Open trajectory.json</a>.'
        )
    try:
        size = path.stat().st_size
        if size > _PARSE_LIMIT:
            return _raw_start(path, link, size, budget)
        data, error = load_json(path.read_bytes())
    except OSError as problem:
        return _note(f"Cannot read the trajectory: {escape(str(problem))}")
    if error is not None:
        return _raw_start(path, link, size, budget, f"it {error}")
    steps = data.get("steps") if isinstance(data, dict) else None
    if not isinstance(steps, list):
        return _raw_start(path, link, size, budget)
    allowance = min(budget.per_trajectory, budget.remaining)
    used = 0
    parts = []
    for index, step in enumerate(steps):
        if not isinstance(step, dict):
            continue
        html, length = _step(step)
        if used + length > allowance:
            left = len(steps) - index
            parts.append(
                _note(
                    f"{left} more step(s) not shown: the report embeds up to "
                    f"{_size(allowance)} of each trajectory (this one is {_size(size)}). "
                    f'<a href="{link}">Open the whole trajectory.json</a>.'
                )
            )
            break
        used += length
        parts.append(html)
    budget.take(used)
    agent = data.get("agent") if isinstance(data.get("agent"), dict) else {}
    who = " ".join(
        str(agent.get(key)) for key in ("name", "version", "model_name") if agent.get(key)
    )
    head = f'<div class="agent-info">{escape(who)}</div>' if who else ""
    return f'<div class="transcript">{head}{"".join(parts)}</div>'


def text_tail_html(path: Path, limit: int, budget: Budget) -> str:
    """The last `limit` characters of a text file (a verifier's test-stdout.txt)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as stream:
            stream.seek(max(0, size - limit))
            text = stream.read().decode("utf-8", errors="replace")
    except OSError as error:
        return _note(f"Cannot read {escape(path.name)}: {escape(str(error))}")
    text = text[len(text) - budget.take(len(text)) :]
    # The cut marked as every cut is (a secret's piece beside it is masked).
    cut = CUT if size > len(text.encode()) else ""
    return f'<pre class="log">{cut}{escape(text)}</pre>'


def _step(step: Mapping[str, Any]) -> tuple[str, int]:
    source = str(step.get("source") or "?")
    texts: list[str] = []
    parts = []
    meta = [str(step[key]) for key in ("model_name",) if step.get(key)]
    metrics = step.get("metrics")
    if isinstance(metrics, dict):
        tokens = [
            f"{metrics[key]} {label}"
            for key, label in (("prompt_tokens", "prompt"), ("completion_tokens", "completion"))
            if isinstance(metrics.get(key), int)
        ]
        if tokens:
            meta.append(" + ".join(tokens) + " tokens")
    parts.append(
        f'<div class="who">#{escape(str(step.get("step_id", "")))} {escape(source)}'
        + (f' <span class="meta">{escape(" · ".join(meta))}</span>' if meta else "")
        + "</div>"
    )
    message = _text(step.get("message"))
    texts.append(message)
    if message:
        parts.append(f'<pre class="message">{escape(message)}</pre>')
    reasoning = _text(step.get("reasoning_content"))
    if reasoning:
        texts.append(reasoning)
        parts.append(
            f'<details class="reasoning"><summary>reasoning</summary><pre>{escape(reasoning)}'
            "</pre></details>"
        )
    for call in step.get("tool_calls") or ():
        if not isinstance(call, dict):
            continue
        arguments = json.dumps(call.get("arguments"), indent=2, ensure_ascii=False)
        texts.append(arguments)
        parts.append(
            f'<div class="tool-call">→ {escape(str(call.get("function_name", "?")))} '
            f'<span class="meta">{escape(str(call.get("tool_call_id", "")))}</span>'
            f"<pre>{escape(arguments)}</pre></div>"
        )
    observation = step.get("observation")
    results = observation.get("results") if isinstance(observation, dict) else None
    for result in results or ():
        if not isinstance(result, dict):
            continue
        content = _text(result.get("content"))
        texts.append(content)
        parts.append(
            f'<div class="observation">← {escape(str(result.get("source_call_id") or ""))}'
            f"<pre>{escape(content)}</pre></div>"
        )
    html = f'<div class="step step-{escape(source)}">{"".join(parts)}</div>'
    return html, sum(len(text) for text in texts)


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False)


def _raw_start(path: Path, link: str, size: int, budget: Budget, reason: str | None = None) -> str:
    """A file that is not a readable trajectory (or too large to parse): its start, and
    why it is not laid out when that is known."""
    allowance = budget.take(min(budget.per_trajectory, size))
    try:
        with path.open("rb") as stream:
            text = stream.read(allowance).decode("utf-8", errors="replace")
    except OSError as error:
        return _note(f"Cannot read the trajectory: {escape(str(error))}")
    more = (
        f' Shown: its first {_size(allowance)} of {_size(size)}; <a href="{link}">open the '
        "whole file</a>."
        if allowance < size
        else ""
    )
    return (
        _note(
            "Not a trajectory the report can lay out as steps"
            + (f" ({escape(reason)})" if reason else "")
            + f".{more}"
        )
        + f'<pre class="log">{escape(text)}{CUT if allowance < size else ""}</pre>'
    )


def _note(html: str) -> str:
    return f'<p class="note">{html}</p>'


def _size(characters: int) -> str:
    if characters >= 1_000_000:
        return f"{characters / 1_000_000:.1f} MB"
    return f"{characters / 1000:.0f} KB"
