"""A sandbox provider from a separately installed package, end to end: the example of
docs/write-a-provider.md, installed with pip and found through its entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import docker
import pytest

from tests.fixtures import BASE_IMAGE, REPO_ROOT, Dataset, SandboxWatcher, install_example

pytestmark = pytest.mark.docker

PACKAGE = REPO_ROOT / "docs" / "examples" / "audited-docker-provider"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example package installed with pip (its own folder, not this virtualenv)."""
    target = install_example(PACKAGE, tmp_path_factory)
    assert list(target.glob("harbor_audited_docker-1.0.0.dist-info/entry_points.txt"))
    return target


def run_pytest(installed: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest in a process of its own, the package found on PYTHONPATH (this checkout's
    pytest-harbor first)."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(installed), str(REPO_ROOT)])},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_provider_from_an_installed_package_runs_end_to_end(
    installed: Path, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    dataset = Dataset(tmp_path / f"audited-{uuid.uuid4().hex[:8]}")
    dataset.path.mkdir()
    dataset.task("hello")
    # No network for the agent, then the verifier's back: two network changes.
    dataset.task(
        "offline",
        toml=f'[environment]\ndocker_image = "{BASE_IMAGE}"\n'
        '[agent]\nnetwork_mode = "no-network"\n',
    )
    audit = tmp_path / "audit.jsonl"
    mark = uuid.uuid4().hex
    with SandboxWatcher(docker_client, f"audit.test={mark}") as watcher:
        done = run_pytest(
            installed,
            tmp_path,
            f"--harbor-dataset={dataset.path}",
            "--harbor-sandbox=audited-docker",
            f"--harbor-set=sandbox_provider_options={{extra_labels: {{audit.test: '{mark}'}}}}",
            f"--harbor-set=sandbox_provider_options.audit_log={audit}",
            "--harbor-set=sandbox_provider_options.builder=classic",
            # Two workers, each with a provider of its own, writing to one log.
            "-n",
            "2",
            "-rA",
        )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = dataset.rows(tmp_path / "results")
    assert sorted((row["task_id"], row["reward"]) for row in rows) == [
        ("hello", 1.0),
        ("offline", 1.0),
    ]
    manifest = json.loads(
        (dataset.results_folder(tmp_path / "results") / "rollouts_manifest.json").read_text()
    )
    assert manifest["sandbox"] == "audited-docker"
    run_id = manifest["run_id"]

    # The engine saw the extra label next to the run's own on both sandboxes.
    seen = [attrs["Config"]["Labels"] for attrs in watcher.seen.values()]  # type: ignore[index]
    assert sorted(labels["pytest-harbor.task"] for labels in seen) == [
        f"{dataset.name}/hello",
        f"{dataset.name}/offline",
    ]
    assert {labels["pytest-harbor.run"] for labels in seen} == {run_id}

    entries = [json.loads(line) for line in audit.read_text().splitlines()]
    assert {entry["run"] for entry in entries} == {run_id}
    by_sandbox: dict[str, list[dict[str, object]]] = {}
    for entry in entries:
        by_sandbox.setdefault(str(entry["sandbox"]), []).append(entry)
    assert sorted(by_sandbox) == sorted(container_id[:12] for container_id in watcher.seen)
    for operations in by_sandbox.values():
        assert operations[0]["op"] == "start"
        assert operations[0]["labels"]["audit.test"] == mark  # type: ignore[index]
        assert operations[-1]["op"] == "stop"
        assert "exec" in {entry["op"] for entry in operations}
        for entry in operations:
            assert "env" not in entry
    offline = next(ops for ops in by_sandbox.values() if "offline" in str(ops[0]["labels"]))
    assert [entry["enabled"] for entry in offline if entry["op"] == "set_network"] == [False, True]
    solve = [
        entry for entry in entries if entry["op"] == "exec" and "solve.sh" in str(entry["command"])
    ]
    assert len(solve) == 2 and all(entry["exit_code"] == 0 for entry in solve)
    assert not docker_client.containers.list(all=True, filters={"label": f"audit.test={mark}"})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            "sandbox_provider_options.colour=blue",
            "*setting sandbox_provider_options: audited-docker takes extra_labels and audit_log,"
            " and network and builder for the docker provider, not: colour",
        ),
        (
            "sandbox_provider_options.extra_labels=[team]",
            "*setting sandbox_provider_options: extra_labels must map label names to values*",
        ),
        (
            "sandbox_provider_options.extra_labels={team: 7}",
            "*setting sandbox_provider_options: extra_labels.team must be a string, not 7*",
        ),
        (
            "sandbox_provider_options.extra_labels={pytest-harbor.run: mine}",
            "*extra_labels.pytest-harbor.run: pytest-harbor.* labels are reserved*",
        ),
        (
            "sandbox_provider_options.audit_log=/no/such/folder/audit.jsonl",
            "*audit_log: the folder /no/such/folder does not exist*",
        ),
        (
            "sandbox_provider_options.builder=fast",
            "*the docker provider's builder is auto, buildkit or classic*",
        ),
    ],
)
def test_options_the_provider_does_not_take_are_usage_errors(
    installed: Path, tmp_path: Path, options: str, message: str
) -> None:
    dataset = Dataset(tmp_path / "refused")
    dataset.path.mkdir()
    dataset.task("hello")
    done = run_pytest(
        installed,
        tmp_path,
        f"--harbor-dataset={dataset.path}",
        "--harbor-sandbox=audited-docker",
        f"--harbor-set={options}",
    )
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert pytest.LineMatcher(done.stderr.splitlines()).fnmatch_lines([message]) is None
    assert not (tmp_path / "results").exists()


def test_an_unknown_provider_names_the_installed_ones(installed: Path, tmp_path: Path) -> None:
    dataset = Dataset(tmp_path / "unknown")
    dataset.path.mkdir()
    dataset.task("hello")
    done = run_pytest(
        installed, tmp_path, f"--harbor-dataset={dataset.path}", "--harbor-sandbox=nope"
    )
    assert done.returncode == pytest.ExitCode.USAGE_ERROR
    assert (
        "--harbor-sandbox: unknown sandbox provider 'nope'; available: audited-docker, docker"
        in done.stderr
    )


def test_a_hook_may_not_take_an_installed_provider_s_name(installed: Path, tmp_path: Path) -> None:
    dataset = Dataset(tmp_path / "twice")
    dataset.path.mkdir()
    dataset.task("hello")
    (tmp_path / "conftest.py").write_text(
        "def pytest_harbor_sandbox_providers():\n"
        "    return {'audited-docker': lambda **kwargs: None}\n"
    )
    done = run_pytest(installed, tmp_path, f"--harbor-dataset={dataset.path}", "--co")
    assert done.returncode == pytest.ExitCode.USAGE_ERROR
    assert "the sandbox provider name 'audited-docker' is registered twice" in done.stderr
