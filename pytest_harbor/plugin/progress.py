"""Where a run is, as one snapshot: episodes done of all, those running with their phase
and age, failures, images being made, spend, the time left; and the text the terminal
shows of it (a block of lines rewritten in place, or one plain line)."""

from __future__ import annotations

import time
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

from pytest_harbor.plugin.ledger import EpisodeLedger, TrialRecord, trial_id
from pytest_harbor.plugin.phases import PhaseBoard, PhaseReport
from pytest_harbor.plugin.planned import PlannedRun
from pytest_harbor.relay import RunSpend

__all__ = ["RunProgress", "RunningEpisode", "run_progress"]

#: How many running episodes the plain line names before it says "and N more".
_NAMED_IN_LINE = 3

#: The statuses that count as failed so far.
_FAILED = ("failed", "no_result")


@dataclass(frozen=True)
class RunningEpisode:
    """An episode under way: its trial, the phase it last reported (None before its
    first), the turn it is in, and seconds since its item began."""

    trial: str
    phase: str | None
    step: str | None
    age_s: float

    def text(self, *, steps: bool) -> str:
        phase = self.phase or "starting"
        if steps and self.step is not None and self.phase in ("agent", "verifying"):
            phase = f"{phase} {self.step}"
        return f"{self.trial} {phase} {duration(self.age_s)}"


@dataclass(frozen=True)
class RunProgress:
    done: int
    total: int
    failed: int
    running: tuple[RunningEpisode, ...]
    waiting: int
    building: int = 0
    #: The model spend as the relay counted it (None: no relay, or none counted yet).
    spend: RunSpend | None = None
    #: Seconds left, once the results folder recorded every remaining task's time.
    left_s: float | None = None
    #: Whether a trial of the run has several turns (the phase then names the turn).
    steps: bool = False
    #: When the ledger was read (time.monotonic()).
    taken: float = 0.0

    def headline(self) -> str:
        """`harbor: 12/40 done (2 failed), 3 running, 25 waiting, $0.4200, 1,234 tokens`."""
        parts = [
            f"{self.done}/{self.total} done" + (f" ({self.failed} failed)" if self.failed else "")
        ]
        if self.building:
            parts.append(f"{self.building} image{'s' if self.building != 1 else ''} being made")
        parts.append(f"{len(self.running)} running")
        parts.append(f"{self.waiting} waiting")
        parts.extend(self._spent())
        if self.left_s is not None:
            parts.append(f"about {duration_words(self.left_s)} left")
        return "harbor: " + ", ".join(parts)

    def plain(self) -> str:
        """One line, for a log: the headline with the first running episodes named."""
        named = [episode.text(steps=self.steps) for episode in self.running[:_NAMED_IN_LINE]]
        if len(self.running) > _NAMED_IN_LINE:
            named.append(f"and {len(self.running) - _NAMED_IN_LINE} more")
        line = self.headline()
        if not named:
            return line
        count = f", {len(self.running)} running"
        return line.replace(count, f"{count} ({'; '.join(named)})", 1)

    def block(self, width: int, most: int) -> list[str]:
        """The terminal's live block: the headline, then one line per running episode, at
        most `most` lines (the last then counts those left out), each cut to `width` (a
        line that wrapped could not be rewritten in place)."""
        lines = [f"  {episode.text(steps=self.steps)}" for episode in self.running]
        if len(lines) > most - 1:
            kept = max(0, most - 2)
            lines = [*lines[:kept], f"  ... and {len(lines) - kept} more"]
        return [cut(line, width) for line in [self.headline(), *lines]]

    def _spent(self) -> list[str]:
        if self.spend is None or not self.spend.counts.requests:
            return []
        counts = self.spend.counts
        tokens = counts.prompt_tokens + counts.completion_tokens
        return [f"${counts.cost_usd:.4f}", f"{tokens:,} tokens"]


def run_progress(
    ledger: EpisodeLedger,
    planned: PlannedRun,
    *,
    phases: PhaseBoard | None = None,
    building: int = 0,
    spend: RunSpend | None = None,
    workers: int = 1,
    now: float | None = None,
) -> RunProgress:
    """The run as the ledger has it now. An episode runs from its item's start until the
    controller has its end (a row or a failure) or a skip: never after its item ended."""
    now = time.monotonic() if now is None else now
    selected = [record for record in list(ledger.trials.values()) if record.selected]
    ended = [record for record in selected if _ended(record)]
    running = [record for record in selected if record.started and not _ended(record)]
    waiting = [record for record in selected if not record.started and not _ended(record)]
    return RunProgress(
        done=len(ended),
        total=len(selected),
        failed=sum(1 for record in ended if ledger.status(record) in _FAILED),
        running=tuple(_running(record, phases, now) for record in running),
        waiting=len(waiting),
        building=building,
        spend=spend,
        left_s=_left(planned, running + waiting, workers),
        steps=any(record.step not in (None, "episode") for record in running),
        taken=now,
    )


def _ended(record: TrialRecord) -> bool:
    return record.finished or record.skip_reason is not None


def _running(record: TrialRecord, phases: PhaseBoard | None, now: float) -> RunningEpisode:
    trial = _trial(record)
    report: PhaseReport | None = None if phases is None else phases.read(trial)
    started = record.began_at if record.began_at is not None else now
    return RunningEpisode(
        trial=trial,
        phase=None if report is None else report.phase,
        step=None if report is None else report.step,
        age_s=max(0.0, now - started),
    )


def _trial(record: TrialRecord) -> str:
    return trial_id(record.taskset, record.task_id, record.repeat)


def _left(planned: PlannedRun, records: Iterable[TrialRecord], workers: int) -> float | None:
    """The recorded times of what is left, shared by `workers`; None when a task has no
    record."""
    keys = [f"{record.taskset}/{record.task_id}" for record in records]
    if not keys or any(key not in planned.history_tasks for key in keys):
        return None
    return sum(planned.expected_s.get(key) or 0.0 for key in keys) / max(1, workers)


def duration(seconds: float) -> str:
    """An age as a clock shows it: `42s`, `3m05s`, `1h02m`."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def duration_words(seconds: float) -> str:
    """A time left in round words: `40 s`, `3 min`, `1.5 h`."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def columns(char: str) -> int:
    """The screen columns a character takes: two for a wide (East Asian) one, none for a
    combining mark, one otherwise."""
    if unicodedata.combining(char):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def cut(line: str, width: int) -> str:
    """`line` in at most `width` screen columns (a wide character takes two), `...` at
    its end when it was cut."""
    if sum(columns(char) for char in line) <= width:
        return line
    room, kept = max(0, width - 3), []
    for char in line:
        room -= columns(char)
        if room < 0:
            break
        kept.append(char)
    return "".join(kept) + "..."
