"""What a `--harbor-dataset` value names: a folder, a dataset of a registry, or a git tree."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

__all__ = [
    "DEFAULT_REGISTRY",
    "GIT_PREFIX",
    "REGISTRY_PREFIX",
    "GitReference",
    "ReferenceError",
    "RegistryReference",
    "is_reference",
    "parse_reference",
    "taskset_name_error",
]

#: Harbor's public registry (what `harbor run -d NAME@VERSION` reads).
DEFAULT_REGISTRY = "https://raw.githubusercontent.com/laude-institute/harbor/main/registry.json"
REGISTRY_PREFIX = "harbor:"
GIT_PREFIX = "git+"
#: The URL schemes a git reference may use (`git+https://...`); scp-like `host:path`
#: has no scheme to tell it from a folder, so it is not taken.
GIT_SCHEMES = ("https", "http", "ssh", "git", "file")

_FULL_COMMIT = re.compile(r"[0-9a-f]{40}")


class ReferenceError(ValueError):
    """A reference that cannot be read; the message names the part that is wrong."""


@dataclass(frozen=True)
class RegistryReference:
    """`harbor:NAME@VERSION`, or `harbor:NAME` for the registry's newest version."""

    given: str
    name: str
    version: str | None


@dataclass(frozen=True)
class GitReference:
    """`git+URL[@REF][#path=SUBFOLDER&name=TASKSET]`: one task or a folder of tasks."""

    given: str
    url: str
    #: A branch, a tag or a full commit id; None is the repository's HEAD.
    ref: str | None
    #: The folder inside the repository ("" for its top).
    path: str
    #: The taskset name: `name=` when given, else the last part of the path (or of the
    #: repository's URL, without `.git`).
    name: str


def is_reference(text: str) -> bool:
    return text.startswith((REGISTRY_PREFIX, GIT_PREFIX))


def is_full_commit(ref: str | None) -> bool:
    return ref is not None and _FULL_COMMIT.fullmatch(ref) is not None


def parse_reference(text: str) -> RegistryReference | GitReference:
    if text.startswith(REGISTRY_PREFIX):
        return _registry_reference(text)
    if text.startswith(GIT_PREFIX):
        return _git_reference(text)
    raise ReferenceError(f"{text!r} is neither harbor:NAME[@VERSION] nor git+URL[@REF]")


def _registry_reference(text: str) -> RegistryReference:
    body = text[len(REGISTRY_PREFIX) :]
    name, sep, version = body.partition("@")
    if not name:
        raise ReferenceError(f"{text!r}: no dataset name after harbor:")
    if sep and not version:
        raise ReferenceError(f"{text!r}: no version after @ (leave out @ for the newest)")
    if "/" in name:
        raise ReferenceError(
            f"{text!r}: ORG/NAME names a dataset of Harbor's package store, which this "
            "release does not fetch; name a dataset of a registry (harbor:NAME[@VERSION]) "
            "or its git tree (git+URL@COMMIT#path=FOLDER)"
        )
    problem = taskset_name_error(name)
    if problem:
        raise ReferenceError(f"{text!r}: the dataset name {problem}")
    return RegistryReference(given=text, name=name, version=version or None)


def _git_reference(text: str) -> GitReference:
    body, _, fragment = text[len(GIT_PREFIX) :].partition("#")
    parts = urlsplit(body)
    if parts.scheme not in GIT_SCHEMES or not (parts.netloc or parts.scheme == "file"):
        raise ReferenceError(
            f"{text!r}: expected git+SCHEME://HOST/REPO[@REF] with SCHEME one of "
            f"{', '.join(GIT_SCHEMES)}"
        )
    # The ref follows the last @ of the URL's path (a user@ sits in the host part).
    repo_path, sep, ref = parts.path.rpartition("@")
    if not sep:
        repo_path, ref = parts.path, ""
    elif not ref:
        raise ReferenceError(f"{text!r}: no branch, tag or commit after @")
    url = f"{parts.scheme}://{parts.netloc}{repo_path}"
    if parts.query:
        url += f"?{parts.query}"
    options = parse_qs(fragment, keep_blank_values=True) if fragment else {}
    unknown = sorted(set(options) - {"path", "name"})
    if unknown:
        raise ReferenceError(f"{text!r}: #{unknown[0]}= is not known (#path= and #name= are)")
    path = "/".join(part for part in options.get("path", [""])[-1].split("/") if part)
    if any(part in (".", "..") for part in path.split("/")):
        raise ReferenceError(f"{text!r}: #path= must stay inside the repository")
    default = path.rsplit("/", 1)[-1] if path else repo_path.rstrip("/").rsplit("/", 1)[-1]
    name = options.get("name", [default.removesuffix(".git")])[-1]
    problem = taskset_name_error(name)
    if problem:
        raise ReferenceError(f"{text!r}: the taskset name {name!r} {problem} (give #name=)")
    return GitReference(given=text, url=url, ref=ref or None, path=path, name=name)


def taskset_name_error(name: str) -> str | None:
    """Why `name` cannot name a taskset (it becomes a folder of the results), or None."""
    if not name or name in (".", ".."):
        return "is empty"
    if "/" in name or "\0" in name or name.startswith("."):
        return "must be one folder name (no /, not starting with .)"
    return None
