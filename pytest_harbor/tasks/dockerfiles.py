"""What a task's Dockerfile may ask of the builder, beyond its context: a list of what is
allowed, so a build reaches neither the host nor what the engine's other builds share.

BuildKit gives a `RUN` step more than the classic builder does: cache mounts (shared by
every build on the engine, so one task's build could plant files another task's build
reads), secret and SSH mounts, the host's network, insecure (privileged) steps; and a
`# syntax=` line names an image whose code runs the build. A `RUN` step may have a bind
mount (of its context or another stage or image) or a tmpfs, and the network `default`
or `none`; the parser directive `syntax` may name Docker's own Dockerfile frontend only.
"""

from __future__ import annotations

import re
from pathlib import Path

from pytest_harbor.tasks.errors import TaskLoadError

__all__ = ["MAX_DOCKERFILE_BYTES", "check_dockerfile", "check_dockerfile_text"]

#: A Dockerfile larger than this is refused before it is read.
MAX_DOCKERFILE_BYTES = 1 << 20
_DIRECTIVE = re.compile(r"^#\s*([a-zA-Z]+)\s*=\s*(\S*)\s*$")
#: Docker's own Dockerfile frontends (any version, optionally pinned by digest).
_OWN_FRONTEND = re.compile(
    r"^(docker\.io/)?docker/dockerfile(-upstream)?(:[\w][\w.-]*)?(@sha256:[0-9a-f]{64})?$"
)
_MOUNT_TYPES = frozenset({"bind", "tmpfs"})
_NETWORKS = frozenset({"default", "none"})
_WHY = {
    "cache": "a cache mount is shared by every build on the engine (one task's build "
    "could plant what another's reads)",
    "secret": "the build is given no secrets",
    "ssh": "the build is given no SSH agent",
}


def check_dockerfile(path: Path) -> None:
    """TaskLoadError naming `path` and the line that asks the builder for more than a
    task may have."""
    try:
        if path.stat().st_size > MAX_DOCKERFILE_BYTES:
            raise TaskLoadError(path, f"is over {MAX_DOCKERFILE_BYTES} bytes")
        text = path.read_text(errors="replace")
    except OSError as error:
        raise TaskLoadError(path, f"cannot be read: {error.strerror or error}") from None
    problem = check_dockerfile_text(text)
    if problem is not None:
        raise TaskLoadError(path, problem)


def check_dockerfile_text(text: str) -> str | None:
    """What in the Dockerfile `text` asks for more than a task may have (`line N: ...`),
    or None."""
    escape = "\\"
    lines = text.splitlines()
    number = 0
    # Parser directives: the comment lines before anything else.
    for number, line in enumerate(lines, 1):
        found = _DIRECTIVE.match(line.strip())
        if not found:
            break
        name, value = found.group(1).lower(), found.group(2)
        if name == "escape" and value in ("\\", "`"):
            escape = value
        elif name == "syntax" and not _OWN_FRONTEND.match(value):
            return (
                f"line {number}: # syntax={value} names an image whose code would run the "
                "build; only Docker's own frontend (docker/dockerfile) may be named"
            )
    for number, instruction in _instructions(lines, escape):
        problem = _check_instruction(instruction)
        if problem is not None:
            return f"line {number}: {problem}"
    return None


def _instructions(lines: list[str], escape: str) -> list[tuple[int, str]]:
    """The instructions with their first line's number: continued lines joined, comment
    lines (which may sit inside a continuation) left out."""
    found: list[tuple[int, str]] = []
    parts: list[str] = []
    first = 0
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if line.startswith("#") or (not line and not parts):
            continue
        if not parts:
            first = number
        if line.endswith(escape):
            parts.append(line[: -len(escape)])
            continue
        parts.append(line)
        found.append((first, " ".join(parts)))
        parts = []
    if parts:
        found.append((first, " ".join(parts)))
    return found


def _check_instruction(instruction: str) -> str | None:
    keyword, _, rest = instruction.partition(" ")
    keyword = keyword.upper()
    if keyword == "ONBUILD":
        return _check_instruction(rest.strip())
    if keyword != "RUN":
        return None
    for flag in rest.split():
        if not flag.startswith("--"):
            break
        name, equals, value = flag[2:].partition("=")
        value = value.strip("\"'")
        if not equals:
            return f"RUN --{name} without a value is not supported (write --{name}=...)"
        if name == "mount":
            problem = _check_mount(value)
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


def _check_mount(value: str) -> str | None:
    options = {
        name.strip().lower(): text for name, _, text in (f.partition("=") for f in value.split(","))
    }
    kind = options.get("type", "bind").strip().lower()
    if kind in _MOUNT_TYPES:
        return None
    why = _WHY.get(kind, "it is not supported (a RUN step may mount a bind or a tmpfs)")
    return f"RUN --mount=type={kind}: {why}; refused"
