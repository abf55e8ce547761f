"""The probe harness of check mode (`--harbor-check`): an agent that does not solve the
task but looks for ways to win it without the work, as public studies find one task in
six of terminal benchmarks allows.

On its first turn, before it changes anything, it looks for

- a `.git` (a folder, or a `gitdir:` file) anywhere in the sandbox's file system but the
  kernel's and the engine's folders, and in the task's `environment/` folder (its history
  may hold the solution);
- text of the task's `solution/` and `tests/` in the image: their distinctive lines
  (long, not comments, not in the instruction), searched for in every file of the image
  but the engine's folders, and in the image's configuration (its environment, labels,
  entrypoint, command, healthcheck), where their quoted strings are looked for too;
- a short value the tests compare with (`= "17"`, `== 'Paris'`) or the solution echoes into
  a file, too common for a search of every file: a small file (SMALL_FILE bytes at most)
  outside the system's folders that holds it as a whole line, or an `ENV` or label value
  that is it.

Then, on every turn, it writes a placeholder (PLACEHOLDERS) into each file the turn's
tests name that is missing or empty, makes it executable, and does nothing else: a
verifier that scores that above zero checks that files exist, not what they hold. Its
findings are its final answer (`response`), as JSON:
`{"git": [...], "image": [{"file", "text"}], "created": [...]}`.
"""

from __future__ import annotations

import json
import os
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
from pytest_harbor.labels import LABEL_PREFIX
from pytest_harbor.sandboxes.base import ROOT_USER, TRUSTED_BUSYBOX, TRUSTED_TOOLS, ImageConfig
from pytest_harbor.tasks import Turn

__all__ = [
    "PLACEHOLDERS",
    "ProbeHarness",
    "config_matches",
    "distinctive_lines",
    "environment_git",
    "named_files",
    "placeholder",
    "quoted_values",
    "short_values",
]

#: At most this many lines of the solution and tests are looked for.
MAX_PATTERNS = 40
#: A line shorter than this is too common to say anything.
MIN_PATTERN = 16
#: At most this many matches and created files are reported.
MAX_REPORTED = 20
#: A short value is looked for as a whole line of a file this small (bytes) at most.
SMALL_FILE = 64
#: Values too common to say anything, however they are written.
_COMMON_VALUES = frozenset(
    {"", "0", "1", "-1", "true", "false", "yes", "no", "ok", "none", "null", "pass", "fail"}
)
#: The system's folders, where a small file holding a short value means nothing.
_NOT_FOR_SHORT = ("/etc", "/usr", "/var", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/boot")
#: Folders the engine makes or fills, and the kernel's: never searched.
_SKIPPED = ("/proc", "/sys", "/dev", "/tests", "/solution", "/logs", "/run", "/tmp")
_PATTERNS_FILE = "/.harbor-probe-patterns"
#: Not searched for a `.git`: the kernel's folders, and those the engine fills (its tools,
#: the tests, the solution, the logs); everything else an agent can read is.
_NOT_THE_TASKS = (
    "/proc", "/sys", "/dev", "/logs", "/tests", "/solution", f"{TRUSTED_TOOLS}*",
    "/tmp/.pytest-harbor",
)  # fmt: skip
#: What the probe writes into a file the tests name, by the name's suffix: the least text
#: of that form (`{}` for JSON or YAML, a script that succeeds for a script or a name
#: without a suffix, which the probe also makes executable); any other name gets a line
#: of text.
PLACEHOLDERS = {
    ".json": "{}",
    ".jsonl": "{}",
    ".yaml": "{}",
    ".yml": "{}",
    ".py": "pass",
    ".sh": "#!/bin/sh\nexit 0",
    "": "#!/bin/sh\nexit 0",
}
_TEXT_LINE = "placeholder"
#: Where a test's named files are not created (the system's, the engine's).
_SYSTEM = (
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/logs", "/opt", "/proc", "/root",
    "/run", "/sbin", "/solution", "/sys", "/tests", "/usr", "/var",
)  # fmt: skip
_FILE_TEST = re.compile(r"(?:^|\s)-[efsx]\s+[\"']?([A-Za-z0-9._/~-]+)")
_TOKEN = re.compile(r"[A-Za-z0-9_.@:+-]{12,}")
_QUOTED = re.compile(r"\"[^\"]{8,}\"|'[^']{8,}'")
_PATH = re.compile(r"/[^\s]*")
#: A comparison with a value, its operator between spaces (`[ "$x" = 17 ]`, `== "Paris"`).
_COMPARED = re.compile(r"\s(?:==|=|!=|-eq|-ne)\s+(\"[^\"\n]*\"|'[^'\n]*'|[^\s\])\"';]+)")
#: A value written into a file (`echo 17 > /app/count.txt`).
_ECHOED = re.compile(
    r"(?:^|[;&|]\s*)(?:echo|printf)\s+(?:-[neE]+\s+)?(\"[^\"\n]*\"|'[^'\n]*'|[^\s>]+)\s*>"
)
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
            findings["git"] = _git_entries(context) + environment_git(context.task.environment_dir)
            short = short_values(context.turn, context.turn.instruction)
            findings["image"] = (
                _image_matches(context, context.turn)
                + _short_matches(context, short)
                + config_matches(context.image, _config_patterns(context.turn), exact=short)
            )
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


def _git_entries(context: SessionContext) -> list[str]:
    """Every `.git`, folder or file, in the sandbox but under _NOT_THE_TASKS."""
    prune = " -o ".join(f"-path '{path}'" for path in _NOT_THE_TASKS)
    script = (
        f"$B find / \\( {prune} \\) -prune -o -name .git -print -prune 2>/dev/null "
        f"| $B head -n {MAX_REPORTED}"
    )
    return sorted(set(_run(context, script).splitlines()))[:MAX_REPORTED]


def environment_git(folder: Path) -> list[str]:
    """Every `.git`, folder or file, in the task's `environment/` folder (named from the
    task folder): it may reach the image, or a sandbox the environment's files go to."""
    found = []
    for root, folders, files in os.walk(folder):
        if ".git" in folders or ".git" in files:
            found.append(str(Path(root, ".git").relative_to(folder.parent)))
        folders[:] = [name for name in folders if name != ".git"]
    return sorted(found)[:MAX_REPORTED]


def distinctive_lines(turn: Turn, instruction: str) -> list[str]:
    """Lines of the turn's solution and tests worth looking for in an image: stripped,
    at least MIN_PATTERN long, not comments or shell boilerplate, not in the instruction;
    the longest first."""
    lines: set[str] = set()
    for path in _text_files(turn.solution_dir, *turn.tests_dirs):
        lines.update(_lines_of(_read(path)))
    chosen = [line for line in lines if line not in instruction]
    return sorted(chosen, key=lambda line: (-len(line), line))[:MAX_PATTERNS]


def _text_files(*folders: Path | None) -> Iterable[Path]:
    """The files of `folders` small enough to read, in order."""
    for folder in folders:
        if folder is None or not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*")):
            if path.is_file() and path.stat().st_size <= 1024 * 1024:
                yield path


def _read(path: Path) -> str:
    """The file's text; empty when it is not UTF-8 text."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


def _lines_of(text: str) -> Iterable[str]:
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
    return _grep_image(context, patterns, skipped=_SKIPPED, size="-2048k", grep="-HoFsf")


def _short_matches(context: SessionContext, values: list[str]) -> list[dict[str, str]]:
    """Small files outside the system's folders with a whole line that is one of `values`."""
    skipped = (*_SKIPPED, *_NOT_FOR_SHORT)
    return _grep_image(context, values, skipped=skipped, size=f"-{SMALL_FILE + 1}c", grep="-HxFsf")


def _grep_image(
    context: SessionContext, patterns: list[str], *, skipped: tuple[str, ...], size: str, grep: str
) -> list[dict[str, str]]:
    """Files of the sandbox's file system (but `skipped`) of `size` (find's form) where
    `grep` (its flags, reading the patterns from a file) finds one of `patterns`."""
    if not patterns:
        return []
    prune = " -o ".join(f"-path {path}" for path in (*skipped, _PATTERNS_FILE))
    script = (
        f"$B cat > {_PATTERNS_FILE}; $B find / -xdev \\( {prune} \\) -prune -o -type f "
        f"-size {size} -print0 2>/dev/null | $B xargs -0 $B grep {grep} {_PATTERNS_FILE} "
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
    for path in _text_files(*turn.tests_dirs):
        text = _read(path)
        for match in (*_FILE_TEST.findall(text), *_ABSOLUTE.findall(text)):
            name = match if match.startswith("/") else f"{workdir.rstrip('/')}/{match}"
            if "$" in name or "~" in name or ".." in name.split("/"):
                continue
            if not name.startswith(tuple(f"{system}/" for system in _SYSTEM)):
                names.add(name)
    return sorted(names)[:MAX_REPORTED]


def placeholder(name: str) -> str:
    """What the probe writes into `name` (PLACEHOLDERS)."""
    base = name.rsplit("/", 1)[-1]
    suffix = "." + base.rsplit(".", 1)[-1] if "." in base.lstrip(".") else ""
    return PLACEHOLDERS.get(suffix.lower(), _TEXT_LINE)


def _create_named(context: TurnContext, turn: Turn, workdir: str) -> list[str]:
    names = named_files(turn, workdir)
    if not names:
        return []
    # A file already holding something, a link or what is not a file is left alone.
    script = (
        "while [ $# -gt 1 ]; do f=$1; c=$2; shift 2; "
        '{ [ -s "$f" ] || [ -L "$f" ] || { [ -e "$f" ] && [ ! -f "$f" ]; }; } && continue; '
        '$B mkdir -p "$($B dirname "$f")" 2>/dev/null; '
        'printf "%s\\n" "$c" > "$f" 2>/dev/null || continue; '
        '$B chmod 755 "$f" 2>/dev/null; echo "$f"; done'
    )
    pairs = [part for name in names for part in (name, placeholder(name))]
    created = _run(context, script, *pairs, user=context.agent_user)
    return created.split()[:MAX_REPORTED]


def quoted_values(turn: Turn, instruction: str) -> list[str]:
    """The quoted strings of the turn's solution and tests worth looking for in an image's
    configuration, where a value stands alone rather than in the line that used it: one
    that carries a value, not a shell expansion, not a path, not in the instruction."""
    values: set[str] = set()
    for path in _text_files(turn.solution_dir, *turn.tests_dirs):
        for line in _read(path).splitlines():
            if line.strip().startswith(("#", "//")):
                continue
            for quoted in _QUOTED.findall(line):
                value = quoted[1:-1].strip()
                if "$" not in value and not _PATH.fullmatch(value) and _carries_value(value):
                    values.add(value)
    chosen = [value for value in values if value not in instruction]
    return sorted(chosen, key=lambda value: (-len(value), value))[:MAX_PATTERNS]


def short_values(turn: Turn, instruction: str) -> list[str]:
    """Values the turn's tests compare with, or its solution echoes into a file, shorter
    than a line worth searching for everywhere (MIN_PATTERN): not a shell expansion, a
    path, a flag or a value too common to mean anything (_COMMON_VALUES), and not a word
    of the instruction."""
    values: set[str] = set()
    sources = [(path, _COMPARED) for path in _text_files(*turn.tests_dirs)]
    sources += [(path, _ECHOED) for path in _text_files(turn.solution_dir)]
    for path, pattern in sources:
        for line in _read(path).splitlines():
            if not line.strip().startswith(("#", "//")):
                values.update(_unquoted(found) for found in pattern.findall(line))
    chosen = [
        value
        for value in values
        if len(value) < MIN_PATTERN
        and value.lower() not in _COMMON_VALUES
        and "$" not in value
        and not value.startswith(("-", "/"))
        and "\n" not in value
        and not re.search(rf"(?<!\w){re.escape(value)}(?!\w)", instruction)
    ]
    return sorted(chosen)[:MAX_PATTERNS]


def _unquoted(word: str) -> str:
    if len(word) >= 2 and word[0] == word[-1] and word[0] in "\"'":
        word = word[1:-1]
    return word.strip()


def _carries_value(value: str) -> bool:
    """A code, a key or a sentence rather than a word or a command: 8 characters with
    letters and digits, or 16."""
    mixed = re.search(r"\d", value) and re.search(r"[A-Za-z]", value)
    return len(value) >= 16 or (len(value) >= 8 and bool(mixed))


def _config_patterns(turn: Turn) -> list[str]:
    return distinctive_lines(turn, turn.instruction) + quoted_values(turn, turn.instruction)


def config_matches(
    config: ImageConfig, patterns: Iterable[str], *, exact: Iterable[str] = ()
) -> list[dict[str, str]]:
    """Where the image's configuration holds one of `patterns`: an `ENV` value, a label's
    value (the engine's own labels left out), the entrypoint, the command or the
    healthcheck test; or where an `ENV` or label value is one of the short values
    `exact`, whole."""
    places = [(f"ENV {key}", value) for key, _, value in (e.partition("=") for e in config.env)]
    places += [
        (f"LABEL {key}", value)
        for key, value in sorted(config.labels.items())
        if not key.startswith(LABEL_PREFIX)
    ]
    places += [
        (name, " ".join(words))
        for name, words in (
            ("ENTRYPOINT", config.entrypoint),
            ("CMD", config.cmd),
            ("HEALTHCHECK", config.healthcheck),
        )
    ]
    wanted = [pattern for pattern in patterns if pattern]
    whole = set(exact)
    found = []
    for where, text in places:
        match = next((pattern for pattern in wanted if pattern in text), None)
        if match is None and where.startswith(("ENV", "LABEL")) and text.strip() in whole:
            match = text.strip()
        if match is not None:
            found.append({"file": f"the image's {where}", "text": match[:200]})
    return found[:MAX_REPORTED]
