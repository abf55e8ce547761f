"""The git client, driven for the dataset cache: refs resolved to commits, one shallow fetch
per repository and commit, and a folder of a commit taken out of the fetched objects."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from pytest_harbor.atomic import write_atomically
from pytest_harbor.datasets.references import is_full_commit
from pytest_harbor.locks import held
from pytest_harbor.untrusted import load_json

__all__ = ["GitError", "GitStore"]

_FETCH_TIMEOUT_S = 900.0
_QUICK_TIMEOUT_S = 120.0


class GitError(Exception):
    """A repository, ref, commit or folder git cannot give; the message says which."""


class GitStore:
    """Bare repositories under `root/repos`, one per URL, holding only the commits asked
    for; what each branch or tag was resolved to, in `root/refs.json`."""

    def __init__(self, root: Path, warn: Callable[[str], None]) -> None:
        self.root = root
        self._warn = warn
        self._resolved: dict[tuple[str, str], str] = {}

    def resolve(self, url: str, ref: str | None) -> str:
        """The commit `ref` (a branch, a tag, None for HEAD, or a commit id) names now; the
        same answer for the rest of this run. When the repository cannot be reached, the
        answer kept from an earlier run is used, with a warning."""
        if is_full_commit(ref):
            assert ref is not None
            return ref
        name = ref or "HEAD"
        known = self._resolved.get((url, name))
        if known is not None:
            return known
        try:
            commit = self._ls_remote(url, name)
        except GitError as error:
            kept = self._kept_refs().get(url, {}).get(name)
            if kept is None:
                raise
            self._warn(
                f"{error}; using {name} = {kept['commit'][:12]} as resolved at "
                f"{kept['resolved_at']}"
            )
            commit = kept["commit"]
        else:
            self._keep_ref(url, name, commit)
        self._resolved[(url, name)] = commit
        return commit

    def fetch(self, url: str, commit: str) -> None:
        """Make `commit` of `url` present: nothing to do when it already is (no network)."""
        repo = self._repo(url)
        repo.parent.mkdir(parents=True, exist_ok=True)
        with held(repo.with_suffix(".lock")):
            if not (repo / "HEAD").is_file():
                shutil.rmtree(repo, ignore_errors=True)
                _git("init", "--quiet", "--bare", str(repo))
            if self._has(repo, commit):
                return
            fetch = ("-C", str(repo), "fetch", "--quiet", "--no-tags")
            what = f"cannot fetch {commit[:12]} from {url}"
            try:
                _git(*fetch, "--depth=1", url, commit, timeout=_FETCH_TIMEOUT_S, what=what)
            except GitError as shallow:
                # A server that takes no commit id in a fetch: take its branches and tags.
                branches_and_tags = (
                    "+refs/heads/*:refs/fetched/heads/*",
                    "+refs/tags/*:refs/fetched/tags/*",
                )
                try:
                    _git(*fetch, url, *branches_and_tags, timeout=_FETCH_TIMEOUT_S)
                except GitError:
                    raise shallow from None
            if not self._has(repo, commit):
                raise GitError(f"{url} has no commit {commit}")

    def export(self, url: str, commit: str, path: str, destination: Path) -> None:
        """Write the folder `path` of `commit` (the whole tree for "") to `destination`,
        which must not exist. Links that leave the folder and absolute paths are refused."""
        repo = self._repo(url)
        spec = [path] if path else []
        with tempfile.TemporaryDirectory(dir=destination.parent, prefix=".export-") as scratch:
            archive = Path(scratch) / "tree.tar"
            with archive.open("wb") as handle:
                _git(
                    "-C",
                    str(repo),
                    "archive",
                    "--format=tar",
                    commit,
                    "--",
                    *spec,
                    stdout=handle,
                    what=f"{url} at {commit[:12]}: {path or '(top)'}",
                )
            unpacked = Path(scratch) / "tree"
            with tarfile.open(archive) as tar:
                _check_members(tar, url, commit)
                tar.extractall(unpacked, filter="data")
            source = unpacked / path if path else unpacked
            if not source.is_dir():
                raise GitError(f"{url} at {commit[:12]}: {path} is not a folder")
            os.replace(source, destination)

    def _repo(self, url: str) -> Path:
        return self.root / "repos" / (hashlib.sha256(url.encode()).hexdigest()[:24] + ".git")

    @staticmethod
    def _has(repo: Path, commit: str) -> bool:
        try:
            _git("-C", str(repo), "cat-file", "-e", f"{commit}^{{commit}}")
        except GitError:
            return False
        return True

    def _ls_remote(self, url: str, name: str) -> str:
        out = _git(
            "ls-remote",
            url,
            name,
            f"refs/heads/{name}",
            f"refs/tags/{name}",
            f"refs/tags/{name}^{{}}",
            what=f"cannot resolve {name} of {url}",
        )
        found: dict[str, str] = {}
        for line in out.splitlines():
            commit, _, ref = line.partition("\t")
            found[ref] = commit
        for ref in (f"refs/tags/{name}^{{}}", name, f"refs/heads/{name}", f"refs/tags/{name}"):
            if ref in found:
                return found[ref]
        raise GitError(f"{url} has no branch or tag {name!r}")

    def _kept_refs(self) -> dict[str, dict[str, dict[str, str]]]:
        try:
            data = load_json((self.root / "refs.json").read_bytes()).value
        except OSError:
            return {}
        return data if isinstance(data, dict) else {}

    def _keep_ref(self, url: str, name: str, commit: str) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with held(self.root / "refs.lock"):
            kept = self._kept_refs()
            kept.setdefault(url, {})[name] = {
                "commit": commit,
                "resolved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            write_atomically(self.root / "refs.json", json.dumps(kept, indent=2) + "\n")


def _check_members(tar: tarfile.TarFile, url: str, commit: str) -> None:
    """Refuse what could write or point outside the folder being made."""
    for member in tar.getmembers():
        parts = Path(member.name).parts
        if member.name.startswith("/") or ".." in parts:
            raise GitError(f"{url} at {commit[:12]}: {member.name} leaves the folder")
        if member.issym() or member.islnk():
            target = Path(member.name).parent / member.linkname
            if member.linkname.startswith("/") or ".." in Path(os.path.normpath(target)).parts:
                raise GitError(
                    f"{url} at {commit[:12]}: {member.name} links to {member.linkname}, "
                    "outside the repository"
                )


def _git(
    *args: str,
    timeout: float = _QUICK_TIMEOUT_S,
    stdout: IO[Any] | None = None,
    what: str | None = None,
) -> str:
    """Run git without prompts (a repository that wants a password fails instead)."""
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true", "LC_ALL": "C"}
    try:
        done = subprocess.run(
            ["git", *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=stdout if stdout is not None else subprocess.PIPE,
            stderr=subprocess.PIPE,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError:
        raise GitError("the git client is not installed (datasets by reference need it)") from None
    except subprocess.TimeoutExpired:
        raise GitError(
            f"git {args[0] if args[0] != '-C' else args[2]} took over {timeout:.0f} s"
        ) from None
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        # git's own reason is its first `fatal:`/`error:` line; advice follows it.
        reasons = [line for line in lines if line.startswith(("fatal:", "error:"))]
        message = (reasons or lines or [f"git exited {done.returncode}"])[0]
        message = message.removeprefix("fatal: ").removeprefix("error: ")
        raise GitError(f"{what}: {message}" if what else message)
    return "" if stdout is not None else done.stdout.decode(errors="replace")
