"""The HTML report of a run in progress (`--harbor-live-report`): rewritten now and then
where the run's report goes, with a note of how far the run is and a refresh; the report
written as the run ends replaces it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pytest_harbor.plugin.progress import RunProgress
from pytest_harbor.plugin.reporting import RunReport
from pytest_harbor.writers.summary import run_summary

__all__ = ["write_live_reports"]


def write_live_reports(state: RunReport, progress: RunProgress) -> None:
    """Write the live report(s). Only tasksets whose folder the run has begun are drawn
    (a fresh run's at once, a resumed run's once it has something to write): before that,
    the folder is the resumed run's, as it was. Nothing is written before the run knows
    its episodes (xdist's workers are collecting)."""
    run = state.run
    options = run.options
    if not options.report or options.live_report_s is None or not progress.total:
        return
    from pytest_harbor.report import LiveNote, write_live_report  # only a run that writes one

    layout = run.layout
    summaries: dict[str, tuple[Path, dict[str, Any]]] = {}
    for taskset, manifest in list(state.planned.manifests.items()):
        if not state.writer.begun(taskset):
            continue
        summary = run_summary(
            layout,
            manifest,
            finished_at="",
            interrupted=False,
            episodes=list(state.ledger.entries(taskset)),
            score=state.ledger.score(taskset),
        )
        # Not finished: the page names no end.
        summary["finished_at"] = None
        summaries[taskset] = (layout.taskset_dir(taskset), run.redactor.data(summary))
    if not summaries:
        return
    note = LiveNote(
        done=progress.done,
        total=progress.total,
        running=len(progress.running),
        failed=progress.failed,
        updated_at=datetime.now(UTC).isoformat(timespec="seconds"),
        refresh_s=options.live_report_s,
    )
    if options.report_path is not None:
        jobs = [(options.report_path, list(summaries.values()))]
    else:
        jobs = [(layout.report_file(taskset), [pair]) for taskset, pair in summaries.items()]
    for out, pairs in jobs:
        write_live_report(pairs, out, note, redact=run.redactor.text)
