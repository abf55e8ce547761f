"""Every run keeps a folder of its own and no run deletes another's: a run that runs
nothing keeps none and leaves `latest` where it was, one that does is `latest`; a resume
continues the newest run that matches it and says which, and stops when there is none;
runs in the layout before this one move into `runs/` without losing a file; and the exit
status counts what a resume kept."""

from __future__ import annotations

import json
import shutil
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
    """Two tasks; a run of `hello` alone leaves one row. Returns that run's folder and
    what every file in it held then."""
    dataset.task("hello")
    dataset.task("world")
    run_harbor(pytester, dataset, "-k", "hello").assert_outcomes(passed=1)
    folder = dataset.results_folder(pytester.path / "out").resolve()
    return folder, _snapshot(folder)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != ".run.lock"
    }


def _runs(folder: Path) -> list[Path]:
    """The run folders of the taskset whose run `folder` is."""
    return sorted((folder.parent).iterdir())


@pytest.mark.parametrize(
    "args",
    [
        ["-k", "helo"],
        ["--harbor-only-tasks=helo"],
        ["-m", "no_such_marker"],
    ],
    ids=["typo-in-k", "only-tasks-matching-nothing", "m-matching-nothing"],
)
def test_a_filter_that_selects_nothing_keeps_no_folder_and_leaves_latest(
    pytester: pytest.Pytester, dataset: Dataset, args: list[str]
) -> None:
    folder, before = earlier_run(pytester, dataset)
    result = run_harbor(pytester, dataset, *args)
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    assert _snapshot(folder) == before
    assert _runs(folder) == [folder]
    assert dataset.results_folder(pytester.path / "out").resolve() == folder
    assert "images made ahead" not in result.stdout.str()  # none were
    flag = args[0].split("=")[0]
    root = dataset.taskset_folder(pytester.path / "out")
    result.stdout.fnmatch_lines(
        [
            f"*{flag}*no * matches*",
            f"{dataset.name}: this run wrote no result, so it keeps no folder; "
            f"{root / 'latest'} still names {folder.name}",
        ]
    )


def test_a_collection_error_keeps_no_folder(pytester: pytest.Pytester, dataset: Dataset) -> None:
    folder, before = earlier_run(pytester, dataset)
    dataset.task("broken", toml="[agent]\ntimeout_sec = 'soon'\n")
    result = run_harbor(pytester, dataset)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert _snapshot(folder) == before
    assert _runs(folder) == [folder]


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
    assert _runs(folder) == [folder]


def test_ctrl_c_keeps_the_earlier_run_and_the_cut_run_is_resumable(
    dataset: Dataset, docker_client: docker.DockerClient
) -> None:
    dataset.task("hello")
    dataset.task("world", solve_sh="echo 1 > /tmp/answer\nsleep 300\n")
    results = dataset.path.parent / "results"
    first = start_run(dataset, "-k", "hello")
    assert finish(first)
    folder = dataset.results_folder(results).resolve()
    before = _snapshot(folder)
    second = start_run(dataset, "-k", "world")
    wait_for_sandboxes(docker_client, dataset, ["world"], second)
    second.send_signal(signal.SIGINT)
    output = finish(second)
    assert second.returncode != 0, output
    assert _snapshot(folder) == before, output
    # The cut run has a folder of its own, and is the latest: its failure says why.
    (cut,) = (run for run in _runs(folder) if run != folder)
    assert dataset.results_folder(results).resolve() == cut
    (failure,) = dataset.failures(results)
    assert (failure["task_id"], failure["failure_kind"], failure["retry"]) == (
        "world",
        "harbor:interrupted",
        True,
    )
    assert not (dataset.taskset_folder(results) / ".incoming").exists()


def test_every_run_is_kept_in_a_folder_of_its_own(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    folder, before = earlier_run(pytester, dataset)
    for _ in range(4):
        run_harbor(pytester, dataset, "-k", "world").assert_outcomes(passed=1)
    runs = _runs(folder)
    assert len(runs) == 5 and runs[0] == folder
    assert _snapshot(folder) == before
    assert all(run.name.endswith("-oracle") or "-oracle-" in run.name for run in runs)
    assert dataset.results_folder(pytester.path / "out").resolve() == runs[-1]
    for run in runs[1:]:
        (row,) = (json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines())
        assert row["task_id"] == "world"
        # Each row's verifier folder is in its own run's folder.
        assert Path(row["verifier_logs_dir"]).parent.parent == run
        assert (Path(row["verifier_logs_dir"]) / "test-stdout.txt").is_file()
    root = dataset.taskset_folder(pytester.path / "out")
    assert not (root.parent / f"{dataset.name}.previous").exists()
    assert not (root / ".incoming").exists()


def test_a_resume_continues_the_newest_run_that_matches_and_says_which(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task("good")
    dataset.task("bad", test_sh="echo 0 > /logs/verifier/reward.txt\n")
    full = run_harbor(pytester, dataset)
    full.assert_outcomes(passed=1, failed=1)
    matching = dataset.results_folder(pytester.path / "out").resolve()
    # A newer run of other settings: the resume passes it by.
    run_harbor(pytester, dataset, "--harbor-repeats=2", "-k", "good").assert_outcomes(passed=2)
    # Everything was kept: nothing to run, and one of them failed.
    again = run_harbor(pytester, dataset, "--harbor-resume")
    assert again.ret == pytest.ExitCode.TESTS_FAILED
    again.stdout.fnmatch_lines(
        [
            f"{dataset.name}: resuming the run in {matching} (2 rows kept)",
            "resumed: 2 episode(s) kept *; 1 of them failed, which fails *",
        ]
    )
    # All kept, all passed: the run passes (not "no tests ran") and says so.
    passing = run_harbor(pytester, dataset, "--harbor-resume", "--harbor-only-tasks=good")
    assert passing.ret == pytest.ExitCode.OK, passing.stdout.str()
    passing.stdout.fnmatch_lines(["resumed: all 1 episode(s) were kept * and passed*"])
    assert len(_runs(matching)) == 2


def test_a_resume_with_nothing_to_continue_stops_unless_told_to_start(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task("hello")
    stopped = run_harbor(pytester, dataset, "--harbor-resume")
    assert stopped.ret == pytest.ExitCode.USAGE_ERROR
    root = dataset.taskset_folder(pytester.path / "out")
    stopped.stderr.fnmatch_lines(
        [f"ERROR: --harbor-resume: {root} holds no earlier run of {dataset.name} to continue *"]
    )
    assert not (root / "runs").exists()
    started = run_harbor(pytester, dataset, "--harbor-resume-or-start")
    started.assert_outcomes(passed=1)
    started.stdout.fnmatch_lines(
        [f"{dataset.name}: no earlier run in {root} to resume; this one starts afresh"]
    )
    assert len(dataset.rows(pytester.path / "out")) == 1


def test_runs_of_the_earlier_layout_move_into_runs_and_resume(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    """The layout before every run had a folder: the newest run's files in the taskset's
    folder itself, earlier ones in `<taskset>.previous/<start>/`. Made here from real
    runs; the first run after moves both into runs/ and resumes the newest."""
    folder, _ = earlier_run(pytester, dataset)
    run_harbor(pytester, dataset, "-k", "world").assert_outcomes(passed=1)
    newest = dataset.results_folder(pytester.path / "out").resolve()
    root = dataset.taskset_folder(pytester.path / "out")
    # Rewind to the old layout: rows naming the old places, as that layout wrote them.
    previous = root.parent / f"{dataset.name}.previous" / "20261201T100000"
    shutil.move(folder, previous)
    for name in [path.name for path in newest.iterdir()]:
        shutil.move(newest / name, root / name)
    shutil.rmtree(root / "runs")
    (root / "latest").unlink()
    for old, rows in ((folder, previous / "rollouts.jsonl"), (newest, root / "rollouts.jsonl")):
        place = old.parent.parent if old == newest else root
        rows.write_text(rows.read_text().replace(str(old), str(place)))
    old_files = sorted(path.name for path in root.iterdir())

    resumed = run_harbor(pytester, dataset, "-k", "world", "--harbor-resume")
    assert resumed.ret == pytest.ExitCode.OK, resumed.stdout.str()
    resumed.stdout.fnmatch_lines(
        [
            f"{dataset.name}: the run in {previous} is now in {root / 'runs'}/*-oracle",
            f"{dataset.name}: the run in {root} is now in {root / 'runs'}/*-oracle*",
            f"{dataset.name}: resuming the run in {root / 'runs'}/*",
        ]
    )
    assert not previous.parent.exists()
    assert sorted(path.name for path in root.iterdir()) == sorted(
        {".run.lock", ".secrets_key", "durations.json", "latest", "runs"}
    )
    assert len(old_files) > 5
    runs = sorted((root / "runs").iterdir())
    assert len(runs) == 2
    for run in runs:
        for line in (run / "rollouts.jsonl").read_text().splitlines():
            row = json.loads(line)
            assert Path(row["verifier_logs_dir"]).parent.parent == run
            assert (Path(row["verifier_logs_dir"]) / "test-stdout.txt").is_file()


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
    rows = (tmp_path / "results/harbor/validation/quickstart/latest/rollouts.jsonl").read_text()
    assert [json.loads(line)["task_id"] for line in rows.splitlines()] == ["hello-world"]
