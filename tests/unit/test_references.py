"""Datasets by reference without Docker: parsing, registries, and the cache with real git
repositories on this machine."""

from __future__ import annotations

import os
import subprocess
from functools import partial
from pathlib import Path

import pytest

from pytest_harbor.datasets.git import GitError
from pytest_harbor.datasets.references import (
    GitReference,
    ReferenceError,
    RegistryReference,
    parse_reference,
)
from pytest_harbor.datasets.registry import RegistryError, find_dataset, read_registry
from pytest_harbor.datasets.resolve import DatasetCache
from tests.fixtures import write_task
from tests.git_repos import TaskRepo, write_registry


def test_registry_references() -> None:
    assert parse_reference("harbor:terminal-bench@2.0") == RegistryReference(
        "harbor:terminal-bench@2.0", "terminal-bench", "2.0"
    )
    assert parse_reference("harbor:hello").version is None  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("harbor:", "no dataset name"),
        ("harbor:x@", "no version after @"),
        ("harbor:org/name", "package store"),
        ("harbor:.hidden", "one folder name"),
        ("git+ftp://host/repo", "SCHEME one of"),
        ("git+https://host/repo@", "no branch, tag or commit"),
        ("git+https://host/repo#subdir=x", "#subdir= is not known"),
        ("git+https://host/repo#path=../x", "inside the repository"),
    ],
)
def test_bad_references_say_what_is_wrong(given: str, message: str) -> None:
    with pytest.raises(ReferenceError, match=message):
        parse_reference(given)


def test_git_references() -> None:
    assert parse_reference(
        "git+https://example.com/org/repo.git@feature/x#path=tasks/one"
    ) == GitReference(
        given="git+https://example.com/org/repo.git@feature/x#path=tasks/one",
        url="https://example.com/org/repo.git",
        ref="feature/x",
        path="tasks/one",
        name="one",
    )
    top = parse_reference("git+ssh://git@example.com/org/repo.git")
    assert isinstance(top, GitReference)
    assert (top.url, top.ref, top.path, top.name) == (
        "ssh://git@example.com/org/repo.git",
        None,
        "",
        "repo",
    )
    named = parse_reference("git+file:///srv/repo@main#path=tasks&name=mine")
    assert isinstance(named, GitReference) and named.name == "mine"


REGISTRY = [
    {"name": "demo", "version": "1.9", "tasks": []},
    {"name": "demo", "version": "1.10", "tasks": []},
    {"name": "demo", "version": "experimental", "tasks": []},
    {"name": "other", "version": "head", "tasks": []},
    {"name": "other", "version": "3.0", "tasks": []},
]


def test_the_newest_version_is_head_else_the_highest(tmp_path: Path) -> None:
    datasets = read_registry(str(write_registry(tmp_path / "r.json", REGISTRY)), tmp_path, print)
    assert find_dataset(datasets, RegistryReference("harbor:demo", "demo", None), "r").version == (
        "1.10"
    )
    assert find_dataset(datasets, RegistryReference("x", "other", None), "r").version == "head"


def test_a_missing_version_lists_the_versions_there_are(tmp_path: Path) -> None:
    datasets = read_registry(str(write_registry(tmp_path / "r.json", REGISTRY)), tmp_path, print)
    with pytest.raises(
        RegistryError, match=r"no version '2\.0' of demo; it has experimental, 1\.9, 1\.10"
    ):
        find_dataset(datasets, RegistryReference("harbor:demo@2.0", "demo", "2.0"), "r")
    with pytest.raises(RegistryError, match=r"no dataset 'dem'.*similar names: demo"):
        find_dataset(datasets, RegistryReference("harbor:dem", "dem", None), "r")


def test_a_malformed_registry_names_the_entry(tmp_path: Path) -> None:
    path = write_registry(tmp_path / "r.json", [{"name": "x", "version": "1", "tasks": [{}]}])
    with pytest.raises(RegistryError, match=r"\[0\]\.tasks\[0\]\.name: Field required"):
        read_registry(str(path), tmp_path, print)


def test_an_unreachable_registry_url_is_named(tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match=r"cannot reach the registry http://127\.0\.0\.1:9/"):
        read_registry("http://127.0.0.1:9/registry.json", tmp_path, print)


@pytest.fixture
def repo(tmp_path: Path) -> TaskRepo:
    repo = TaskRepo(tmp_path / "repo")
    write_task(repo.path / "tasks", "hello")
    write_task(repo.path / "tasks", "world")
    return repo


def _registry(tmp_path: Path, tasks: list[dict[str, object]]) -> str:
    path = write_registry(
        tmp_path / "registry.json", [{"name": "demo", "version": "1.0", "tasks": tasks}]
    )
    return str(path)


def _git_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Put a `git` first on PATH that writes each call's arguments to a log."""
    shim, log = tmp_path / "shim", tmp_path / "git.log"
    shim.mkdir()
    real = subprocess.run(["which", "git"], capture_output=True, text=True).stdout.strip()
    (shim / "git").write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {real} "$@"\n')
    (shim / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim}{os.pathsep}{os.environ['PATH']}")
    return log


def test_one_fetch_per_repository_and_commit_then_none(
    tmp_path: Path, repo: TaskRepo, monkeypatch: pytest.MonkeyPatch
) -> None:
    commit = repo.commit()
    log = _git_log(tmp_path, monkeypatch)
    registry = _registry(
        tmp_path,
        [
            {
                "name": name,
                "git_url": repo.file_url,
                "git_commit_id": commit,
                "path": f"tasks/{name}",
            }
            for name in ("hello", "world")
        ],
    )
    cache = DatasetCache(tmp_path / "cache", print)
    resolved = cache.resolve("harbor:demo@1.0", registry)
    assert sorted(p.name for p in resolved.path.iterdir()) == ["hello", "world"]
    assert [t.git_commit_id for t in resolved.tasks] == [commit, commit]
    fetches = [line for line in log.read_text().splitlines() if " fetch " in line]
    assert len(fetches) == 1
    log.unlink()
    again = DatasetCache(tmp_path / "cache", print).resolve("harbor:demo@1.0", registry)
    assert again == resolved
    assert " fetch " not in (log.read_text() if log.exists() else "")


def test_a_branch_is_resolved_to_its_commit_once(tmp_path: Path, repo: TaskRepo) -> None:
    first = repo.commit()
    registry = _registry(
        tmp_path,
        [
            {
                "name": "hello",
                "git_url": repo.file_url,
                "git_commit_id": "main",
                "path": "tasks/hello",
            }
        ],
    )
    resolved = DatasetCache(tmp_path / "cache", print).resolve("harbor:demo", registry)
    assert (resolved.tasks[0].ref, resolved.tasks[0].git_commit_id) == ("main", first)
    (repo.path / "tasks" / "hello" / "instruction.md").write_text("Changed.\n")
    second = repo.commit()
    moved = DatasetCache(tmp_path / "cache", print).resolve("harbor:demo", registry)
    assert moved.tasks[0].git_commit_id == second
    assert moved.tasks[0].digest != resolved.tasks[0].digest
    assert (moved.path / "hello" / "instruction.md").read_text() == "Changed.\n"


def test_an_unreachable_repository_uses_the_branch_as_last_resolved(
    tmp_path: Path, repo: TaskRepo
) -> None:
    commit = repo.commit()
    registry = _registry(
        tmp_path,
        [
            {
                "name": "hello",
                "git_url": repo.file_url,
                "git_commit_id": "main",
                "path": "tasks/hello",
            }
        ],
    )
    DatasetCache(tmp_path / "cache", print).resolve("harbor:demo", registry)
    repo.path.rename(tmp_path / "gone")
    said: list[str] = []
    offline = DatasetCache(tmp_path / "cache", said.append).resolve("harbor:demo", registry)
    assert offline.tasks[0].git_commit_id == commit and not offline.refused
    assert any(f"using main = {commit[:12]}" in text for text in said)


def test_a_missing_repository_commit_or_folder_refuses_that_task_only(
    tmp_path: Path, repo: TaskRepo
) -> None:
    commit = repo.commit()
    registry = _registry(
        tmp_path,
        [
            {
                "name": "hello",
                "git_url": repo.file_url,
                "git_commit_id": commit,
                "path": "tasks/hello",
            },
            {"name": "no-commit", "git_url": repo.file_url, "git_commit_id": "1" * 40, "path": "x"},
            {
                "name": "no-repo",
                "git_url": f"file://{tmp_path}/nope",
                "git_commit_id": commit,
                "path": "x",
            },
            {"name": "no-folder", "git_url": repo.file_url, "git_commit_id": commit, "path": "y"},
            {"name": "no-branch", "git_url": repo.file_url, "git_commit_id": "nope", "path": "x"},
        ],
    )
    resolved = DatasetCache(tmp_path / "cache", print).resolve("harbor:demo", registry)
    assert [task.name for task in resolved.tasks] == ["hello"]
    assert set(resolved.refused) == {"no-commit", "no-repo", "no-folder", "no-branch"}
    assert f"has no commit {'1' * 40}" in resolved.refused["no-commit"]
    assert "does not appear to be a git repository" in resolved.refused["no-repo"]
    assert "did not match any files" in resolved.refused["no-folder"]
    assert "no branch or tag 'nope'" in resolved.refused["no-branch"]


def test_a_changed_cache_entry_is_fetched_again_and_said(tmp_path: Path, repo: TaskRepo) -> None:
    commit = repo.commit()
    reference = f"git+{repo.file_url}@{commit}#path=tasks/hello"
    resolved = DatasetCache(tmp_path / "cache", print).resolve(reference, "unused")
    (entry,) = (tmp_path / "cache" / "tasks").glob("*/tree")
    (entry / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (resolved.path / "solution" / "solve.sh").unlink()
    said: list[str] = []
    again = DatasetCache(tmp_path / "cache", said.append).resolve(reference, "unused")
    assert any("changed since it was fetched" in text and "fetched again" in text for text in said)
    assert again.tasks == resolved.tasks
    assert (again.path / "tests" / "test.sh").read_text() == (
        repo.path / "tasks" / "hello" / "tests" / "test.sh"
    ).read_text()
    assert (again.path / "solution" / "solve.sh").is_file()


def test_a_link_out_of_the_repository_is_refused(tmp_path: Path, repo: TaskRepo) -> None:
    (repo.path / "tasks" / "hello" / "tests" / "passwd").symlink_to("../../../../../etc/passwd")
    commit = repo.commit()
    with pytest.raises(GitError, match="outside the repository"):
        DatasetCache(tmp_path / "cache", print).resolve(
            f"git+{repo.file_url}@{commit}#path=tasks/hello", "unused"
        )


def test_a_git_reference_leaves_out_the_conftest_at_its_top(tmp_path: Path, repo: TaskRepo) -> None:
    (repo.path / "tasks" / "conftest.py").write_text("raise SystemExit('imported')\n")
    repo.commit()
    resolved = DatasetCache(tmp_path / "cache", print).resolve(
        f"git+{repo.file_url}#path=tasks", "unused"
    )
    assert resolved.name == "tasks"
    assert sorted(p.name for p in resolved.path.iterdir()) == ["hello", "world"]


def test_tasks_at_several_commits_take_one_fetch_each(
    tmp_path: Path, repo: TaskRepo, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = repo.commit()
    (repo.path / "tasks" / "world" / "instruction.md").write_text("The second commit's.\n")
    second = repo.commit()
    log = _git_log(tmp_path, monkeypatch)
    registry = _registry(
        tmp_path,
        [
            {
                "name": "hello",
                "git_url": repo.file_url,
                "git_commit_id": first,
                "path": "tasks/hello",
            },
            {
                "name": "world",
                "git_url": repo.file_url,
                "git_commit_id": second,
                "path": "tasks/world",
            },
            {
                "name": "old-world",
                "git_url": repo.file_url,
                "git_commit_id": first,
                "path": "tasks/world",
            },
        ],
    )
    resolved = DatasetCache(tmp_path / "cache", print).resolve("harbor:demo", registry)
    assert not resolved.refused
    assert (resolved.path / "world" / "instruction.md").read_text() == "The second commit's.\n"
    assert (resolved.path / "old-world" / "instruction.md").read_text() != (
        "The second commit's.\n"
    )
    fetches = [line for line in log.read_text().splitlines() if " fetch " in line]
    assert len(fetches) == 2


def test_a_registry_url_read_once_is_read_from_its_kept_copy_when_unreachable(
    tmp_path: Path,
) -> None:
    """Served on 127.0.0.1, then gone: the copy kept of it is read, with a warning."""
    import http.server
    import threading

    write_registry(tmp_path / "registry.json", REGISTRY)
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/registry.json"
    try:
        online = read_registry(url, tmp_path / "cache", print)
    finally:
        server.shutdown()
        server.server_close()
    said: list[str] = []
    offline = read_registry(url, tmp_path / "cache", said.append)
    assert offline == online and len(online) == len(REGISTRY)
    assert len(said) == 1 and "using the copy read before" in said[0]


def test_a_registry_task_whose_name_is_no_folder_name_is_refused(
    tmp_path: Path, repo: TaskRepo
) -> None:
    commit = repo.commit()
    registry = _registry(
        tmp_path,
        [
            {
                "name": "hello",
                "git_url": repo.file_url,
                "git_commit_id": commit,
                "path": "tasks/hello",
            },
            {
                "name": "../escape",
                "git_url": repo.file_url,
                "git_commit_id": commit,
                "path": "tasks/world",
            },
            {"name": "local", "path": "/etc"},
        ],
    )
    resolved = DatasetCache(tmp_path / "cache", print).resolve("harbor:demo", registry)
    assert [task.name for task in resolved.tasks] == ["hello"]
    assert "one folder name" in resolved.refused["../escape"]
    assert "no git_url" in resolved.refused["local"]
    assert sorted(path.name for path in resolved.path.iterdir()) == ["hello"]
