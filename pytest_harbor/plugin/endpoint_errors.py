"""The model endpoint's errors on the terminal as they happen, not only in an item's
captured log once it ends: each distinct error a few times, then counted, the counts in
the run's summary, and one clear line when episodes keep failing on the same refusal.

The engine and the harnesses log an EndpointError (agent_outcomes.py) with their warning;
a handler on the `pytest_harbor` logger picks it up. In an xdist worker it goes to the
controller as a recorded warning: xdist sends every `pytest_warning_recorded` of a worker
to the controller at once, the warning rebuilt there from its arguments. In the sole
process it is written at once, the output capture suspended around the line.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from pytest_harbor.agent_outcomes import ENDPOINT_ERROR, EndpointError
from pytest_harbor.display import harbor_logger, one_line
from pytest_harbor.plugin.ledger import split_trial, trial_of
from pytest_harbor.plugin.live_terminal import terminal_file

__all__ = ["EndpointErrorWarning", "EndpointErrors", "watch_endpoint_errors"]

#: Each distinct error (status and words) is shown this many times, then only counted.
SHOWN_PER_ERROR = 3
#: After this many episodes refused with the same 4xx, the run says that the others will
#: most likely be refused too.
SAME_REFUSAL_EPISODES = 3
_PREFIX = "harbor: "


class EndpointErrorWarning(UserWarning):
    """An EndpointError on its way from a worker to the controller (its one argument is
    the error's JSON, so that xdist rebuilds it whole)."""

    def __init__(self, data: str) -> None:
        super().__init__(data)
        self.data = data

    @property
    def error(self) -> EndpointError | None:
        try:
            return EndpointError.model_validate_json(self.data)
        except ValidationError:
            return None

    def __str__(self) -> str:
        error = self.error
        return self.data if error is None else error.line("?")


class EndpointErrors:
    """Registered on the controller (or the sole process): shows and counts the errors."""

    def __init__(self, config: pytest.Config, redact: Callable[[str], str]) -> None:
        self.config = config
        self.redact = redact
        self.counts: Counter[tuple[int | None, str]] = Counter()
        self.refused: dict[tuple[int | None, str], set[str]] = {}
        self.said_same = False
        #: The item this process runs (the sole process): it names an error without one.
        self.running = ""
        #: In the sole process, errors come from the harness's threads.
        self._lock = threading.Lock()

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.running = nodeid

    @pytest.hookimpl(trylast=True)
    def pytest_warning_recorded(self, warning_message: warnings.WarningMessage) -> None:
        """A worker's error, as xdist hands it on; left out of pytest's warnings summary
        (the run's own summary counts it)."""
        message = warning_message.message
        if not isinstance(message, EndpointErrorWarning):
            return
        error = message.error
        if error is not None:
            self.show(error)
        reporter: Any = self.config.pluginmanager.get_plugin("terminalreporter")
        kept = getattr(reporter, "stats", {}).get("warnings")
        if kept:
            kept[:] = [each for each in kept if EndpointErrorWarning.__name__ not in each.message]

    def show(self, error: EndpointError) -> None:
        """The error's line, unless this error was shown SHOWN_PER_ERROR times already."""
        with self._lock:
            self._show(error)

    def _show(self, error: EndpointError) -> None:
        episode = error.episode or episode_of(self.running)
        self.counts[error.key] += 1
        count = self.counts[error.key]
        lines = []
        if count <= SHOWN_PER_ERROR:
            lines.append(error.line(episode))
        if count == SHOWN_PER_ERROR:
            lines.append("(this error is now counted, not shown; the counts end the run)")
        if error.status is not None and 400 <= error.status < 500 and error.status != 429:
            refused = self.refused.setdefault(error.key, set())
            refused.add(episode)
            if len(refused) == SAME_REFUSAL_EPISODES and not self.said_same:
                self.said_same = True
                lines.append(
                    f"the model endpoint refused {SAME_REFUSAL_EPISODES} episodes with the "
                    f"same {error.status}: the others will most likely be refused too; stop "
                    "the run (Ctrl-C) and fix the endpoint or the model parameters"
                )
        self._write(lines)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.counts:
            return
        terminalreporter.write_line(f"{_PREFIX}the model endpoint's errors during the run:")
        for (status, words), count in self.counts.most_common():
            answered = "no answer" if status is None else str(status)
            shown = one_line(self.redact(f"  {count} x {answered}: {words}"))
            terminalreporter.write_line(shown, yellow=True)

    def _write(self, lines: list[str]) -> None:
        reporter: Any = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None or not lines:
            return
        with _output_shown(self.config):
            # On a line of its own, never glued to the progress dots (write_line ends the
            # line of an item's name itself).
            writer, _ = terminal_file(reporter)
            if writer.width_of_current_line and getattr(reporter, "currentfspath", None) is None:
                reporter.write("\n")
            for line in lines:
                reporter.write_line(one_line(self.redact(_PREFIX + line)), yellow=True)


def episode_of(nodeid: str) -> str:
    """An item's episode, as the engine names it: `<task>__r<repeat>`."""
    if not nodeid:
        return "?"
    _, task, repeat = split_trial(trial_of(nodeid))
    return f"{task}__{repeat}"


@contextlib.contextmanager
def _output_shown(config: pytest.Config) -> Iterator[None]:
    """pytest's output capture suspended (as its live log does) while a line is written
    during an item; the capture manager's one method is used here only."""
    capture: Any = config.pluginmanager.get_plugin("capturemanager")
    suspend = getattr(capture, "global_and_fixture_disabled", None)
    with suspend() if suspend is not None else contextlib.nullcontext():
        yield


class _Handler(logging.Handler):
    """Hands each logged EndpointError to `send`."""

    def __init__(self, send: Callable[[EndpointError], None]) -> None:
        super().__init__(logging.WARNING)
        self.send = send

    def emit(self, record: logging.LogRecord) -> None:
        error = getattr(record, ENDPOINT_ERROR, None)
        if isinstance(error, EndpointError):
            self.send(error)


class _WorkerSide:
    """In an xdist worker: knows the running item, and sends each error on."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.running = ""

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.running = nodeid

    def send(self, error: EndpointError) -> None:
        if error.episode is None:
            error = error.model_copy(update={"episode": episode_of(self.running)})
        with warnings.catch_warnings(record=True) as records:
            warnings.simplefilter("always", EndpointErrorWarning)
            warnings.warn(EndpointErrorWarning(error.model_dump_json()), stacklevel=1)
        for record in records:
            self.config.hook.pytest_warning_recorded.call_historic(
                kwargs={
                    "warning_message": record,
                    "when": "runtest",
                    "nodeid": self.running,
                    "location": None,
                }
            )


def watch_endpoint_errors(
    config: pytest.Config, *, worker: bool, redact: Callable[[str], str]
) -> None:
    """Show the run's endpoint errors as they happen (see the module's docstring)."""
    side: _WorkerSide | EndpointErrors = (
        _WorkerSide(config) if worker else EndpointErrors(config, redact)
    )
    config.pluginmanager.register(side, "harbor-endpoint-errors")
    handler = _Handler(side.send if isinstance(side, _WorkerSide) else side.show)
    logger = harbor_logger()
    logger.addHandler(handler)
    config.add_cleanup(lambda: logger.removeHandler(handler))
