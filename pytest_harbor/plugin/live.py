"""The run as it goes, from a thread of the controller's own: in a terminal, a block under
pytest's output rewritten every few seconds (episodes done of all, each one running with
its phase and age, failures, spend); with `--harbor-live-report`, the HTML report
rewritten now and then with a note that the run is in progress."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Generator
from typing import Any

import pytest

from pytest_harbor.display import harbor_logger
from pytest_harbor.plugin.live_terminal import MAX_LINES, LiveBlock, terminal_file
from pytest_harbor.plugin.progress import RunProgress, run_progress
from pytest_harbor.plugin.reporting import RunReport
from pytest_harbor.relay import RelayError, RunSpend

__all__ = ["LIVE_EVERY_S", "LiveView", "shows_live_block", "workers_of"]

log = harbor_logger()

#: How often the terminal's block is rewritten (and the spend asked of the relay).
LIVE_EVERY_S = 2.0


def shows_live_block(config: pytest.Config) -> bool:
    """Whether this process keeps a live block in the terminal: its output is a terminal
    (not `TERM=dumb`), not under -q, and nothing captures its output meanwhile: an xdist
    controller (its workers run the items), or a sole process under `-s`. Otherwise the
    live view writes nothing there (see TerminalSummary's status line)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or config.get_verbosity() < 0:
        return False
    _, file = terminal_file(reporter)
    if not _isatty(file) or _dumb_terminal():
        return False
    distributed = config.pluginmanager.has_plugin("dsession")
    return distributed or config.getoption("capture", "fd") == "no"


class LiveView:
    """Registered on the controller (or the sole process); runs only while pytest's test
    loop does, and only reads the run's report."""

    def __init__(self, state: RunReport) -> None:
        self.state = state
        self.run = state.run
        self.workers = 1
        self._block: LiveBlock | None = None
        self._stop = threading.Event()
        self._spend: RunSpend | None = None
        self._report_at = 0.0

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        config = session.config
        every_report = self.run.options.live_report_s
        live_block = shows_live_block(config)
        if not self.run.targets or config.option.collectonly or not (live_block or every_report):
            return (yield)
        self.workers = workers_of(config)
        if live_block:
            self._block = LiveBlock(config.pluginmanager.getplugin("terminalreporter"))
        thread = threading.Thread(target=self._loop, name="harbor-live", daemon=True)
        thread.start()
        try:
            return (yield)
        finally:
            self._stop.set()
            # Its work is bounded (the relay's answer has a timeout): after the join, no
            # live report can land on the final one.
            thread.join()
            if self._block is not None:
                self._block.close()
                self._block = None

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self._redraw()

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """After the recorder's and the terminal's: the block, which pytest's line erased,
        comes back at once, with the item's end counted."""
        self._redraw()

    def _redraw(self) -> None:
        block = self._block
        if block is None:
            return
        try:
            self._show(block, self.progress(ask_relay=False))
        except Exception as error:  # the live view must never cost the run
            log.debug("the live view failed: %s: %s", type(error).__name__, error)

    def _show(self, block: LiveBlock, progress: RunProgress) -> None:
        if progress.total:
            shown = self.run.redactor.shown
            lines = progress.block(block.width, MAX_LINES)
            block.show([shown(line) for line in lines], progress.taken)

    def _loop(self) -> None:
        every_report = self.run.options.live_report_s
        ticks = [LIVE_EVERY_S if self._block is not None else None, every_report]
        tick = min(each for each in ticks if each is not None)
        while not self._stop.wait(tick):
            try:
                self._tick(every_report)
            except Exception as error:  # the live view must never cost the run
                log.debug("the live view failed: %s: %s", type(error).__name__, error)

    def _tick(self, every_report: float | None) -> None:
        progress = self.progress(ask_relay=True)
        block = self._block
        if block is not None:
            self._show(block, progress)
        now = time.monotonic()
        if every_report is not None and now - self._report_at >= every_report:
            self._report_at = now
            from pytest_harbor.plugin.live_report import write_live_reports

            write_live_reports(self.state, progress)

    def progress(self, *, ask_relay: bool) -> RunProgress:
        """The run now, the spend as the relay last counted it. Read without a lock: the
        ledger's trials were all planned before the test loop (its dict keeps its size),
        and the recorder changes each record one field at a time."""
        relay = self.run.relay
        if relay is not None and ask_relay:
            with contextlib.suppress(RelayError, OSError):
                self._spend = relay.spend()
        state = self.state
        return run_progress(
            state.ledger,
            state.planned,
            phases=self.run.phases,
            building=state.builds.building,
            spend=self._spend,
            workers=self.workers,
        )


def workers_of(config: pytest.Config) -> int:
    """How many processes run episodes (`-n`; 1 without xdist)."""
    try:
        return max(1, int(getattr(config.option, "numprocesses", 0) or 1))
    except (TypeError, ValueError):  # `-n auto` not yet turned into a number
        return os.cpu_count() or 1


def _isatty(file: Any) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _dumb_terminal() -> bool:
    return os.environ.get("TERM", "") == "dumb"
