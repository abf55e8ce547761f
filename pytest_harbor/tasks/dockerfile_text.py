"""A Dockerfile's instructions as Docker's parser reads them, so that what the task check
judges and what the classic builder is given are the instructions the engine runs.

The parser's rules, kept here one by one:

- Lines end at a newline only (a carriage return before it goes); a carriage return, form
  feed or vertical tab inside a line is white space between words, not a line's end.
- A byte order mark before the first line goes.
- Parser directives (`# escape=...`, `# syntax=...`, `# check=...`) are the comment lines
  of that form before anything else; any other line, a blank one or a comment, ends them.
- A line's leading white space goes; a line that then starts with `#` is a comment.
- An instruction goes on past a line that ends with the escape character (then spaces or
  tabs); the lines it goes on to are joined to it as they are, but for comment lines and
  empty lines, which are left out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["DIRECTIVE", "DockerfileText", "Instruction", "read_dockerfile"]

#: A parser directive as Docker matches one (`# escape=\``).
DIRECTIVE = re.compile(r"^#\s*([a-zA-Z][a-zA-Z0-9]*)\s*=\s*(.+?)\s*$")
#: The directives Docker knows; a line of that form with another name ends them.
_KNOWN = frozenset({"escape", "syntax", "check"})
#: What Docker's parser strips as white space at a line's start (Go's unicode.IsSpace).
SPACE = (
    " \t\n\v\f\r\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_ESCAPE_LIKE = re.compile(r"^#\s*escape\s*=", re.IGNORECASE)
_ESCAPE = re.compile(r"^#[ \t]*escape[ \t]*=[ \t]*[\\`][ \t]*$")


@dataclass(frozen=True)
class Instruction:
    """One instruction: the numbers of its first and last lines (from 1), and its text as
    the parser joins it (leading white space gone, continuations joined)."""

    line: int
    end: int
    text: str


@dataclass(frozen=True)
class DockerfileText:
    """A Dockerfile read as Docker reads it: its lines (a newline their only end), the
    escape character, the directives `(line, name, value)`, the instructions, and why
    Docker's readings of it may differ (None when they cannot)."""

    lines: list[str]
    escape: str
    directives: list[tuple[int, str, str]]
    instructions: list[Instruction]
    problem: str | None


def read_dockerfile(text: str) -> DockerfileText:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline ends the last line; it starts none
    lines = [line.rstrip("\r\n") for line in lines]
    if lines:
        lines[0] = lines[0].removeprefix("\ufeff")
    escape, directives, problem = _directives(lines)
    return DockerfileText(lines, escape, directives, _instructions(lines, escape), problem)


def _directives(lines: list[str]) -> tuple[str, list[tuple[int, str, str]], str | None]:
    escape = "\\"
    found: list[tuple[int, str, str]] = []
    stop = len(lines) + 1
    for number, line in enumerate(lines, 1):
        stripped = line.lstrip(SPACE)
        match = DIRECTIVE.match(stripped)
        if match is None or match.group(1).lower() not in _KNOWN:
            stop = number
            break
        name, value = match.group(1).lower(), match.group(2)
        if any(name == seen for _, seen, _ in found):
            return escape, found, f"line {number}: the # {name} directive is given twice"
        found.append((number, name, value))
        if name == "escape":
            # Docker's parsers of other versions read only this form alike.
            if not _ESCAPE.match(stripped):
                return (
                    escape,
                    found,
                    f"line {number}: write the escape directive # escape=\\ or # escape=`",
                )
            escape = value
    # An escape directive after the line that ended them is a comment to Docker's parser
    # today; one of another version could take it: the file is refused.
    for number in range(stop, len(lines) + 1):
        stripped = lines[number - 1].lstrip(SPACE)
        if stripped and not stripped.startswith("#"):
            break
        if _ESCAPE_LIKE.match(stripped):
            return (
                escape,
                found,
                (
                    f"line {number}: an escape directive after a blank line, a comment or "
                    "another line: put the parser directives first"
                ),
            )
    return escape, found, None


def _instructions(lines: list[str], escape: str) -> list[Instruction]:
    continued = re.compile(re.escape(escape) + r"[ \t]*$")
    found: list[Instruction] = []
    index = 0
    while index < len(lines):
        first = index
        token = lines[index].lstrip(SPACE)
        index += 1
        if token.startswith("#"):
            token = ""
        text, more = _trim(token, continued)
        if not more and not text:
            continue
        while more and index < len(lines):
            raw = lines[index]
            index += 1
            stripped = raw.lstrip(SPACE)
            if not stripped or stripped.startswith("#"):
                continue
            piece, more = _trim(raw, continued)
            text += piece
        found.append(Instruction(first + 1, index, text))
    return found


def _trim(line: str, continued: re.Pattern[str]) -> tuple[str, bool]:
    """A line without its continuation mark; whether the instruction goes on past it."""
    trimmed, marks = continued.subn("", line, count=1)
    return trimmed, marks > 0
