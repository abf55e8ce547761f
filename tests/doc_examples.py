"""The documentation as data: its pages, their links and headings, and the runnable
examples in them.

The convention for runnable examples: a fenced block marked ```console, whose commands
start with `$ ` (a command ending in `\\` goes on over the next lines) and whose other
lines are the output the command is expected to print, in order, with gaps allowed: `*`
stands for anything (paths, times), a line `...` only shows that lines were left out, and
runs of spaces count as one. A command must exit 0, unless the next command is
`$ echo $?` with the status it must have. `$ export NAME=VALUE` sets a variable for the
commands after it. Each block runs on its own, in a fresh folder holding a copy of
`example_datasets/`, with `pytest` being this checkout's pytest; a model endpoint at
`http://localhost:8000/v1` is the suite's scripted Chat Completions server.

Examples that cannot run here (a model server to install, a hosted API and its key, `pip
install`, `docker` commands) are written without the `$ ` prompt, in an indented block or
a block marked otherwise (```text, ```sh): the prompt is allowed in console blocks only.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from tests.fixtures import REPO_ROOT

__all__ = [
    "MODEL_URL",
    "Block",
    "Step",
    "anchors",
    "console_blocks",
    "fenced_blocks",
    "links",
    "matches",
    "pages",
    "parse_console_blocks",
    "problems",
    "stray_prompts",
]

#: The endpoint the examples name; the suite serves a scripted model there.
MODEL_URL = "http://localhost:8000/v1"
#: Commands a console block may run besides `pytest`, `export` and `echo $?`: tools every
#: machine that runs the suite has (coreutils; not jq, which .ci/setup does not install).
SHELL_TOOLS = frozenset({"cat", "cp", "echo", "ls", "mkdir", "printf"})
_URL = re.compile(r"https?://[^\s'\"]+")
_LOCAL_URL = re.compile(r"http://localhost:\d+/v1")
_FENCE = re.compile(r"^(\s*)```(.*)$")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def pages() -> list[Path]:
    """README.md and every page of docs/."""
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Fenced:
    info: str
    #: 1-based line of the opening fence.
    line: int
    #: The block's lines, the fence's indentation taken off.
    body: list[str]


def fenced_blocks(text: str) -> list[Fenced]:
    blocks: list[Fenced] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, info = len(opening.group(1)), opening.group(2).strip()
        body: list[str] = []
        start = index
        index += 1
        while index < len(lines) and not re.match(r"^\s*```\s*$", lines[index]):
            body.append(lines[index][indent:] if lines[index][:indent].isspace() else lines[index])
            index += 1
        blocks.append(Fenced(info, start + 1, body))
        index += 1
    return blocks


def _outside_fences(text: str) -> list[str]:
    """The lines of `text` that are not inside a fenced block."""
    kept: list[str] = []
    inside = False
    for line in text.splitlines():
        if _FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            kept.append(line)
    return kept


def links(text: str) -> list[str]:
    """Link targets outside fenced blocks."""
    return [target for line in _outside_fences(text) for target in _LINK.findall(line)]


def anchors(text: str) -> set[str]:
    """The anchors GitHub makes of the headings: lower case, punctuation dropped, spaces to
    `-`; a repeated one gets `-1`, `-2`, ..."""
    found: set[str] = set()
    for line in _outside_fences(text):
        heading = _HEADING.match(line)
        if heading is None:
            continue
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(2))
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        candidate, number = slug, 0
        while candidate in found:
            number += 1
            candidate = f"{slug}-{number}"
        found.add(candidate)
    return found


@dataclass
class Step:
    """One command of a console block and the lines it is expected to print."""

    command: str
    expected: list[str] = field(default_factory=list)

    @property
    def words(self) -> list[str]:
        return shlex.split(self.command, comments=True)

    @property
    def kind(self) -> str:
        """`pytest`, `export`, `status` (`echo $?`) or `shell`."""
        words = self.words
        if words[:1] == ["pytest"]:
            return "pytest"
        if words[:1] == ["export"]:
            return "export"
        if words == ["echo", "$?"]:
            return "status"
        return "shell"


@dataclass
class Block:
    """A console block of a page: where it is, and its steps."""

    page: str
    line: int
    steps: list[Step]

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def console_blocks(path: Path) -> list[Block]:
    return parse_console_blocks(path.read_text(), str(path.relative_to(REPO_ROOT)))


def parse_console_blocks(text: str, page: str) -> list[Block]:
    found = []
    for fenced in fenced_blocks(text):
        if fenced.info.split()[:1] != ["console"]:
            continue
        steps: list[Step] = []
        continuing = False
        for line in fenced.body:
            if continuing:
                steps[-1].command += " " + line.strip().removesuffix("\\").strip()
                continuing = line.rstrip().endswith("\\")
            elif line.startswith("$ "):
                command = line[2:].rstrip()
                continuing = command.endswith("\\")
                steps.append(Step(command.removesuffix("\\").strip()))
            elif steps:
                steps[-1].expected.append(line)
            elif line.strip():
                steps.append(Step("", [line]))  # output before any command: a problem
        found.append(Block(page, fenced.line, steps))
    return found


def problems(block: Block) -> list[str]:
    """Why the block cannot be run as the convention says (empty: it can)."""
    found: list[str] = []
    if not block.steps:
        found.append("a console block without a `$ ` command")
    previous: Step | None = None
    for step in block.steps:
        if not step.command:
            found.append(f"output before the first command: {step.expected[0]!r}")
            continue
        try:
            words = step.words
        except ValueError as error:
            found.append(f"{step.command!r}: {error}")
            continue
        if not words:
            found.append("an empty command")
            continue
        kind = step.kind
        if kind == "status":
            if previous is None or previous.kind in ("status", "export"):
                found.append("`echo $?` must follow the command whose status it shows")
            shown = [line.strip() for line in step.expected if line.strip()]
            if len(shown) != 1 or not shown[0].isdigit():
                found.append("`echo $?` must be followed by the status, a number")
        elif kind == "export":
            if len(words) != 2 or "=" not in words[1] or step.expected:
                found.append(f"{step.command!r}: expected `export NAME=VALUE` and no output")
        elif kind == "shell" and words[0] not in SHELL_TOOLS:
            found.append(
                f"{step.command!r}: not runnable here ({words[0]} is neither pytest nor one "
                f"of {', '.join(sorted(SHELL_TOOLS))}); show it without the `$ ` prompt"
            )
        for url in _URL.findall(step.command):
            if not _LOCAL_URL.fullmatch(url):
                found.append(
                    f"{step.command!r}: {url} is not a local endpoint (the suite serves "
                    f"{MODEL_URL}; other ports on localhost stand for an endpoint that is down)"
                )
        previous = step
    return found


def stray_prompts(path: Path) -> list[int]:
    """Lines outside console blocks that show a `$ ` prompt: examples the suite would not
    run."""
    text = path.read_text()
    console = {
        fenced.line + offset
        for fenced in fenced_blocks(text)
        if fenced.info.split()[:1] == ["console"]
        for offset in range(1, len(fenced.body) + 1)
    }
    return [
        number
        for number, line in enumerate(text.splitlines(), start=1)
        if line.lstrip().startswith("$ ") and number not in console
    ]


def matches(pattern: str, line: str) -> bool:
    """A line of expected output against a printed line: `*` is anything, runs of spaces
    count as one, everything else is itself."""
    pieces = [re.escape(piece) for piece in " ".join(pattern.split()).split("*")]
    regex = ".*".join(pieces)
    return re.fullmatch(regex, " ".join(line.split())) is not None
