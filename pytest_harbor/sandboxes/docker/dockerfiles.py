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

from pytest_harbor.tasks.dockerfile_text import read_dockerfile

__all__ = ["classic_dockerfile", "only_buildkit_reads"]


#: What the classic builder answers, first thing in its error, to a Dockerfile it cannot
#: read and BuildKit may: a flag of BuildKit's (`--chmod`, `--mount`, `--link`) named, a
#: failed parse (a heredoc), several sources the rewrite could not reach (a wildcard). A
#: step that ran and failed says "The command '...' returned a non-zero code", whatever
#: its command holds.
_ONLY_BUILDKIT = re.compile(
    r"^(?:the --[a-z-]+ option requires BuildKit\b|dockerfile parse error line \d+: "
    r"|When using (?:COPY|ADD) with more than one source file\b)",
    re.IGNORECASE,
)


def only_buildkit_reads(error: str) -> bool:
    """Whether the classic builder's `error` is a refusal of the Dockerfile's form (which
    BuildKit may read), rather than a step that ran and failed."""
    return _ONLY_BUILDKIT.match(error.strip()) is not None


def classic_dockerfile(text: str) -> str | None:
    """`text` with each `COPY` or `ADD` of several sources to a destination without a
    trailing `/` given that `/`; None when no instruction needs it. The file is read as
    Docker reads it (tasks/dockerfile_text.py), so an instruction of the copy is one of
    the file's, and each keeps its first line."""
    read = read_dockerfile(text)
    lines = list(read.lines)
    changed = False
    for instruction in read.instructions:
        rewritten = _directory_destination(instruction.text)
        if rewritten is not None:
            span = instruction.end - instruction.line + 1
            lines[instruction.line - 1 : instruction.end] = [rewritten] + [""] * (span - 1)
            changed = True
    if not changed:
        return None
    return "\n".join(lines) + "\n"


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
