"""An endpoint error as one line for a person, its key (the same error told by the
harness and by the engine), and its way from a worker to the controller."""

from __future__ import annotations

import logging
import pickle

import pytest

from pytest_harbor.agent_outcomes import ENDPOINT_ERROR, EndpointError
from pytest_harbor.engine.relay_errors import RelayErrorWatch
from pytest_harbor.plugin.endpoint_errors import EndpointErrorWarning, episode_of
from pytest_harbor.plugin.live_terminal import terminal_file
from pytest_harbor.relay import GrantReport


def error(message: str, **more: object) -> EndpointError:
    values: dict[str, object] = {"scope": "episode", "status": 500, "attempt": 1, "attempts": 3}
    return EndpointError.model_validate({**values, **more, "message": message})


def test_the_harness_and_engine_notes_are_not_part_of_the_error() -> None:
    told = error(
        "the endpoint failed (HTTP 500): overloaded (after 6 attempts) "
        "(the model relay saw HTTP 500)"
    )
    assert told.words == "overloaded"
    assert told.key == error("overloaded").key
    assert told.key != error("overloaded", status=503).key


def test_a_line_says_what_follows() -> None:
    assert error("x", retry_in_s=30.0).line("word-count__r0") == (
        "word-count__r0: model endpoint answered 500: x "
        "(episode attempt 1 of 3, retrying in 30 s in a fresh sandbox)"
    )
    assert error("x", attempt=3).line("e") == (
        "e: model endpoint answered 500: x (episode attempt 3 of 3, no further try)"
    )
    request = error("x", scope="request", status=None, retry_in_s=1.5, episode="b__r1")
    assert request.line("?") == (
        "b__r1: model endpoint failed: x (request attempt 1 of 3, retrying in 1.5 s)"
    )
    assert error("x", scope="request", status=400).line("e").endswith("(request not tried again)")


def test_the_warning_is_rebuilt_whole_from_its_argument() -> None:
    told = error("x", episode="a__r0")
    sent = EndpointErrorWarning(told.model_dump_json())
    rebuilt = type(sent)(*pickle.loads(pickle.dumps(sent.args)))  # as xdist rebuilds it
    assert rebuilt.error == told
    assert str(rebuilt) == told.line("?")
    assert EndpointErrorWarning("not json").error is None


def test_an_items_episode_is_named_as_the_engine_names_it() -> None:
    assert episode_of("tasks/word-count::r0::episode") == "word-count__r0"
    assert episode_of("") == "?"


def test_the_pytest_names_the_lines_rely_on_are_there(pytestconfig: pytest.Config) -> None:
    """The capture manager's suspension (as pytest's live log uses it) and the terminal
    reporter's current line and warnings (plugin/endpoint_errors.py; its writer is
    live_terminal.py's, pinned in test_live.py)."""
    capture = pytestconfig.pluginmanager.get_plugin("capturemanager")
    assert callable(capture.global_and_fixture_disabled)
    reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
    writer, _ = terminal_file(reporter)
    assert isinstance(writer.width_of_current_line, int)
    assert hasattr(reporter, "currentfspath") and isinstance(reporter.stats, dict)


class Books:
    """A relay client whose grant's failed answers grow as the test says."""

    def __init__(self) -> None:
        self.errors: list[tuple[int | None, str]] = []

    def report(self, token: str) -> GrantReport:
        return GrantReport(errors=tuple(self.errors))


def test_the_relays_failed_answers_are_told_once_each(caplog: pytest.LogCaptureFixture) -> None:
    books = Books()
    watch = RelayErrorWatch(books, "hbr-token", "alpha__r0")  # type: ignore[arg-type]
    books.errors.append((500, "overloaded"))
    with caplog.at_level(logging.WARNING, logger="pytest_harbor"):
        watch.poll()
        books.errors.append((None, "the endpoint did not answer: refused"))
        watch.poll()
        watch.poll()
    told = [getattr(record, ENDPOINT_ERROR) for record in caplog.records]
    assert [(error.status, error.words, error.scope) for error in told] == [
        (500, "overloaded", "relay"),
        (None, "the endpoint did not answer: refused", "relay"),
    ]
    assert told[0].line("?") == (
        "alpha__r0: model endpoint answered 500: overloaded "
        "(passed on to the agent by the model relay)"
    )
