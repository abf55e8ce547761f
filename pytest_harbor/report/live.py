"""What the page of a run in progress adds: a note of how far the run is and when the
page was made, and a refresh (the final page, written as the run ends, has neither)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

__all__ = ["LiveNote", "live_banner", "live_head"]


@dataclass(frozen=True)
class LiveNote:
    """A run in progress: episodes done of all, running and failed so far, when the page
    was made, and how often the browser should load it again."""

    done: int
    total: int
    running: int
    failed: int
    updated_at: str
    refresh_s: float


def live_head(note: LiveNote | None) -> str:
    """The refresh, only while the run goes."""
    if note is None:
        return ""
    return f'<meta http-equiv="refresh" content="{max(1, math.ceil(note.refresh_s))}">'


def live_banner(note: LiveNote | None) -> str:
    if note is None:
        return ""
    failed = f", {note.failed} failed" if note.failed else ""
    return (
        f'<p class="live" id="live">Run in progress: {note.done} of {note.total} episodes '
        f"done, {note.running} running{failed}; updated at {escape(note.updated_at)}. This "
        "page loads itself again until the run ends.</p>"
    )
