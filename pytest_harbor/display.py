"""Text from a sandbox as a person is shown it: in the terminal, the junit XML, log lines
and the HTML report, control and format characters are written as escapes, never raw."""

from __future__ import annotations

import logging
import re
import unicodedata

__all__ = ["LOGGER", "escape_controls", "harbor_logger", "shown_number", "unshowable"]

#: The name of the package's logger: every module logs through harbor_logger().
LOGGER = "pytest_harbor"

#: What may need an escape: a CR before a LF, or a run of characters other than printable
#: ASCII, newline and tab. Most text is ASCII: the category of the rest is looked up.
_CANDIDATES = re.compile(r"\r\n|[^\x20-\x7e\n\t]+")

#: Controls (C0, DEL, C1), format characters (the bidi overrides and isolates, zero-width
#: ones, tags), the line and paragraph separators, and lone surrogates (bytes that were
#: not UTF-8): a terminal acts on them, or they make text read otherwise than it is.
_ESCAPED = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def escape_controls(text: str) -> str:
    """`text` with every control and format character written as a Python escape
    (`\\x1b`, `\\r`, `\\x9b`, `\\u202e`), newlines and tabs kept; a CR before a newline
    is dropped (a line end, not a write over the line)."""
    return _CANDIDATES.sub(_escape_run, text)


def one_line(text: str) -> str:
    """`text` as one line: escape_controls(), with newlines and tabs escaped too."""
    return escape_controls(text).replace("\n", "\\n").replace("\t", "\\t")


def unshowable(text: str) -> str:
    """The characters of `text` that escape_controls() writes as escapes (newlines and
    tabs among them, which no name may hold either), each once, in order."""
    return "".join(
        dict.fromkeys(
            char for char in text if char in "\n\t" or unicodedata.category(char) in _ESCAPED
        )
    )


def _escape_run(match: re.Match[str]) -> str:
    run = match.group()
    if run == "\r\n":
        return "\n"
    return "".join(
        _escape(char) if unicodedata.category(char) in _ESCAPED else char for char in run
    )


def _escape(char: str) -> str:
    if char == "\r":
        return "\\r"
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


class _EscapedRecords(logging.Filter):
    """Log records whose message (with its arguments) is written as escape_controls()
    shows it: pytest's live log and captured log print records raw."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        shown = escape_controls(message)
        if shown != message:
            record.msg, record.args = shown, None
        return True


def shown_number(value: float) -> str:
    """A reward or a mean of them: three decimals; one far out of the usual range (a
    verifier may write 1e308) in four significant digits, not in 309."""
    return f"{value:.3f}" if abs(value) < 1e6 else f"{value:.4g}"


def harbor_logger() -> logging.Logger:
    """The package's logger, which shows what it logs through escape_controls()."""
    logger = logging.getLogger(LOGGER)
    if not any(isinstance(found, _EscapedRecords) for found in logger.filters):
        logger.addFilter(_EscapedRecords())
    return logger
