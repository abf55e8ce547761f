"""Text from a sandbox as a person is shown it: control and format characters escaped,
in text, through the redactor, in log records, in warnings and in the harbor summary."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_harbor.display import LOGGER, escape_controls, harbor_logger
from pytest_harbor.plugin.nodes import HarborWarning
from pytest_harbor.plugin.summary import TerminalSummary
from pytest_harbor.redaction import Redactor


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b]0;pwned\x07", r"\x1b]0;pwned\x07"),  # a window title
        ("\x1b]52;c;cHduZWQ=\x07", r"\x1b]52;c;cHduZWQ=\x07"),  # the clipboard
        ("\x1b[2J\x1b[31mred", r"\x1b[2J\x1b[31mred"),
        ("ok\rFAKE", r"ok\rFAKE"),
        ("\x00\x08\x0b\x0c\x7f", r"\x00\x08\x0b\x0c\x7f"),
        ("\x85\x9b\x9d\x9f", r"\x85\x9b\x9d\x9f"),  # C1: NEL, CSI, OSC, APC
        ("\u202eevil\u202c", r"\u202eevil\u202c"),
        (
            "\u2066\u2067\u2068\u2069\u200e\u200f\u061c",
            r"\u2066\u2067\u2068\u2069\u200e\u200f\u061c",
        ),
        ("zero\u200bwidth\ufeff", r"zero\u200bwidth\ufeff"),
        ("line\u2028para\u2029", r"line\u2028para\u2029"),
        ("tag\U000e0041", r"tag\U000e0041"),
        ("odd \udcff byte", r"odd \udcff byte"),
    ],
)
def test_controls_and_format_characters_show_escaped(raw: str, shown: str) -> None:
    assert escape_controls(raw) == shown
    assert escape_controls(raw).isprintable()


def test_text_people_write_is_left_as_it_is() -> None:
    text = "lines\n\tand tabs, «quotes», naïve, 日本語, emoji 🙂, a\u00a0space, C:\\x1b\n"
    assert escape_controls(text) == text
    assert escape_controls("windows\r\nline ends\r\n") == "windows\nline ends\n"
    assert escape_controls("") == ""


def test_the_redactor_shows_text_masked_and_escaped() -> None:
    redactor = Redactor(["s3cr3t-value"])
    assert redactor.shown("\x1b]0;s3cr3t-value\x07") == r"\x1b]0;***\x07"
    # A secret that holds a control character is found as written.
    assert Redactor(["tab\x1bkey"]).shown("the tab\x1bkey") == "the ***"
    assert Redactor().shown("\u202e") == r"\u202e"


def test_log_records_show_escaped(caplog: pytest.LogCaptureFixture) -> None:
    log = harbor_logger()
    assert log is harbor_logger() and log.name == LOGGER
    assert len(log.filters) == 1  # added once, however often it is asked for
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        log.warning("%s: %s", "episode", "said \x1b]0;pwned\x07 \u202eevil")
    assert caplog.messages == [r"episode: said \x1b]0;pwned\x07 \u202eevil"]


def test_a_warning_shows_its_message_escaped() -> None:
    assert str(HarborWarning("task \x1b[2J\u202e")) == r"task \x1b[2J\u202e"


def test_the_harbor_summary_writes_each_line_masked_and_escaped() -> None:
    written: list[tuple[str, dict[str, bool]]] = []

    class Reporter:
        def write_line(self, line: str, **markup: bool) -> None:
            written.append((line, markup))

    state: Any = SimpleNamespace(run=SimpleNamespace(redactor=Redactor(["s3cr3t-value"])))
    reporter: Any = Reporter()
    TerminalSummary(state)._writer(reporter)("  t  detail \x1b]0;s3cr3t-value\x07", red=True)
    assert written == [(r"  t  detail \x1b]0;***\x07", {"red": True})]
