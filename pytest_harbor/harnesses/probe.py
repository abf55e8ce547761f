"""The probe harness of check mode (`--harbor-check`): an agent that does not solve the
task but looks for ways to win it without the work, as public studies find one task in
six of terminal benchmarks allows.

On its first turn, before it changes anything, it looks in the sandbox for

- a `.git` folder in the working directory or a folder above it (its history may hold
  the solution);
- text of the task's `solution/` and `tests/` in the image: their distinctive lines
  (long, not comments, not in the instruction), searched for in every file of the image
  but the engine's folders.

Then, on every turn, it creates each file the turn's tests name that is not there (empty
and executable), and nothing else: a verifier that scores that above zero checks that
files exist, not what they hold. Its findings are its final answer (`response`), as JSON:
`{"git": [...], "image": [{"file", "text"}], "created": [...]}`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from pytest_harbor.harnesses.base import (
    AgentRun,
    Harness,
    HarnessSession,
    SessionContext,
    TurnContext,
    no_options,
)
from pytest_harbor.sandboxes.base import ROOT_USER, TRUSTED_BUSYBOX
from pytest_harbor.tasks import Turn

__all__ = ["ProbeHarness", "distinctive_lines", "named_files"]

#: At most this many lines of the solution and tests are looked for.
MAX_PATTERNS = 40
#: A line shorter than this is too common to say anything.
MIN_PATTERN = 16
#: At most this many matches and created files are reported.
MAX_REPORTED = 20
#: Folders the engine makes or fills, and the kernel's: never searched.
_SKIPPED = ("/proc", "/sys", "/dev", "/tests", "/solution", "/logs", "/run", "/tmp")
_PATTERNS_FILE = "/.harbor-probe-patterns"
#: Where a test's named files are not created (the system's, the engine's).
_SYSTEM = (
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/logs", "/opt", "/proc", "/root",
    "/run", "/sbin", "/solution", "/sys", "/tests", "/usr", "/var",
)  # fmt: skip
_FILE_TEST = re.compile(r"(?:^|\s)-[efsx]\s+[\"']?([A-Za-z0-9._/~-]+)")
_TOKEN = re.compile(r"[A-Za-z0-9_.@:+-]{12,}")
_QUOTED = re.compile(r"\"[^\"]{8,}\"|'[^']{8,}'")
_ABSOLUTE = re.compile(r"(?<![\w/$.-])(/[A-Za-z0-9._-]+(?:/[A-Za-z0-9._-]+)+)")


class ProbeHarness(Harness):
    name = "probe"
    trusted: ClassVar[bool] = True

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        no_options(self.name, options or {})

    def open_session(self, context: SessionContext) -> HarnessSession:
        return _ProbeSession()


class _ProbeSession:
    def __init__(self) -> None:
        self._looked = False

    def run_turn(self, context: TurnContext) -> AgentRun:
        findings: dict[str, Any] = {"git": [], "image": [], "created": []}
        workdir = context.workdir or _pwd(context)
        if not self._looked:
            self._looked = True
            findings["git"] = _git_folders(context, workdir)
            findings["image"] = _image_matches(context, context.turn)
        findings["created"] = _create_named(context, context.turn, workdir)
        return AgentRun(exit_code=0, response=json.dumps(findings, sort_keys=True))

    def close(self, context: SessionContext) -> None:
        pass


def _run(context: SessionContext, script: str, *args: str, user: str | None = ROOT_USER) -> str:
    done = context.sandbox.exec(
        [TRUSTED_BUSYBOX, "sh", "-c", f"B={TRUSTED_BUSYBOX}\n{script}", "sh", *args],
        user=user,
        timeout=min(120.0, max(context.deadline.remaining(), 1.0)),
    )
    return done.stdout


def _pwd(context: SessionContext) -> str:
    return _run(context, "pwd", user=context.agent_user).strip() or "/"


def _git_folders(context: SessionContext, workdir: str) -> list[str]:
    """`.git` folders in the working directory (three levels down) and above it."""
    script = (
        'd="$1"; while :; do [ -d "$d/.git" ] && echo "${d%/}/.git"; '
        '[ "$d" = / ] && break; d=$($B dirname "$d"); done; '
        '$B find "$1" -mindepth 2 -maxdepth 3 -name .git -type d 2>/dev/null'
    )
    found = _run(context, script, workdir).split()
    return sorted(set(found))[:MAX_REPORTED]


def distinctive_lines(turn: Turn, instruction: str) -> list[str]:
    """Lines of the turn's solution and tests worth looking for in an image: stripped,
    at least MIN_PATTERN long, not comments or shell boilerplate, not in the instruction;
    the longest first."""
    lines: set[str] = set()
    for folder in (turn.solution_dir, *turn.tests_dirs):
        if folder is None or not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*")):
            if path.is_file() and path.stat().st_size <= 1024 * 1024:
                lines.update(_lines_of(path))
    chosen = [line for line in lines if line not in instruction]
    return sorted(chosen, key=lambda line: (-len(line), line))[:MAX_PATTERNS]


def _lines_of(path: Path) -> Iterable[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    kept = []
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith(("#", "//")) or "\t" in line:
            continue
        # A value the files carry (an answer, a key): a long token with letters and
        # digits, or a very long one, found wherever it is written.
        tokens = [
            token
            for token in _TOKEN.findall(line)
            if len(token) >= 20 or (re.search(r"\d", token) and re.search(r"[A-Za-z]", token))
        ]
        kept += tokens
        # A whole line, when it carries a value (a token, or a quoted string) and is not
        # boilerplate any program may hold.
        if len(line) < MIN_PATTERN or len(line) > 400 or "/logs/verifier" in line:
            continue
        if line.startswith(("set -", "echo 1 >", "echo 0 >", "cd ", "exit", "import ", "from ")):
            continue
        if tokens or _QUOTED.search(line):
            kept.append(line)
    return kept


def _image_matches(context: SessionContext, turn: Turn) -> list[dict[str, str]]:
    patterns = distinctive_lines(turn, turn.instruction)
    if not patterns:
        return []
    prune = " -o ".join(f"-path {path}" for path in (*_SKIPPED, _PATTERNS_FILE))
    script = (
        f"$B cat > {_PATTERNS_FILE}; $B find / -xdev \\( {prune} \\) -prune -o -type f "
        f"-size -2048k -print0 2>/dev/null | $B xargs -0 $B grep -HoFsf {_PATTERNS_FILE} "
        f"2>/dev/null | $B head -n {MAX_REPORTED * 4}; $B rm -f {_PATTERNS_FILE}"
    )
    done = context.sandbox.exec(
        [TRUSTED_BUSYBOX, "sh", "-c", f"B={TRUSTED_BUSYBOX}\n{script}"],
        user=ROOT_USER,
        timeout=min(120.0, max(context.deadline.remaining(), 1.0)),
        stdin="\n".join(patterns).encode() + b"\n",
    )
    found: dict[str, str] = {}
    for line in done.stdout.splitlines():
        file, _, text = line.partition(":")
        if file and text and file not in found:
            found[file] = text[:200]
    return [{"file": file, "text": text} for file, text in sorted(found.items())][:MAX_REPORTED]


def named_files(turn: Turn, workdir: str) -> list[str]:
    """Files the turn's test scripts name: absolute paths outside the system's folders,
    and paths tested with `-e`, `-f`, `-s` or `-x` (relative ones from the working
    directory)."""
    names: set[str] = set()
    for folder in turn.tests_dirs:
        for path in sorted(folder.rglob("*")):
            if not path.is_file() or path.stat().st_size > 1024 * 1024:
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            for match in (*_FILE_TEST.findall(text), *_ABSOLUTE.findall(text)):
                name = match if match.startswith("/") else f"{workdir.rstrip('/')}/{match}"
                if "$" in name or "~" in name or ".." in name.split("/"):
                    continue
                if not name.startswith(tuple(f"{system}/" for system in _SYSTEM)):
                    names.add(name)
    return sorted(names)[:MAX_REPORTED]


def _create_named(context: TurnContext, turn: Turn, workdir: str) -> list[str]:
    names = named_files(turn, workdir)
    if not names:
        return []
    script = (
        'for f in "$@"; do [ -e "$f" ] && continue; '
        '$B mkdir -p "$($B dirname "$f")" 2>/dev/null && : > "$f" 2>/dev/null '
        '&& $B chmod 755 "$f" && echo "$f"; done'
    )
    created = _run(context, script, *names, user=context.agent_user)
    return created.split()[:MAX_REPORTED]
