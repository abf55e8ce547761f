"""The HTML run report: one self-contained file (no network, opens from disk) made from
one or more tasksets' results folders."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path

from pytest_harbor.display import escape_controls
from pytest_harbor.report.page import render_page
from pytest_harbor.report.results import (
    CHECK,
    Episode,
    ReportError,
    TasksetResults,
    find_summaries,
    load_taskset,
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
    "ReportError",
    "TasksetResults",
    "find_summaries",
    "load_taskset",
    "render_report",
    "write_report",
]


def render_report(summary_files: Iterable[Path], out: Path) -> str:
    """The report's HTML for the tasksets of `summary_files`, its links relative to `out`.
    Control and format characters anywhere in it (a verifier's output, a file name) are
    escaped as text: a bidi override cannot make a line read otherwise than it is."""
    tasksets = [load_taskset(path) for path in summary_files]
    generated_at = datetime.now(UTC).isoformat(timespec="seconds")
    page = render_page(tasksets, out.absolute(), generated_at=generated_at, budget=Budget())
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
