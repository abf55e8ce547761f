"""A Compose service's `build`, as `docker compose config` writes it, read into a context
and the options a build is given (BuildOptions): one reader per key, and the keys this
builder refuses or leaves aside, each with why."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_harbor.sandboxes.base import BuildOptions
from pytest_harbor.sandboxes.compose.model import RESERVED_LABEL_PREFIXES, ComposeRefused
from pytest_harbor.tasks.dockerfiles import MAX_DOCKERFILE_BYTES, check_dockerfile_text

__all__ = ["ServiceBuild", "service_build"]


@dataclass(frozen=True)
class ServiceBuild:
    """A service's `build`: its context (a folder of the task) and its options."""

    context: Path
    options: BuildOptions = field(default_factory=BuildOptions)


#: Build keys that cannot change the image and that this builder leaves aside: a cache to
#: read from (the engine's own cache and the content hash serve) and further names for
#: the image (the service runs it by its content hash).
_BUILD_KEYS_IGNORED = frozenset({"cache_from", "tags", "provenance", "sbom"})
#: Keys read apart from the options: where the build is, and which Dockerfile.
_BUILD_KEYS_APART = frozenset({"context", "dockerfile"})
#: Build keys refused when set, with why: each reaches beyond the task folder and the
#: engine's own build, or cannot be given to both builders (BuildKit and the classic one)
#: alike.
_BUILD_KEYS_REFUSED = {
    "ssh": "hands this machine's SSH agent or keys to the build",
    "secrets": "mounts secrets into the build, which the classic builder cannot",
    "additional_contexts": "adds named contexts, which the classic builder cannot take",
    "cache_to": "writes the build cache outside the engine",
    "privileged": "runs the build's steps privileged, which reaches the host",
    "entitlements": "grants the build's steps host privileges",
    "ulimits": "sets limits on the build's steps, which the classic builder cannot",
    "shm_size": "sizes /dev/shm for the build's steps, which BuildKit ignores on some engines",
}

#: A build key's reader: (the Compose file, the key's path, its value) to the options it
#: sets (none: the default); ComposeRefused when the value cannot be honoured here.
_Reader = Callable[[Path, str, Any], dict[str, Any]]


def _text(option: str) -> _Reader:
    return lambda file, key, value: {option: str(value)}


def _on(file: Path, key: str, value: Any) -> dict[str, Any]:
    return {key.rsplit(".", 1)[-1]: True}


def _args(file: Path, key: str, value: Any) -> dict[str, Any]:
    pairs = _pairs(value)
    for name, _ in pairs:
        if name.upper().startswith("BUILDKIT_"):
            raise ComposeRefused(
                file,
                f"the build argument {name} sets how BuildKit builds (its frontend, its "
                "cache); a task may not set it",
                f"{key}.{name}",
            )
    return {"args": pairs}


def _labels(file: Path, key: str, value: Any) -> dict[str, Any]:
    pairs = _pairs(value)
    for label, _ in pairs:
        if label.startswith(RESERVED_LABEL_PREFIXES):
            raise ComposeRefused(
                file,
                f"the label {label} is the engine's own; a task may not set it",
                f"{key}.{label}",
            )
    return {"labels": pairs}


def _extra_hosts(file: Path, key: str, value: Any) -> dict[str, Any]:
    return {"extra_hosts": _hosts(value)}


def _network(file: Path, key: str, value: Any) -> dict[str, Any]:
    network = str(value)
    if network == "default":
        return {"network": None}
    if network == "none":
        return {"network": network}
    if network == "host":
        raise ComposeRefused(file, "network: host reaches the host; refused", key)
    raise ComposeRefused(
        file,
        f"network {network!r}: a build joins none of the project's networks (they exist "
        "once the episode starts); use default or none",
        key,
    )


def _platforms(file: Path, key: str, value: Any) -> dict[str, Any]:
    platforms = list(value or [])
    if len(platforms) > 1:
        raise ComposeRefused(
            file, "names several platforms; an engine holds one image per name", key
        )
    return {"platform": str(platforms[0]) if platforms else None}


def _isolation(file: Path, key: str, value: Any) -> dict[str, Any]:
    if str(value) != "default":
        raise ComposeRefused(
            file, f"isolation {value} is for Windows containers, which are refused", key
        )
    return {}


#: The build keys honoured, each with its reader.
_READERS: dict[str, _Reader] = {
    "dockerfile_inline": _text("dockerfile_inline"),
    "target": _text("target"),
    "args": _args,
    "labels": _labels,
    "extra_hosts": _extra_hosts,
    "no_cache": _on,
    "pull": _on,
    "network": _network,
    "platforms": _platforms,
    "isolation": _isolation,
}


def service_build(
    file: Path, root: Path, where: str, build: Mapping[str, Any], allow_remote_add: bool = False
) -> ServiceBuild:
    """A service's canonical `build` (as `docker compose config` writes it; `where` is its
    key path) as a context and options, checked: ComposeRefused names the key that cannot
    be honoured here. Compose has already resolved an argument given without a value (from
    the environment and `.env`) or left it out when none set it. `allow_remote_add` lets
    the Dockerfile's `ADD` fetch a URL."""
    context = Path(str(build.get("context", "."))).resolve()
    if context != root and root not in context.parents:
        raise ComposeRefused(file, f"builds {context}, outside the task folder", f"{where}.context")
    options: dict[str, Any] = {}
    for key, value in build.items():
        options.update(_option(file, f"{where}.{key}", key, value))
    dockerfile = _dockerfile(file, root, where, context, build, "dockerfile_inline" in options)
    _check_dockerfile(file, where, dockerfile or context / "Dockerfile", options, allow_remote_add)
    return ServiceBuild(context, BuildOptions(dockerfile=dockerfile, **options))


def _option(file: Path, key: str, name: str, value: Any) -> dict[str, Any]:
    """The options one build key sets (refused, left aside, or read by its reader)."""
    if name in _BUILD_KEYS_REFUSED and value:
        raise ComposeRefused(file, f"{name} {_BUILD_KEYS_REFUSED[name]}; refused (remove it)", key)
    # An empty or false option is the default; `x-` keys are extensions.
    left_aside = name in _BUILD_KEYS_APART or name in _BUILD_KEYS_IGNORED
    if not value or left_aside or name.startswith("x-"):
        return {}
    reader = _READERS.get(name)
    if reader is None:
        raise ComposeRefused(
            file,
            f"build option {name} is not supported (remove it; supported: context, "
            "dockerfile, dockerfile_inline, args, target, labels, extra_hosts, "
            "network, platforms, no_cache, pull)",
            key,
        )
    return reader(file, key, value)


def _check_dockerfile(
    file: Path, where: str, named: Path, options: Mapping[str, Any], allow_remote_add: bool
) -> None:
    """The Dockerfile the build reads (`named`, or its inline text) is within its size and
    says nothing the engine refuses, read with the build's arguments."""
    text = options.get("dockerfile_inline")
    if text is None and named.stat().st_size > MAX_DOCKERFILE_BYTES:
        raise ComposeRefused(file, f"{named} is over {MAX_DOCKERFILE_BYTES} bytes", f"{where}")
    problem = check_dockerfile_text(
        text or named.read_bytes().decode("utf-8", errors="replace"),
        allow_remote_add=allow_remote_add,
        args=dict(options.get("args", ())),
    )
    if problem is not None:
        shown = "its dockerfile_inline" if text is not None else str(named)
        raise ComposeRefused(file, f"{shown}, {problem}", f"{where}.dockerfile")


def _dockerfile(
    file: Path,
    root: Path,
    where: str,
    context: Path,
    build: Mapping[str, Any],
    inline: bool,
) -> Path | None:
    """The Dockerfile a build names, when not the context's own `Dockerfile`: a file in
    the task folder (a path is from the context)."""
    named = build.get("dockerfile")
    if inline:
        if named not in (None, "Dockerfile"):
            raise ComposeRefused(
                file, "names both a dockerfile and a dockerfile_inline", f"{where}.dockerfile"
            )
        return None
    path = (context / str(named or "Dockerfile")).resolve()
    if path != root and root not in path.parents:
        raise ComposeRefused(
            file, f"names the Dockerfile {path}, outside the task folder", f"{where}.dockerfile"
        )
    if not path.is_file():
        raise ComposeRefused(file, f"{path} is missing", f"{where}.dockerfile")
    return None if path == (context / "Dockerfile").resolve() else path


def _pairs(value: Any) -> tuple[tuple[str, str], ...]:
    """A Compose map or list (`["A=1", "B"]`) as sorted `(name, value)` pairs. An entry
    with no value is left out: Compose's rule for a build argument nothing sets."""
    if isinstance(value, Mapping):
        entries = [(str(name), item) for name, item in value.items()]
    else:
        entries = [
            (name, item if found else None)
            for name, found, item in (str(entry).partition("=") for entry in value or [])
        ]
    return tuple(sorted((name, str(item)) for name, item in entries if item is not None))


def _hosts(value: Any) -> tuple[tuple[str, str], ...]:
    """`extra_hosts` as sorted `(host, address)` pairs: a map, or a list of `host=address`
    (Compose's canonical form) or `host:address` (an IPv6 address keeps its colons)."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(host), str(address)) for host, address in value.items()))
    pairs = []
    for entry in value or []:
        text = str(entry)
        host, _, address = text.partition("=" if "=" in text else ":")
        pairs.append((host, address))
    return tuple(sorted(pairs))
