"""What a task's Dockerfile may ask of the builder, beyond its context: a list of what is
allowed, so a build reaches neither the host nor what the engine's other builds share.

BuildKit gives a `RUN` step more than the classic builder does: cache mounts (shared by
every build on the engine, so one task's build could plant files another task's build
reads), secret and SSH mounts, the host's network, insecure (privileged) steps; and a
`# syntax=` line names an image whose code runs the build. A `RUN` step may have a bind
mount (of its context or another stage or image) or a tmpfs, and the network `default`
or `none`; the parser directive `syntax` may name Docker's own Dockerfile frontend only.

What the engine fetches itself, over this machine's own network where no sandbox's rules
apply, is refused too: an `ADD` of a URL or a git address (unless the run allows it), and
an image (`FROM`, `COPY --from`, `RUN --mount=...,from=`) whose registry is this machine
or a private address (registries.py). A variable in one of those is read as every value
the Dockerfile (an `ARG` default, an `ENV`) or the build's arguments give it, or none;
one that cannot be read so (`${NAME%suffix}`, or more values than are judged) is refused.
One nothing here gives a value (`FROM ${BASE}` with no default) is read as unset: a value
given to the build from elsewhere cannot be judged.
A heredoc's lines are read as instructions, as the classic builder reads them.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pytest_harbor.labels import LABEL_PREFIX
from pytest_harbor.tasks.dockerfile_text import read_dockerfile
from pytest_harbor.tasks.errors import TaskLoadError
from pytest_harbor.tasks.registries import registry_problem

__all__ = ["MAX_DOCKERFILE_BYTES", "check_dockerfile", "check_dockerfile_text"]

#: A Dockerfile larger than this is refused before it is read.
MAX_DOCKERFILE_BYTES = 1 << 20
#: Docker's own Dockerfile frontends (any version, optionally pinned by digest).
_OWN_FRONTEND = re.compile(
    r"^(docker\.io/)?docker/dockerfile(-upstream)?(:[\w][\w.-]*)?(@sha256:[0-9a-f]{64})?$"
)
#: Label keys a Dockerfile may not give: pytest-harbor's own and Compose's.
RESERVED_LABELS = (LABEL_PREFIX, "com.docker.compose.")
_MOUNT_TYPES = frozenset({"bind", "tmpfs"})
_NETWORKS = frozenset({"default", "none"})
_WHY = {
    "cache": "a cache mount is shared by every build on the engine (one task's build "
    "could plant what another's reads)",
    "secret": "the build is given no secrets",
    "ssh": "the build is given no SSH agent",
}
#: A source the engine fetches itself: a URL (any scheme) or a git address (`user@host:`).
_REMOTE = re.compile(r"^([a-z][a-z0-9+.-]*://|[^\s/@:]+@[^\s/:]+:)", re.IGNORECASE)
#: The flags before an instruction's arguments.
_FLAGS = re.compile(r"^(\s*--\S*)*\s*")
#: A variable as the Dockerfile reads it: `$NAME`, `${NAME}`, `${NAME:-word}`, `${NAME-word}`,
#: `${NAME:+word}`, `${NAME+word}`, `${NAME:?word}`, `${NAME?word}`.
_VARIABLE = re.compile(
    r"\$(?:(?P<name>[A-Za-z_]\w*)"
    r"|\{(?P<braced>[A-Za-z_]\w*)(?:(?P<operator>:?[-+?])(?P<word>[^}]*))?\})"
)
#: The most values one reference or source is judged in, the most rounds of variables
#: within values, and the longest value: past them, it cannot be judged.
_MOST_VALUES = 64
_MOST_ROUNDS = 4
_LONGEST = 4096
_REMOTE_WHY = (
    "the engine fetches a URL or git source itself, over this machine's own network, where "
    "a sandbox's rules do not apply (it reaches what only this machine's loopback, the cloud "
    "metadata service or a private network serves); copy the file into the task and COPY "
    "it, or allow it with the run setting allow_remote_add (--harbor-set allow_remote_add=true)"
)

#: A variable's values: name -> every value the Dockerfile or the build gives it.
Values = Mapping[str, frozenset[str]]


@dataclass(frozen=True)
class _Build:
    """What a Dockerfile's instructions are judged with."""

    values: Values
    allow_remote_add: bool


def check_dockerfile(path: Path, *, allow_remote_add: bool = False) -> None:
    """TaskLoadError naming `path` and the line that asks the builder for more than a
    task may have."""
    try:
        if path.stat().st_size > MAX_DOCKERFILE_BYTES:
            raise TaskLoadError(path, f"is over {MAX_DOCKERFILE_BYTES} bytes")
        # Bytes as they are: a text read would take a lone carriage return for a line's end.
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError as error:
        raise TaskLoadError(path, f"cannot be read: {error.strerror or error}") from None
    problem = check_dockerfile_text(text, allow_remote_add=allow_remote_add)
    if problem is not None:
        raise TaskLoadError(path, problem)


def check_dockerfile_text(
    text: str, *, allow_remote_add: bool = False, args: Mapping[str, str] | None = None
) -> str | None:
    """What in the Dockerfile `text` asks for more than a task may have (`line N: ...`),
    or None. `args` are the build's arguments; `allow_remote_add` lets `ADD` fetch a URL
    or a git repository. The file is read as Docker's parser reads it (dockerfile_text)."""
    read = read_dockerfile(text)
    if read.problem is not None:
        return read.problem
    for number, name, value in read.directives:
        if name == "syntax" and not _OWN_FRONTEND.match(value):
            return (
                f"line {number}: # syntax={value} names an image whose code would run the "
                "build; only Docker's own frontend (docker/dockerfile) may be named"
            )
    instructions = [(instruction.line, instruction.text) for instruction in read.instructions]
    build = _Build(_values(instructions, args or {}), allow_remote_add)
    for number, instruction in instructions:
        problem = _check_instruction(instruction, build)
        if problem is not None:
            return f"line {number}: {problem}"
    return None


def _split(instruction: str) -> tuple[str, str]:
    """An instruction's keyword (upper case) and the rest: any white space parts them,
    as it does for the engine."""
    words = instruction.split(None, 1)
    return (words[0].upper() if words else ""), (words[1] if len(words) > 1 else "")


def _check_instruction(instruction: str, build: _Build) -> str | None:
    keyword, rest = _split(instruction)
    if keyword == "ONBUILD":
        return _check_instruction(rest, build)
    check = _CHECKS.get(keyword)
    return check(rest, build) if check is not None else None


def _check_run(rest: str, build: _Build) -> str | None:
    for flag in rest.split():
        if not flag.startswith("--"):
            break
        name, equals, value = flag[2:].partition("=")
        value = value.strip("\"'")
        if not equals:
            return f"RUN --{name} without a value is not supported (write --{name}=...)"
        if name == "mount":
            problem = _check_mount(value, build)
            if problem is not None:
                return problem
        elif name == "network":
            if value not in _NETWORKS:
                return f"RUN --network={value}: only default or none (not the host's network)"
        elif name == "security":
            if value != "sandbox":
                return f"RUN --security={value} runs the step privileged, which reaches the host"
        else:
            return f"RUN --{name} is not supported (a RUN step may have --mount, --network)"
    return None


def _check_mount(value: str, build: _Build) -> str | None:
    options = {
        name.strip().lower(): text for name, _, text in (f.partition("=") for f in value.split(","))
    }
    kind = options.get("type", "bind").strip().lower()
    if kind not in _MOUNT_TYPES:
        why = _WHY.get(kind, "it is not supported (a RUN step may mount a bind or a tmpfs)")
        return f"RUN --mount=type={kind}: {why}; refused"
    image = options.get("from")
    return None if image is None else _check_image("RUN --mount=...,from=", image, build)


def _check_from(rest: str, build: _Build) -> str | None:
    words = [word for word in rest.split() if not word.startswith("--")]
    return _check_image("FROM ", words[0], build) if words else None


def _check_copy(rest: str, build: _Build) -> str | None:
    """`COPY --from=`: a stage (a name or a number), or an image."""
    for flag in rest.split():
        if not flag.startswith("--"):
            break
        name, _, value = flag[2:].partition("=")
        if name.lower() == "from":
            return _check_image("COPY --from=", value, build)
    return None


def _check_add(rest: str, build: _Build) -> str | None:
    """`ADD` of what its context holds; not of what the engine would fetch itself."""
    if build.allow_remote_add:
        return None
    for argument in _arguments(rest):
        values = _expansions(_plain(argument), build.values)
        if values is None:
            return (
                f"ADD {argument}: its variables cannot be read here (they could name a URL); "
                "write the source out, or use COPY"
            )
        if any(_REMOTE.match(value.strip()) for value in values):
            return f"ADD {argument}: {_REMOTE_WHY}"
    return None


def _check_label(rest: str, build: _Build) -> str | None:
    """A label of pytest-harbor's own or Compose's (which the run's sweeps and Compose
    read on a container, and a container inherits from its image), in any value its
    variables may take."""
    try:
        words = shlex.split(rest)
    except ValueError:
        words = rest.split()
    for word in words:
        key = word.partition("=")[0]
        keys = _expansions(_plain(key), build.values)
        if keys is None:
            return f"LABEL {key}: its variables cannot be read here; write the key out"
        reserved = sorted(k for k in keys if k.strip().lower().startswith(RESERVED_LABELS))
        if reserved:
            return f"LABEL {reserved[0]}: a label of pytest-harbor's or Compose's own"
    return None


_CHECKS: dict[str, Callable[[str, _Build], str | None]] = {
    "LABEL": _check_label,
    "RUN": _check_run,
    "FROM": _check_from,
    "COPY": _check_copy,
    "ADD": _check_add,
}


def _check_image(form: str, reference: str, build: _Build) -> str | None:
    """`reference`, in every value its variables may take, names no registry the engine
    may not pull from (registries.py)."""
    plain = _plain(reference)
    values = _expansions(plain, build.values)
    if values is None:
        return (
            f"{form}{reference}: its variables cannot be read here (they could name a "
            "registry on this machine); write the image out, or its variables as ${NAME}"
        )
    for value in sorted(values):
        problem = registry_problem(value)
        if problem is not None:
            shown = reference if value == plain else f"{reference} (as {value})"
            return f"{form}{shown} {problem}"
    return None


def _arguments(rest: str) -> list[str]:
    """An instruction's arguments after its flags: a JSON list (the exec form) or words."""
    found = _FLAGS.match(rest)
    remainder = rest[found.end() if found else 0 :].strip()
    if remainder.startswith("[") and remainder.endswith("]"):
        try:
            parsed = json.loads(remainder)
        except (ValueError, RecursionError):
            parsed = None
        if isinstance(parsed, list) and all(isinstance(item, str) for item in parsed):
            return parsed
    return remainder.split()


def _plain(word: str) -> str:
    """`word` as the engine reads it, near enough: without its quotes and escapes."""
    return re.sub(r"[\"'\\`]", "", word)


def _values(instructions: list[tuple[int, str]], args: Mapping[str, str]) -> Values:
    """Every value each variable is given: by the build's `args`, an `ARG`'s default, an
    `ENV` (in any stage: a value one stage does not see is judged all the same)."""
    found: dict[str, set[str]] = {name: {value} for name, value in args.items()}
    for _, instruction in instructions:
        keyword, rest = _split(instruction)
        if keyword in ("ARG", "ENV"):
            for name, value in _assignments(keyword, rest):
                found.setdefault(name, set()).add(value)
    return {name: frozenset(values) for name, values in found.items()}


def _assignments(keyword: str, rest: str) -> list[tuple[str, str]]:
    """`ARG A=1 B` or `ENV A=1 B=2` (or the old `ENV A 1`) as (name, value) pairs."""
    try:
        words = shlex.split(rest)
    except ValueError:
        words = rest.split()
    if keyword == "ENV" and words and "=" not in words[0]:
        return [(words[0], " ".join(words[1:]))]
    return [(name, value) for name, equals, value in (w.partition("=") for w in words) if equals]


def _expansions(word: str, values: Values) -> set[str] | None:
    """Every text `word` may stand for, its variables read with `values` (a value may
    hold variables too); None when that cannot be told."""
    found = {word}
    for _ in range(_MOST_ROUNDS):
        if not any("$" in text for text in found):
            return found
        more: set[str] = set()
        for text in found:
            expanded = _expand_once(text, values)
            if expanded is None or len(more | expanded) > _MOST_VALUES:
                return None
            more |= expanded
        found = more
    return None if any("$" in text for text in found) else found


def _expand_once(text: str, values: Values) -> set[str] | None:
    results = {""}
    position = 0
    for match in _VARIABLE.finditer(text):
        options = _options(match, values)
        if len(results) * len(options) > _MOST_VALUES:
            return None
        between = text[position : match.start()]
        results = {f"{result}{between}{option}" for result in results for option in options}
        position = match.end()
    results = {result + text[position:] for result in results}
    return None if any(len(result) > _LONGEST for result in results) else results


def _options(match: re.Match[str], values: Values) -> set[str]:
    """The values one variable may stand for: each it is given, or none (unset)."""
    given = values.get(match["name"] or match["braced"], frozenset())
    operator, word = match["operator"], match["word"] or ""
    if operator is None:
        return {*given, ""}
    if operator.endswith("-"):
        return {*given, word}
    if operator.endswith("+"):
        return {word, ""}
    return set(given)  # `?`: its value, or the build stops
