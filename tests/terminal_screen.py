"""A tiny terminal for tests: what a screen shows after a stream of output, for the few
controls the live block and pytest write (carriage return, newline, erase to the end of
the line, cursor up one line, cursor to a column); colours are dropped."""

from __future__ import annotations

import re

__all__ = ["Screen"]

_CONTROL = re.compile(r"\x1b\[(\d*)([A-Za-z])|\r|\n|[^\x1b\r\n]+")


class Screen:
    """Lines of text and a cursor; write() plays output onto them."""

    def __init__(self) -> None:
        self.lines: list[str] = [""]
        self.row = 0
        self.column = 0

    def write(self, text: str) -> None:
        for match in _CONTROL.finditer(text):
            token = match.group(0)
            if token == "\r":
                self.column = 0
            elif token == "\n":
                self.row += 1
                self.column = 0  # as a tty's onlcr turns \n into \r\n
                while len(self.lines) <= self.row:
                    self.lines.append("")
            elif token.startswith("\x1b"):
                self._control(match.group(1), match.group(2))
            else:
                self._put(token)

    def _control(self, number: str, letter: str) -> None:
        line = self.lines[self.row]
        if letter == "K":
            self.lines[self.row] = line[: self.column]
        elif letter == "A":
            self.row = max(0, self.row - int(number or 1))
        elif letter == "G":
            self.column = int(number or 1) - 1
        elif letter != "m":
            raise AssertionError(f"a control the test terminal does not know: {letter!r}")

    def _put(self, text: str) -> None:
        line = self.lines[self.row].ljust(self.column)
        self.lines[self.row] = line[: self.column] + text + line[self.column + len(text) :]
        self.column += len(text)

    @property
    def text(self) -> str:
        return "\n".join(line.rstrip() for line in self.lines).rstrip("\n")
