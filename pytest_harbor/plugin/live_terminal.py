"""A block of lines kept under pytest's output in a terminal and rewritten in place.

pytest's terminal writer is the only way anything reaches the terminal; the block stands
between it and its file. Every write of pytest's first erases the block (the cursor goes
back to where pytest left it); the live view draws it again below. A lock makes a write
of pytest's and a redraw from the live view's thread take turns, so neither cuts into the
other."""

from __future__ import annotations

import math
import shutil
import threading
import time
from typing import Any, TextIO

import pytest

from pytest_harbor.plugin.progress import cut

__all__ = ["LiveBlock", "replace_terminal_file", "terminal_file"]

#: The most lines the block takes (headline included): it must fit the screen, whose
#: lines that scrolled away can no longer be rewritten.
MAX_LINES = 10

_CLEAR_LINE = "\r\x1b[K"
_UP = "\x1b[1A"


# pytest's private names for the terminal (`TerminalReporter._tw`, `TerminalWriter._file`)
# are touched by these two functions alone; tests/unit/test_live.py fails when they go.


def terminal_file(reporter: pytest.TerminalReporter) -> tuple[Any, TextIO]:
    """pytest's terminal writer and the file it writes to."""
    writer = reporter._tw
    return writer, writer._file


def replace_terminal_file(writer: Any, file: Any) -> None:
    """Have pytest's terminal writer write to `file` from now on."""
    writer._file = file


class LiveBlock:
    """Stands in for the terminal writer's file while the run goes; close() puts the file
    back with the block erased."""

    def __init__(self, reporter: pytest.TerminalReporter) -> None:
        self._writer, self._file = terminal_file(reporter)
        self._lock = threading.Lock()
        self._lines: list[str] = []
        #: Lines of the block on the screen now, and pytest's column when it was drawn.
        self._shown = 0
        self._column = 0
        self._taken = -math.inf
        replace_terminal_file(self._writer, self)

    # ---------------------------------------------------------------- the file pytest sees

    def write(self, text: str) -> int:
        # Erased, not drawn again with what it said: the write may be the end of an
        # item, which the block must not show running. The live view draws it again as
        # the report is recorded, or at its next tick.
        with self._lock:
            self._file.write(self._erase() + text)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            self._file.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)

    # ---------------------------------------------------------------- the live view's side

    def show(self, lines: list[str], taken: float = math.inf) -> None:
        """Rewrite the block with `lines` (none: erase it), as the run was at `taken` (a
        time.monotonic()); lines taken before those shown already are dropped (the live
        view's thread may finish a snapshot after the main thread drew a newer one)."""
        with self._lock:
            if taken < self._taken:
                return
            self._taken = taken if taken != math.inf else time.monotonic()
            self._lines = list(lines)
            self._file.write(self._erase() + self._draw())
            self._file.flush()

    def close(self) -> None:
        """Erase the block and give pytest its file back."""
        with self._lock:
            self._lines = []
            self._file.write(self._erase())
            self._file.flush()
            replace_terminal_file(self._writer, self._file)

    @property
    def width(self) -> int:
        """The terminal's width, less one column: a line that fills the width moves the
        cursor on, and the block could not find its way back."""
        return max(20, int(self._writer.fullwidth) - 1)

    def _erase(self) -> str:
        if not self._shown:
            return ""
        text = _CLEAR_LINE + (_UP + _CLEAR_LINE) * (self._shown - 1)
        if self._column:
            # The block began on the line below pytest's: back to where pytest was.
            text += f"{_UP}\x1b[{self._column + 1}G"
        self._shown = 0
        return text

    def _draw(self) -> str:
        if not self._lines:
            return ""
        room = max(1, min(MAX_LINES, _screen_lines() - 2))
        lines = [cut(line, self.width) for line in self._lines[:room]]
        self._column = int(self._writer.width_of_current_line) % max(1, self.width + 1)
        self._shown = len(lines)
        return ("\n" if self._column else "\r") + "\n".join(lines)


def _screen_lines() -> int:
    return shutil.get_terminal_size(fallback=(80, 24)).lines
