"""The report's charts: their data (histogram bins, pass@k points, timeline lanes) worked
out as plain values, and drawn as inline SVG by our own code (no script, no network)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from html import escape
from typing import Any

from pytest_harbor.report.results import Episode, as_mapping

__all__ = [
    "PHASES",
    "Bin",
    "Segment",
    "Timeline",
    "TimelineBar",
    "TimelineLane",
    "histogram",
    "histogram_svg",
    "pass_at_k_svg",
    "timeline",
    "timeline_svg",
]

#: The phases of an episode on the timeline, in the order they are laid out.
PHASES = ("build", "start", "agent", "verify")
PHASE_NAMES = {
    "build": "build wait",
    "start": "start and seed",
    "agent": "agent",
    "verify": "verify",
}
#: Rows written before rows named their worker share one lane.
UNKNOWN_WORKER = "unknown"

_WIDTH = 960
_FONT = 'font-family="system-ui, sans-serif" font-size="12"'


# ---------------------------------------------------------------------------- histogram


@dataclass(frozen=True)
class Bin:
    """Rewards in [low, high) (the last bin also holds `high`)."""

    low: float
    high: float
    count: int


def histogram(rewards: Iterable[float], bins: int = 10) -> list[Bin]:
    """Equal-width bins over [0, 1], widened to take in rewards outside it (any finite
    float: the arithmetic is on halves, so that even +-1e308 do not overflow). A value
    that is not finite is left out."""
    values = [value for value in rewards if math.isfinite(value)]
    low = min([0.0, *values]) / 2
    high = max([1.0, *values]) / 2
    width = (high - low) / bins
    counts = [0] * bins
    for value in values:
        # The small nudge keeps 0.3 in [0.3, 0.4): (0.3 - 0) / 0.1 is 2.9999999999999996.
        counts[min(int((value / 2 - low) / width + 1e-9), bins - 1)] += 1
    return [
        Bin(low=2 * (low + width * index), high=2 * (low + width * (index + 1)), count=count)
        for index, count in enumerate(counts)
    ]


def histogram_svg(bins: Sequence[Bin]) -> str:
    height, top, bottom, left = 220, 20, 40, 40
    plot_h = height - top - bottom
    plot_w = _WIDTH - left - 20
    peak = max((item.count for item in bins), default=0) or 1
    slot = plot_w / max(1, len(bins))
    parts = [_axis_line(left, top + plot_h, left + plot_w, top + plot_h)]
    for index, item in enumerate(bins):
        bar_h = plot_h * item.count / peak
        x = left + index * slot + 2
        y = top + plot_h - bar_h
        label = f"{item.low:.2f}\u2013{item.high:.2f}"
        parts.append(
            f'<rect class="bar" data-count="{item.count}" x="{x:.1f}" y="{y:.1f}" '
            f'width="{slot - 4:.1f}" height="{bar_h:.1f}" fill="#4c78a8">'
            f"<title>reward {label}: {item.count} episode(s)</title></rect>"
        )
        if item.count:
            parts.append(
                f'<text x="{x + (slot - 4) / 2:.1f}" y="{y - 4:.1f}" '
                f'text-anchor="middle">{item.count}</text>'
            )
        parts.append(
            f'<text x="{x + (slot - 4) / 2:.1f}" y="{top + plot_h + 16:.1f}" '
            f'text-anchor="middle" fill="#555">{label}</text>'
        )
    parts.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 6}" text-anchor="middle" '
        'fill="#555">reward</text>'
    )
    return _svg("chart histogram", height, "Reward histogram", parts)


# ---------------------------------------------------------------------------- pass@k


def pass_at_k_svg(points: Mapping[int, float]) -> str:
    """pass@k against k (k evenly spaced: they are 1, 2, 4, ...)."""
    ks = sorted(points)
    height, top, bottom, left = 220, 20, 40, 48
    plot_h = height - top - bottom
    plot_w = _WIDTH - left - 40
    step = plot_w / max(1, len(ks) - 1)
    parts = [_axis_line(left, top + plot_h, left + plot_w, top + plot_h)]
    for value in (0.0, 0.5, 1.0):
        y = top + plot_h * (1 - value)
        parts.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" '
            'stroke="#ddd" stroke-dasharray="3 3"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#555">{value:.1f}'
            "</text>"
        )
    coordinates = [
        (left + index * step, top + plot_h * (1 - min(1.0, max(0.0, points[k]))))
        for index, k in enumerate(ks)
    ]
    parts.append(
        '<polyline fill="none" stroke="#4c78a8" stroke-width="2" points="'
        + " ".join(f"{x:.1f},{y:.1f}" for x, y in coordinates)
        + '"/>'
    )
    for k, (x, y) in zip(ks, coordinates, strict=True):
        parts.append(
            f'<circle class="point" data-k="{k}" cx="{x:.1f}" cy="{y:.1f}" r="5" '
            f'fill="#4c78a8"><title>pass@{k} = {points[k]:.3f}</title></circle>'
            f'<text x="{x:.1f}" y="{y - 10:.1f}" text-anchor="middle">{points[k]:.3f}</text>'
            f'<text x="{x:.1f}" y="{top + plot_h + 16}" text-anchor="middle" fill="#555">'
            f"k={k}</text>"
        )
    return _svg("chart pass-at-k", height, "pass@k against k", parts)


# ---------------------------------------------------------------------------- timeline


@dataclass(frozen=True)
class Segment:
    """One phase of an episode, in seconds from the timeline's origin."""

    phase: str
    start: float
    end: float
    #: The turn it belongs to, for a multi-step episode.
    step: str | None = None


@dataclass(frozen=True)
class TimelineBar:
    episode: str
    status: str
    segments: tuple[Segment, ...]


@dataclass(frozen=True)
class TimelineLane:
    worker: str
    bars: tuple[TimelineBar, ...]


@dataclass(frozen=True)
class Timeline:
    lanes: tuple[TimelineLane, ...]
    #: Seconds from the earliest phase start to the latest phase end.
    span_s: float
    #: Episodes with a row but no start time (left out of the chart).
    untimed: int = 0


def timeline(episodes: Iterable[Episode]) -> Timeline:
    """One lane per worker, one bar per episode with a row. The row records when the seed
    started and how long each phase took; the phases are laid end to end from there (build
    wait before the start, then start and seed, then each turn's agent and verify)."""
    bars: dict[str, list[tuple[float, str, str, list[tuple[str, float, str | None]]]]] = {}
    untimed = 0
    for episode in episodes:
        row = episode.row
        if row is None:
            continue
        started = _epoch(row.get("started_at"))
        if started is None:
            untimed += 1
            continue
        worker = str(row.get("worker") or UNKNOWN_WORKER)
        bars.setdefault(worker, []).append((started, episode.name, episode.status, _phases(row)))
    if not bars:
        return Timeline(lanes=(), span_s=0.0, untimed=untimed)
    origin = min(
        started - next((s for phase, s, _ in phases if phase == "build"), 0.0)
        for lane in bars.values()
        for started, _, _, phases in lane
    )
    lanes = []
    end = 0.0
    for worker in sorted(bars, key=_worker_order):
        lane_bars = []
        for started, name, status, phases in sorted(bars[worker]):
            segments = []
            cursor = started - origin
            for phase, seconds, step in phases:
                if phase == "build":
                    segments.append(Segment("build", cursor - seconds, cursor))
                    continue
                segments.append(Segment(phase, cursor, cursor + seconds, step))
                cursor += seconds
            end = max(end, cursor)
            lane_bars.append(TimelineBar(name, status, tuple(segments)))
        lanes.append(TimelineLane(worker, tuple(lane_bars)))
    return Timeline(lanes=tuple(lanes), span_s=end, untimed=untimed)


def _phases(row: Mapping[str, Any]) -> list[tuple[str, float, str | None]]:
    timings = as_mapping(row.get("timings"))
    phases: list[tuple[str, float, str | None]] = []
    build = _seconds(timings, "build_s")
    if build:
        phases.append(("build", build, None))
    phases.append(
        ("start", _seconds(timings, "seed_s") + _seconds(timings, "agent_install_s"), None)
    )
    turns = [as_mapping(turn) for turn in row.get("turns") or ()]
    turns = [turn for turn in turns if isinstance(turn.get("timings"), dict)]
    if turns:
        for turn in turns:
            step = str(turn.get("step") or "")
            turn_timings = as_mapping(turn["timings"])
            agent = _seconds(turn_timings, "setup_s") + _seconds(turn_timings, "agent_s")
            phases.append(("agent", agent, step))
            phases.append(("verify", _seconds(turn_timings, "verify_s"), step))
    else:
        phases.append(("agent", _seconds(timings, "agent_s"), None))
        phases.append(("verify", _seconds(timings, "verify_s"), None))
    return phases


def timeline_svg(chart: Timeline) -> str:
    lane_h, top, left, bottom = 26, 10, 90, 50
    plot_w = _WIDTH - left - 20
    height = top + lane_h * len(chart.lanes) + bottom
    scale = plot_w / (chart.span_s or 1.0)
    parts = []
    for index, lane in enumerate(chart.lanes):
        y = top + index * lane_h
        parts.append(
            f'<g class="lane" data-worker="{escape(lane.worker)}">'
            f'<text x="{left - 8}" y="{y + lane_h / 2 + 4:.1f}" text-anchor="end">'
            f"{escape(lane.worker)}</text>"
            f'<rect x="{left}" y="{y + 1}" width="{plot_w}" height="{lane_h - 2}" '
            'fill="#f5f5f5"/>'
        )
        for bar in lane.bars:
            parts.append(f'<g class="episode" data-episode="{escape(bar.episode)}">')
            for segment in bar.segments:
                # The build wait may overlap the episode before it on this worker (images
                # are made ahead): a thin bar under the lane's others.
                thin = segment.phase == "build"
                seg_y = y + (lane_h - 8 if thin else 3)
                seg_h = 5 if thin else lane_h - 6
                title = (
                    f"{bar.episode} ({bar.status}): {PHASE_NAMES[segment.phase]}"
                    + (f" of {segment.step}" if segment.step else "")
                    + f", {segment.end - segment.start:.2f} s"
                )
                parts.append(
                    f'<rect class="phase phase-{segment.phase}" '
                    f'x="{left + segment.start * scale:.2f}" y="{seg_y:.1f}" '
                    f'width="{max(0.5, (segment.end - segment.start) * scale):.2f}" '
                    f'height="{seg_h}"><title>{escape(title)}</title></rect>'
                )
            parts.append("</g>")
        parts.append("</g>")
    axis_y = top + lane_h * len(chart.lanes)
    parts.append(_axis_line(left, axis_y, left + plot_w, axis_y))
    for tick in _ticks(chart.span_s):
        x = left + tick * scale
        parts.append(
            f'<line x1="{x:.1f}" y1="{axis_y}" x2="{x:.1f}" y2="{axis_y + 4}" stroke="#555"/>'
            f'<text x="{x:.1f}" y="{axis_y + 16}" text-anchor="middle" fill="#555">'
            f"{_clock(tick)}</text>"
        )
    legend_x = left
    for phase in PHASES:
        parts.append(
            f'<rect class="legend phase-{phase}" x="{legend_x}" y="{axis_y + 26}" width="12" '
            f'height="12"/><text x="{legend_x + 16}" y="{axis_y + 36}">{PHASE_NAMES[phase]}'
            "</text>"
        )
        legend_x += 130
    return _svg("chart timeline", height, "Timeline of episodes per worker", parts)


def _ticks(span: float) -> list[float]:
    if span <= 0:
        return [0.0]
    raw = span / 8
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    return [index * step for index in range(int(span / step) + 1)]


def _clock(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:g} s"
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}:{rest:02d}"


def _worker_order(worker: str) -> tuple[int, int, str]:
    """main, gw0, gw1, ..., gw10, others, unknown last."""
    match = re.fullmatch(r"gw(\d+)", worker)
    if worker == UNKNOWN_WORKER:
        return (3, 0, worker)
    if worker == "main":
        return (0, 0, worker)
    return (1, int(match.group(1)), worker) if match else (2, 0, worker)


def _epoch(value: object) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def _seconds(timings: Mapping[str, Any], name: str) -> float:
    value = timings.get(name)
    return max(0.0, float(value)) if isinstance(value, int | float) else 0.0


# ---------------------------------------------------------------------------- drawing


def _svg(kind: str, height: int, label: str, parts: list[str]) -> str:
    return (
        f'<svg class="{kind}" role="img" aria-label="{label}" viewBox="0 0 {_WIDTH} {height}" '
        f'width="{_WIDTH}" height="{height}" {_FONT} xmlns="http://www.w3.org/2000/svg">'
        + "".join(parts)
        + "</svg>"
    )


def _axis_line(x1: float, y1: float, x2: float, y2: float) -> str:
    return f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="#555"/>'
