"""A Dockerfile BuildKit reads, put in the words the classic builder reads, where the two
differ in form only; and the classic builder's refusals that only BuildKit can answer.

The one difference of form: a `COPY` or `ADD` of several sources to a destination
without a trailing `/`. BuildKit (Harbor's builder, through Compose) copies the sources
into that folder; the classic builder refuses the instruction. The destination gains
its `/`, which is what BuildKit makes of it, and nothing else in the file changes: the
instruction keeps its line, and the lines it spanned stay, blank, so that an error's
line number is the file's own.
"""

from __future__ import annotations

import json
import re

from pytest_harbor.tasks.dockerfiles import DIRECTIVE

__all__ = ["classic_dockerfile", "only_buildkit_reads"]

_COMMENT = re.compile(r"^\s*#")

#: What the classic builder answers to a Dockerfile it cannot read and BuildKit may:
#: a flag or syntax of BuildKit's (`--chmod`, `--mount`, `--link`, heredocs) fails the
#: parse or names BuildKit; several sources the rewrite could not reach (a wildcard).
_ONLY_BUILDKIT = re.compile(
    r"requires BuildKit|dockerfile parse error|with more than one source file", re.IGNORECASE
)


def only_buildkit_reads(error: str) -> bool:
    """Whether the classic builder's `error` is a refusal of the Dockerfile's form (which
    BuildKit may read), rather than a step that ran and failed."""
    return _ONLY_BUILDKIT.search(error) is not None


def classic_dockerfile(text: str) -> str | None:
    """`text` with each `COPY` or `ADD` of several sources to a destination without a
    trailing `/` given that `/`; None when no instruction needs it."""
    lines = text.splitlines()
    escape = _escape_character(lines)
    continued = re.compile(re.escape(escape) + r"[ \t]*$")
    changed = False
    index = 0
    while index < len(lines):
        first = index
        line = lines[index].lstrip()
        index += 1
        if not line or _COMMENT.match(line):
            continue
        logical, ends = _trim(line, continued)
        while not ends and index < len(lines):
            raw = lines[index]
            index += 1
            if _COMMENT.match(raw) or not raw.strip():
                continue
            more, ends = _trim(raw, continued)
            logical += more
        rewritten = _directory_destination(logical)
        if rewritten is not None:
            lines[first:index] = [rewritten] + [""] * (index - first - 1)
            changed = True
    if not changed:
        return None
    return "\n".join(lines) + "\n"


def _escape_character(lines: list[str]) -> str:
    """The escape character the file's directives name (a backslash by default). The
    directives are the comments of the form `# name=value` before anything else."""
    for line in lines:
        directive = DIRECTIVE.match(line.strip())
        if directive is None:
            break
        if directive.group(1).lower() == "escape" and directive.group(2) in ("\\", "`"):
            return directive.group(2)
    return "\\"


def _trim(line: str, continued: re.Pattern[str]) -> tuple[str, bool]:
    """A physical line without its continuation mark; whether the instruction ends on it."""
    trimmed, marks = continued.subn("", line)
    return trimmed, marks == 0


def _directory_destination(instruction: str) -> str | None:
    """The instruction (one logical line) with its destination made a folder, when it is
    a `COPY` or `ADD` of several sources to a destination without a trailing `/`."""
    parts = instruction.split(None, 1)
    if len(parts) < 2 or parts[0].upper() not in ("COPY", "ADD"):
        return None
    rest = parts[1]
    words = rest.split()
    flags = 0
    while flags < len(words) and words[flags].startswith("--"):
        flags += 1
    arguments = rest.strip()
    for flag in words[:flags]:
        arguments = arguments[arguments.index(flag) + len(flag) :].lstrip()
    if arguments.startswith("["):
        return _json_form(instruction, arguments)
    paths = words[flags:]
    if len(paths) < 3 or any(path.startswith("<<") for path in paths):
        return None
    if paths[-1].endswith("/"):
        return None
    return instruction.rstrip() + "/"


def _json_form(instruction: str, arguments: str) -> str | None:
    try:
        paths = json.loads(arguments)
    except ValueError:
        return None
    if not isinstance(paths, list) or len(paths) < 3:
        return None
    if not all(isinstance(path, str) for path in paths) or paths[-1].endswith("/"):
        return None
    head = instruction[: instruction.rindex(arguments)]
    return head + json.dumps([*paths[:-1], paths[-1] + "/"])
