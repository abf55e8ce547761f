"""Datasets by reference, end to end: a registry in Harbor's format naming tasks of a real
git repository served on 127.0.0.1, run through the oracle in Docker."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.fixtures import write_task
from tests.git_repos import TaskRepo, git_daemon, write_registry

pytestmark = pytest.mark.docker


class Served:
    """A repository of two tasks (`hello`, `world`) served by `git daemon`, a registry
    naming them, and a dataset name unique to the test (tasksets label containers)."""

    def __init__(self, root: Path, url: str) -> None:
        self.repo = TaskRepo(root / "repo")
        write_task(self.repo.path / "tasks", "hello")
        write_task(self.repo.path / "tasks", "world")
        self.first = self.repo.commit("two tasks")
        self.url = f"{url}/repo"
        self.name = f"ref-{uuid.uuid4().hex[:8]}"
        self.registry = root / "registry.json"

    def register(self, tasks: list[dict[str, Any]], version: str = "1.0") -> None:
        write_registry(self.registry, [{"name": self.name, "version": version, "tasks": tasks}])

    def task(self, name: str, commit: str, url: str | None = None) -> dict[str, Any]:
        return {
            "name": name,
            "git_url": url or self.url,
            "git_commit_id": commit,
            "path": f"tasks/{name}",
        }

    def run(self, pytester: pytest.Pytester, *args: str, **kwargs: Any) -> pytest.RunResult:
        return pytester.runpytest(
            f"--harbor-dataset=harbor:{self.name}",
            f"--harbor-registry={self.registry}",
            f"--harbor-cache-dir={pytester.path / 'cache'}",
            "--harbor-results-dir=out",
            *args,
            **kwargs,
        )

    def manifest(self, pytester: pytest.Pytester) -> dict[str, Any]:
        folder = pytester.path / "out/harbor/validation" / self.name / "latest"
        data: dict[str, Any] = json.loads((folder / "rollouts_manifest.json").read_text())
        return data


@pytest.fixture
def served(
    pytester: pytest.Pytester, docker_client: docker.DockerClient
) -> Iterator[tuple[Served, Any]]:
    root = pytester.path / "served"
    root.mkdir()
    with git_daemon(root) as url:
        yield Served(root, url), url


def test_a_registry_dataset_runs_then_runs_again_offline_from_the_cache(
    pytester: pytest.Pytester, served: tuple[Served, Any]
) -> None:
    ref, _ = served
    ref.register([ref.task("hello", ref.first), ref.task("world", ref.first)])
    result = ref.run(pytester, "-n", "2")
    result.assert_outcomes(passed=2)
    recorded = ref.manifest(pytester)
    assert recorded["target"] == f"harbor:{ref.name}"
    assert recorded["taskset"] == ref.name
    assert {task["name"]: task["git_commit_id"] for task in recorded["reference"]["tasks"]} == {
        "hello": ref.first,
        "world": ref.first,
    }
    assert recorded["reference"]["version"] == "1.0"
    assert len(list((pytester.path / "cache" / "repos").glob("*.git"))) == 1


def test_offline_rerun_and_a_corrupted_entry(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """The second run has no server at all; a cache entry changed since its fetch is
    fetched again (from the objects kept), and said."""
    root = pytester.path / "served"
    root.mkdir()
    with git_daemon(root) as url:
        ref = Served(root, url)
        ref.register([ref.task("hello", ref.first), ref.task("world", ref.first)])
        ref.run(pytester).assert_outcomes(passed=2)
        digests = ref.manifest(pytester)["task_digests"]
    # The daemon is gone: nothing can be fetched now.
    (entry,) = [
        path
        for path in (pytester.path / "cache" / "tasks").glob("*/tree")
        if (path / "task.toml").is_file() and "hello" in (path.parent / "entry.json").read_text()
    ]
    (entry / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    result = ref.run(pytester)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*cached copy of hello*changed since it was fetched*"])
    assert ref.manifest(pytester)["task_digests"] == digests


def test_a_branch_that_moved_is_resolved_again_and_the_results_record_the_commit(
    pytester: pytest.Pytester, served: tuple[Served, Any]
) -> None:
    ref, _ = served
    ref.register([ref.task("hello", "main")], version="head")
    ref.run(pytester).assert_outcomes(passed=1)
    before = ref.manifest(pytester)
    assert before["reference"]["tasks"][0]["git_commit_id"] == ref.first
    assert before["reference"]["tasks"][0]["ref"] == "main"
    (ref.repo.path / "tasks" / "hello" / "instruction.md").write_text("Write 1, again.\n")
    second = ref.repo.commit("reworded")
    ref.run(pytester).assert_outcomes(passed=1)
    after = ref.manifest(pytester)
    assert after["reference"]["tasks"][0]["git_commit_id"] == second
    assert after["task_digests"]["hello"] != before["task_digests"]["hello"]


def test_a_task_that_cannot_be_fetched_is_refused_and_the_others_run(
    pytester: pytest.Pytester, served: tuple[Served, Any]
) -> None:
    ref, url = served
    ref.register(
        [
            ref.task("hello", ref.first),
            ref.task("world", "0" * 40),
            ref.task("elsewhere", ref.first, url=f"{url}/no-such-repo"),
        ]
    )
    stopped = ref.run(pytester)
    assert stopped.ret != 0
    stopped.stdout.fnmatch_lines(["*world*not fetched*has no commit 0000000000*"])
    going = ref.run(pytester, "--harbor-skip-unloadable")
    going.assert_outcomes(passed=1)
    skipped = json.loads(
        (pytester.path / "out/harbor/validation" / ref.name / "latest" / "skipped.json").read_text()
    )
    assert sorted(skipped) == ["elsewhere", "world"]
    assert "no-such-repo" in skipped["elsewhere"]


def test_a_git_reference_runs_on_workers_that_never_fetch(
    pytester: pytest.Pytester, served: tuple[Served, Any]
) -> None:
    ref, _ = served
    name = f"git-{uuid.uuid4().hex[:8]}"
    result = pytester.runpytest(
        f"--harbor-dataset=git+{ref.url}@main#path=tasks&name={name}",
        f"--harbor-cache-dir={pytester.path / 'cache'}",
        "--harbor-results-dir=out",
        "-n",
        "2",
    )
    result.assert_outcomes(passed=2)
    manifest = json.loads(
        (
            pytester.path / "out/harbor/validation" / name / "latest" / "rollouts_manifest.json"
        ).read_text()
    )
    assert manifest["reference"]["tasks"][0]["git_commit_id"] == ref.first


def test_references_that_cannot_run_are_usage_errors(
    pytester: pytest.Pytester, served: tuple[Served, Any]
) -> None:
    ref, _ = served
    ref.register([ref.task("hello", ref.first)])
    unreachable = pytester.runpytest(
        f"--harbor-dataset=harbor:{ref.name}",
        "--harbor-registry=http://127.0.0.1:9/registry.json",
        f"--harbor-cache-dir={pytester.path / 'cache'}",
    )
    assert unreachable.ret == pytest.ExitCode.USAGE_ERROR
    unreachable.stderr.fnmatch_lines(
        ["*cannot reach the registry http://127.0.0.1:9/registry.json*"]
    )
    missing = ref.run(pytester, f"--harbor-dataset=harbor:{ref.name}@9.9")
    assert missing.ret == pytest.ExitCode.USAGE_ERROR
    missing.stderr.fnmatch_lines(["*has no version '9.9' of ref-*; it has 1.0*"])
    twice = ref.run(pytester, f"--harbor-dataset=git+{ref.url}#path=tasks&name={ref.name}")
    assert twice.ret == pytest.ExitCode.USAGE_ERROR
    twice.stderr.fnmatch_lines([f"*two targets share the taskset name '{ref.name}'*"])
