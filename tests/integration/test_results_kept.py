"""A run never empties an earlier run's results before it has one of its own to write, a
run that replaces them keeps them aside, and the exit status counts what a resume kept."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import docker
import pytest

from tests.fixtures import (
    REPO_ROOT,
    Dataset,
    finish,
    run_harbor,
    start_run,
    wait_for_sandboxes,
)

pytestmark = pytest.mark.docker


@pytest.fixture
def dataset(harbor_dataset: Dataset) -> Dataset:
    return harbor_dataset


def earlier_run(pytester: pytest.Pytester, dataset: Dataset) -> tuple[Path, dict[str, bytes]]:
    """Two tasks; a run of `hello` alone leaves one row. Returns the results folder and
    what every file in it held then."""
    dataset.task("hello")
    dataset.task("world")
    run_harbor(pytester, dataset, "-k", "hello").assert_outcomes(passed=1)
    folder = dataset.results_folder(pytester.path / "out")
    return folder, _snapshot(folder)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != ".run.lock"
    }


@pytest.mark.parametrize(
    "args",
    [
        ["-k", "helo"],
        ["--harbor-only-tasks=helo"],
        ["-m", "no_such_marker"],
    ],
    ids=["typo-in-k", "only-tasks-matching-nothing", "m-matching-nothing"],
)
def test_a_filter_that_selects_nothing_leaves_the_results_as_they_were(
    pytester: pytest.Pytester, dataset: Dataset, args: list[str]
) -> None:
    folder, before = earlier_run(pytester, dataset)
    result = run_harbor(pytester, dataset, *args)
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    assert _snapshot(folder) == before
    assert "images made ahead" not in result.stdout.str()  # none were
    flag = args[0].split("=")[0]
    result.stdout.fnmatch_lines(
        [
            f"*{flag}*no * matches*",
            f"{dataset.name}: nothing of this run was written; {folder} still holds the run of "
            "* (1 row)",
        ]
    )


def test_a_collection_error_leaves_the_results_as_they_were(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    folder, before = earlier_run(pytester, dataset)
    dataset.task("broken", toml="[agent]\ntimeout_sec = 'soon'\n")
    result = run_harbor(pytester, dataset)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert _snapshot(folder) == before


def test_an_engine_that_does_not_answer_stops_the_run_at_once_and_touches_nothing(
    pytester: pytest.Pytester, dataset: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, before = earlier_run(pytester, dataset)
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/no-such-docker.sock")
    # A process of its own: this one keeps its connection to the engine that answers.
    result = pytester.runpytest_subprocess(
        f"--harbor-dataset={dataset.path}", "--harbor-results-dir=out", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: --harbor-sandbox docker: the Docker engine at "
            "unix:///run/no-such-docker.sock (DOCKER_HOST) does not answer: *. Start it*"
        ]
    )
    # One line, not one error per task.
    assert "sandbox_start_failed" not in result.stdout.str() + result.stderr.str()
    assert _snapshot(folder) == before


def test_ctrl_c_before_the_first_episode_ends_leaves_the_results_as_they_were(
    dataset: Dataset, docker_client: docker.DockerClient
) -> None:
    dataset.task("hello")
    dataset.task("world", solve_sh="echo 1 > /tmp/answer\nsleep 300\n")
    first = start_run(dataset, "-k", "hello")
    assert finish(first)
    folder = dataset.results_folder(dataset.path.parent / "results")
    before = _snapshot(folder)
    assert len(dataset.rows(dataset.path.parent / "results")) == 1
    second = start_run(dataset, "-k", "world")
    wait_for_sandboxes(docker_client, dataset, ["world"], second)
    second.send_signal(signal.SIGINT)
    output = finish(second)
    assert second.returncode != 0, output
    assert _snapshot(folder) == before, output
    assert "still holds the run of" in output
    assert not (folder / ".incoming").exists()


def test_a_run_that_replaces_the_results_keeps_the_earlier_run_aside(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    folder, before = earlier_run(pytester, dataset)
    result = run_harbor(pytester, dataset, "-k", "world")
    result.assert_outcomes(passed=1)
    previous = folder.parent / f"{dataset.name}.previous"
    (kept,) = previous.iterdir()
    result.stdout.fnmatch_lines(
        [f"{dataset.name}: replaced 1 row of the run of * (kept in {kept})"]
    )
    # Everything of that run moved, but what belongs to the folder.
    stays = (".secrets_key", "durations.json")
    assert _snapshot(kept) == {name: data for name, data in before.items() if name not in stays}
    (row,) = dataset.rows(pytester.path / "out")
    assert row["task_id"] == "world"
    # The new row's verifier folder is where the row says, the old one's moved with it.
    assert (Path(row["verifier_logs_dir"]) / "test-stdout.txt").is_file()
    assert not (folder / "verifier" / "hello__r0").exists()
    assert (kept / "verifier" / "hello__r0" / "test-stdout.txt").is_file()
    assert not (folder / ".incoming").exists()
    # At most three earlier runs are kept.
    for _ in range(3):
        run_harbor(pytester, dataset, "-k", "world").assert_outcomes(passed=1)
    assert len(list(previous.iterdir())) == 3


def test_a_resume_counts_the_episodes_it_kept(pytester: pytest.Pytester, dataset: Dataset) -> None:
    dataset.task("good")
    dataset.task("bad", test_sh="echo 0 > /logs/verifier/reward.txt\n")
    full = run_harbor(pytester, dataset)
    full.assert_outcomes(passed=1, failed=1)
    # Everything was kept: nothing to run, and one of them failed.
    again = run_harbor(pytester, dataset, "--harbor-resume")
    assert again.ret == pytest.ExitCode.TESTS_FAILED
    again.stdout.fnmatch_lines(["resumed: 2 episode(s) kept *; 1 of them failed, which fails *"])
    # All kept, all passed: the run passes (not "no tests ran") and says so.
    passing = run_harbor(pytester, dataset, "--harbor-resume", "--harbor-only-tasks=good")
    assert passing.ret == pytest.ExitCode.OK, passing.stdout.str()
    passing.stdout.fnmatch_lines(["resumed: all 1 episode(s) were kept * and passed*"])


def test_a_run_from_elsewhere_loads_none_of_the_checkouts_test_fixtures(tmp_path: Path) -> None:
    """The checkout's own test fixtures (and what they import) load only with its tests:
    a run of an example dataset from another folder, and one from the checkout, load none
    of them."""
    script = (
        "import sys, pytest\n"
        "code = pytest.main(sys.argv[1:])\n"
        "loaded = [name for name in ('tests.fixtures', 'tests.conftest', 'httpcore') "
        "if name in sys.modules]\n"
        "print('exit', int(code), 'loaded', loaded)\n"
    )
    dataset = REPO_ROOT / "example_datasets" / "quickstart"
    for cwd in (tmp_path, REPO_ROOT):
        args = [
            f"--harbor-dataset={dataset}",
            "-k",
            "hello",
            "-p",
            "no:cacheprovider",
            f"--harbor-results-dir={tmp_path / 'results'}",
        ]
        done = subprocess.run(
            [sys.executable, "-c", script, *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert "exit 0 loaded []" in done.stdout, done.stdout + done.stderr
    rows = (tmp_path / "results/harbor/validation/quickstart/rollouts.jsonl").read_text()
    assert [json.loads(line)["task_id"] for line in rows.splitlines()] == ["hello-world"]
