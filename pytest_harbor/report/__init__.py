"""The HTML run report: one self-contained file (no network, opens from disk) made from
one or more tasksets' results folders."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pytest_harbor.display import escape_controls
from pytest_harbor.report.live import LiveNote
from pytest_harbor.report.page import render_page
from pytest_harbor.report.results import (
    CHECK,
    Episode,
    ReportError,
    TasksetResults,
    find_summaries,
    load_taskset,
    taskset_results,
)
from pytest_harbor.report.transcripts import TOTAL_LIMIT, TRAJECTORY_LIMIT, Budget
from pytest_harbor.writers.files import write_atomically
from pytest_harbor.writers.rollouts import REPORT

__all__ = [
    "CHECK",
    "REPORT",
    "TOTAL_LIMIT",
    "TRAJECTORY_LIMIT",
    "Episode",
    "LiveNote",
    "ReportError",
    "TasksetResults",
    "find_summaries",
    "load_taskset",
    "render_report",
    "write_live_report",
    "write_report",
]


def render_report(summary_files: Iterable[Path], out: Path) -> str:
    """The report's HTML for the tasksets of `summary_files`, its links relative to `out`.
    Control and format characters anywhere in it (a verifier's output, a file name) are
    escaped as text: a bidi override cannot make a line read otherwise than it is."""
    return _render([load_taskset(path) for path in summary_files], out, None)


def write_live_report(
    summaries: Iterable[tuple[Path, Mapping[str, Any]]],
    out: Path,
    live: LiveNote,
    redact: Callable[[str], str] | None = None,
) -> Path:
    """Write the report of a run in progress to `out` (atomically): each taskset's summary
    as it stands, given with the folder it will be written to, and a note of the run's
    progress; the page refreshes itself (the final report, written over it, does not)."""
    html = _render([taskset_results(folder, summary) for folder, summary in summaries], out, live)
    write_atomically(out, redact(html) if redact is not None else html)
    return out


def _render(tasksets: list[TasksetResults], out: Path, live: LiveNote | None) -> str:
    generated_at = datetime.now(UTC).isoformat(timespec="seconds")
    page = render_page(
        tasksets, out.absolute(), generated_at=generated_at, budget=Budget(), live=live
    )
    return escape_controls(page)


def write_report(
    summary_files: Iterable[Path],
    out: Path,
    redact: Callable[[str], str] | None = None,
) -> Path:
    """Write the report of the tasksets whose run summaries are `summary_files` to `out`
    (atomically: a reader never sees half of it). `redact` masks secret values."""
    html = render_report(summary_files, out)
    if redact is not None:
        html = redact(html)
    write_atomically(out, html)
    return out
