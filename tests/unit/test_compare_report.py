"""`python -m pytest_harbor.report --compare OLD NEW`: what changed between two runs, as a
terminal table and one HTML page. The first tests compare real runs (pytester, with the
scripted fake provider: no engine needed); the rest write run folders by hand, in the
shapes docs/results.md gives, for what a real run cannot easily show (costs, hostile
names, broken files)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_harbor.report import ReportError
from pytest_harbor.report.__main__ import main
from pytest_harbor.report.compare import Change, compare_runs, latest_two
from pytest_harbor.report.compare_table import comparison_table
from tests.fixtures import REPO_ROOT
from tests.real_runs import SUMMARY, RealRuns, make_real_runs

#: What the table and the page show for a figure not known.
DASH = "\u2013"


@pytest.fixture
def real_runs(pytester: pytest.Pytester) -> RealRuns:
    return make_real_runs(pytester)


def test_real_runs_flip_both_ways_and_a_changed_task_is_marked(
    real_runs: RealRuns, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    comparison = compare_runs(real_runs.old, real_runs.new)
    changes = {task.task_id: task.change for task in comparison.tasks}
    assert changes == {"alpha": Change.REGRESSED, "beta": Change.FIXED}
    assert [task.task_id for task in comparison.tasks if task.task_changed] == ["beta"]
    assert comparison.only_old == ("delta",) and comparison.only_new == ("gamma",)
    assert any("different dataset digests" in text for text in comparison.differences)
    assert any("1 task(s) changed" in text and "beta" in text for text in comparison.differences)

    assert main(["--compare", str(real_runs.old), str(real_runs.new)]) == 0
    out = capsys.readouterr().out
    assert "\x1b[" not in out  # not a terminal: no colour
    alpha = next(line for line in out.splitlines() if line.startswith("alpha "))
    assert alpha.split()[:4] == ["alpha", "1.000", "0.000", "passed→failed"]
    assert alpha.split()[-1] == DASH  # no model, no cost
    assert "failed→passed (task changed)" in out
    assert "only in OLD (1): delta" in out and "only in NEW (1): gamma" in out
    assert "1 passed→failed, 1 failed→passed, 1 new failure(s)" in out
    page = (real_runs.new / "compare.html").read_text()
    assert f"comparison: {real_runs.new / 'compare.html'}" in out
    assert '<tr class="flip change-regressed"><td>alpha</td>' in page
    assert '<tr class="flip change-fixed"><td>beta</td>' in page
    assert '<span class="task-changed">task changed</span>' in page
    assert '<ul class="only-old"><li>delta <span class="meta">passed 1.000</span></li></ul>' in page
    assert '<ul class="only-new"><li>gamma <span class="meta">passed 1.000</span></li></ul>' in page
    assert "the verifier scored 0" in page  # alpha's new failure, by its kind


def test_the_latest_two_runs_of_a_taskset_folder(
    real_runs: RealRuns, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`runs/<run-name>/` in the new layout: the two latest by `started_at`, whatever
    their names; the NEW run with no results shows each new failure with its kind."""
    taskset = tmp_path / "tasks"
    # Names sort otherwise than the starts: the order must come from the summaries.
    for name, source in (("c-old", real_runs.old), ("a-new", real_runs.new)):
        shutil.copytree(source, taskset / "runs" / name)
    shutil.copytree(real_runs.broken, taskset / "runs" / "b-broken")
    (taskset / "latest").symlink_to(taskset / "runs" / "b-broken")
    assert latest_two(taskset) == (taskset / "runs" / "a-new", taskset / "runs" / "b-broken")

    assert main(["--compare", str(taskset), "-o", str(tmp_path / "out.html")]) == 0
    out = capsys.readouterr().out
    assert f"comparing the latest two runs of {taskset}: a-new (OLD), b-broken (NEW)" in out
    failure = json.loads((real_runs.broken / SUMMARY).read_text())["episodes"][0]
    kind = failure["failure_kind"]
    assert kind and "new failures:" in out
    for task in ("alpha", "beta", "gamma"):
        assert f"  {task}__r0: {kind}" in out
    page = (tmp_path / "out.html").read_text()
    assert page.count('<tr class="new-failure">') == 3
    assert f'<td class="kind">{kind}</td>' in page and "the engine is gone" in page


# ---------------------------------------------------------------------------- by hand


@dataclass(frozen=True)
class Ep:
    """One episode as a run folder records it."""

    task: str
    status: str
    reward: float | None = None
    repeat: int = 0
    kind: str | None = None
    reason: str | None = None
    digest: str = "sha256:aaaa"
    seconds: float | None = 10.0
    cost: float | None = None


def write_run(
    folder: Path,
    episodes: list[Ep],
    *,
    taskset: str = "demo",
    started_at: str = "2026-12-07T22:00:00+00:00",
    dataset_digest: str = "sha256:dddd",
    pass_at_k: dict[str, float] | None = None,
    pass_at_k_per_task: dict[str, dict[str, float]] | None = None,
) -> Path:
    """A run folder: its summary, rows and failures, in the shapes docs/results.md gives."""
    folder.mkdir(parents=True)
    rows, failures, entries = [], [], []
    costs: dict[str, float] = {}
    for ep in episodes:
        entry: dict[str, Any] = {
            "task_id": ep.task,
            "repeat": ep.repeat,
            "status": ep.status,
            "digest": ep.digest,
            "reward": ep.reward,
            "failure_kind": ep.kind,
            "failure_reason": ep.reason,
        }
        entries.append(entry)
        usage = None if ep.cost is None else {"requests": 1, "cost_usd": ep.cost}
        if ep.cost is not None:
            costs[ep.task] = costs.get(ep.task, 0.0) + ep.cost
        if ep.status == "no_result":
            entry["stage"] = "seed"
            failures.append({**entry, "stage": "seed", "retry": True})
        else:
            timings = {} if ep.seconds is None else {"total_s": ep.seconds}
            rows.append({**entry, "usage": usage, "timings": timings, "turns": []})
    counts = {
        status: sum(ep.status == status for ep in episodes)
        for status in ("passed", "failed", "masked", "no_result")
    }
    scored = [ep.reward for ep in episodes if ep.status in ("passed", "failed") and ep.reward]
    scored += [0.0 for ep in episodes if ep.status == "failed" and not ep.reward]
    summary = {
        "schema_version": 1,
        "run_id": f"run-{folder.name}",
        "started_at": started_at,
        "taskset": taskset,
        "agent": "shell-agent",
        "dataset_digest": dataset_digest,
        "files": {"rollouts": "rollouts.jsonl", "failures": "rollouts_failures.jsonl"},
        "counts": {
            "episodes": len(episodes),
            **counts,
            "mean_reward": sum(scored) / len(scored) if scored else None,
        },
        "usage": {"cost_usd": sum(costs.values())} if costs else None,
        "usage_per_task": {task: {"requests": 1, "cost_usd": c} for task, c in costs.items()},
        "pass_at_k": pass_at_k or {},
        "pass_at_k_per_task": pass_at_k_per_task or {},
        "episodes": entries,
    }
    (folder / SUMMARY).write_text(json.dumps(summary))
    (folder / "rollouts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (folder / "rollouts_failures.jsonl").write_text(
        "".join(json.dumps(row) + "\n" for row in failures)
    )
    return folder


def test_rewards_times_costs_and_pass_at_k_before_and_after(tmp_path: Path) -> None:
    old = write_run(
        tmp_path / "old",
        [
            Ep("fast", "passed", 1.0, seconds=30.0, cost=0.25),
            Ep("fast", "failed", 0.0, repeat=1, seconds=50.0, cost=0.25),
            Ep("same", "passed", 1.0),
        ],
        pass_at_k={"1": 0.75, "2": 1.0},
        pass_at_k_per_task={"1": {"fast": 0.5, "same": 1.0}, "2": {"fast": 1.0, "same": 1.0}},
    )
    new = write_run(
        tmp_path / "new",
        [
            Ep("fast", "passed", 1.0, seconds=10.0, cost=0.1),
            Ep("fast", "passed", 1.0, repeat=1, seconds=10.0, cost=0.15),
            Ep("same", "passed", 1.0),
        ],
        pass_at_k={"1": 1.0, "2": 1.0},
        pass_at_k_per_task={"1": {"fast": 1.0, "same": 1.0}, "2": {"fast": 1.0, "same": 1.0}},
    )
    comparison = compare_runs(old, new)
    fast = next(task for task in comparison.tasks if task.task_id == "fast")
    assert fast.change is Change.FIXED
    assert (fast.reward_before, fast.reward_after) == (0.5, 1.0)
    assert fast.time_delta == pytest.approx(-30.0)
    assert fast.cost_delta == pytest.approx(-0.25)
    assert fast.pass_at_k_before == {1: 0.5, 2: 1.0} and fast.pass_at_k_after == {1: 1.0, 2: 1.0}
    second = fast.episodes[1]
    assert second.change is Change.FIXED and second.time_delta == pytest.approx(-40.0)
    assert second.cost_delta == pytest.approx(-0.1)

    table = comparison_table(comparison)
    lines = table.splitlines()
    assert ["pass@1", "0.750", "1.000"] in [line.split() for line in lines]
    assert ["cost", "(USD)", "0.5000", "0.2500"] in [line.split() for line in lines]
    row = next(line for line in lines if line.startswith("fast "))
    assert row.split() == [
        "fast", "0.500", "(1/2", "passed)", "1.000", "(2/2", "passed)",
        "failed→passed", "-30.0", "s", "-0.2500",
    ]  # fmt: skip
    # With repeats, the repeats of a changed task follow it, each with its own change.
    split = [line.split() for line in lines]
    assert ["r0", "1.000", "1.000", "unchanged", "-20.0", "s", "-0.1500"] in split
    assert ["r1", "0.000", "1.000", "failed→passed", "-40.0", "s", "-0.1000"] in split
    assert "1 unchanged task(s) not shown (--all shows them)" in lines
    assert not any(line.startswith("same ") for line in lines)
    everything = comparison_table(comparison, show_all=True).splitlines()
    assert any(line.split()[:4] == ["same", "1.000", "1.000", "unchanged"] for line in everything)
    assert not any("not shown" in line for line in everything)

    page = tmp_path / "page.html"
    assert main(["--compare", str(old), str(new), "-o", str(page)]) == 0
    html = page.read_text()
    assert "<td>pass@1 0.500, pass@2 1.000</td><td>pass@1 1.000, pass@2 1.000</td>" in html
    assert "<tr><th>pass@1</th><td>0.750</td><td>1.000</td></tr>" in html
    assert ">-30.0 s</td>" in html and ">-0.2500</td>" in html


def test_colour_only_when_asked(tmp_path: Path) -> None:
    same = Ep("c-passed→failed", "passed", 1.0)  # a name is not a change
    old = write_run(tmp_path / "old", [Ep("a", "passed", 1.0), Ep("b", "failed", 0.0), same])
    new = write_run(tmp_path / "new", [Ep("a", "failed", 0.0), Ep("b", "passed", 1.0), same])
    comparison = compare_runs(old, new)
    assert "\x1b" not in comparison_table(comparison)
    coloured = comparison_table(comparison, colour=True, show_all=True)
    assert "\x1b[31ma " in coloured and "\x1b[32mb " in coloured
    assert "\nc-passed→failed " in coloured


def test_the_header_names_ten_changed_tasks_at_most(tmp_path: Path) -> None:
    old = write_run(tmp_path / "old", [Ep(f"t{n:02d}", "passed", 1.0) for n in range(12)])
    new = write_run(
        tmp_path / "new", [Ep(f"t{n:02d}", "passed", 1.0, digest="sha256:b") for n in range(12)]
    )
    (said,) = compare_runs(old, new).differences
    assert said == (
        "12 task(s) changed between the runs (another digest): "
        "t00, t01, t02, t03, t04, t05, t06, t07, t08, t09 and 2 more"
    )


def test_new_failures_and_flips_are_told_apart(tmp_path: Path) -> None:
    """A flip to failed is a new failure too; a task failing in both runs is not; an
    episode with no result where OLD had a result, or none at all, is."""
    old = write_run(
        tmp_path / "old",
        [
            Ep("down", "passed", 1.0),
            Ep("still", "failed", 0.0),
            Ep("lost", "failed", 0.0),
            Ep("masked", "masked", 1.0),
            Ep("up", "no_result", kind="harbor:timeout"),
        ],
    )
    new = write_run(
        tmp_path / "new",
        [
            Ep("down", "failed", 0.0, kind="agent_error", reason="the agent crashed"),
            Ep("still", "failed", 0.0),
            Ep("lost", "no_result", kind="harbor:sandbox_start_failed", reason="no engine"),
            Ep("masked", "failed", 0.5),
            Ep("up", "passed", 1.0),
            Ep("up", "no_result", repeat=1, kind="harbor:timeout"),
        ],
    )
    comparison = compare_runs(old, new)
    changes = {episode.name: episode.change for episode in comparison.episodes()}
    assert changes == {
        "down__r0": Change.REGRESSED,
        "still__r0": Change.SAME,
        "lost__r0": Change.NEW_FAILURE,
        "masked__r0": Change.NEW_FAILURE,
        "up__r0": Change.FIXED,
        "up__r1": Change.NEW_FAILURE,
    }
    assert [e.name for e in comparison.flips()] == ["down__r0", "up__r0"]
    news = {e.name for e in comparison.new_failures()}
    assert news == {"down__r0", "lost__r0", "masked__r0", "up__r1"}
    # The most telling change first: regressions, new failures, fixes, the rest.
    assert [task.task_id for task in comparison.tasks] == ["down", "lost", "masked", "up", "still"]
    table = comparison_table(comparison)
    assert "  down__r0: agent_error" in table
    assert "  lost__r0: harbor:sandbox_start_failed" in table
    assert "  masked__r0: the verifier scored below a pass" in table
    assert "1 passed→failed, 1 failed→passed, 4 new failure(s)" in table


def test_different_datasets_are_said_plainly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = write_run(tmp_path / "old", [Ep("a", "passed", 1.0)], taskset="swe-lite")
    new = write_run(
        tmp_path / "new",
        [Ep("a", "passed", 1.0, digest="sha256:bbbb")],
        taskset="terminal-bench",
        dataset_digest="sha256:eeee",
    )
    assert main(["--compare", str(old), str(new)]) == 0
    out = capsys.readouterr().out
    assert "! different datasets: OLD is 'swe-lite', NEW is 'terminal-bench'" in out
    assert "! different dataset digests: OLD sha256:dddd, NEW sha256:eeee" in out
    assert "unchanged (task changed)" not in out  # an unchanged task is counted, not listed
    assert main(["--compare", str(old), str(new), "--all"]) == 0
    assert "unchanged (task changed)" in capsys.readouterr().out
    html = (new / "compare.html").read_text()
    assert (
        "different datasets: OLD is &#x27;swe-lite&#x27;, NEW is &#x27;terminal-bench&#x27;" in html
    )
    assert (
        "<tr><th>taskset</th><td>swe-lite</td><td>terminal-bench</td><td>differs</td></tr>" in html
    )
    assert '<span class="task-changed">task changed</span>' in html


def test_latest_two_orders_by_start_and_needs_two(tmp_path: Path) -> None:
    runs = tmp_path / "demo" / "runs"
    write_run(
        runs / "20261207T220000-a", [Ep("a", "passed", 1.0)], started_at="2026-12-07T22:00:00+00:00"
    )
    with pytest.raises(ReportError, match="holds 1 run\\(s\\) under runs/"):
        latest_two(tmp_path / "demo")
    write_run(runs / "zzz-first", [Ep("a", "passed", 1.0)], started_at="2026-12-07T21:00:00+00:00")
    write_run(runs / "aaa-last", [Ep("a", "failed", 0.0)], started_at="2026-12-07T23:00:00+01:00")
    write_run(runs / "no-start", [Ep("a", "failed", 0.0)], started_at="not a time")
    # 23:00+01:00 is 22:00 UTC, the same start as -a: then the name decides.
    assert latest_two(tmp_path / "demo") == (runs / "20261207T220000-a", runs / "aaa-last")


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda root: root / "missing", "missing: no such folder"),
        (lambda root: _file(root / "a-file"), "a-file is a file, not a run folder"),
        (lambda root: _folder(root / "empty"), "empty holds no rollouts_run_summary.json"),
        (
            lambda root: _summary(root / "bad", "{not json"),
            "bad/rollouts_run_summary.json: cannot read",
        ),
        (
            lambda root: _summary(root / "list", "[1, 2]"),
            "list/rollouts_run_summary.json: cannot read",
        ),
    ],
    ids=["missing", "file", "no-summary", "not-json", "not-an-object"],
)
def test_bad_inputs_exit_2_naming_the_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Any, said: str
) -> None:
    good = write_run(tmp_path / "good", [Ep("a", "passed", 1.0)])
    bad = make(tmp_path)
    for argv in ([str(bad), str(good)], [str(good), str(bad)]):
        assert main(["--compare", *argv]) == 2
        err = capsys.readouterr().err
        assert said in err and str(tmp_path) in err
    assert not (good / "compare.html").exists()
    # One argument: a taskset folder whose runs/ holds a malformed summary.
    _summary(tmp_path / "ts" / "runs" / "one", "{")
    _summary(tmp_path / "ts" / "runs" / "two", "{}")
    assert main(["--compare", str(tmp_path / "ts")]) == 2
    assert "runs/one/rollouts_run_summary.json: cannot read" in capsys.readouterr().err


def test_more_than_two_runs_or_a_results_dir_too_is_a_usage_error(tmp_path: Path) -> None:
    for argv in (["--compare", "a", "b", "c"], [str(tmp_path), "--compare", "a", "b"], []):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2


def test_a_page_that_cannot_be_written_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = write_run(tmp_path / "old", [Ep("a", "passed", 1.0)])
    new = write_run(tmp_path / "new", [Ep("a", "passed", 1.0)])
    (tmp_path / "blocker").write_text("")
    assert main(["--compare", str(old), str(new), "-o", str(tmp_path / "blocker" / "x.html")]) == 1
    assert "cannot write the comparison" in capsys.readouterr().err


def _file(path: Path) -> Path:
    path.write_text("not a folder")
    return path


def _folder(path: Path) -> Path:
    path.mkdir()
    return path


def _summary(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True)
    (folder / SUMMARY).write_text(text)
    return folder


HOSTILE = "<script>alert(1)</script>\u202eevil\x1b[2J"


def test_a_hostile_task_name_and_reason_show_as_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = write_run(
        tmp_path / "old", [Ep(HOSTILE, "passed", 1.0), Ep("gone" + HOSTILE, "passed", 1.0)]
    )
    new = write_run(
        tmp_path / "new",
        [
            Ep(
                HOSTILE,
                "failed",
                0.0,
                kind="<b>kind</b>\u202e",
                reason="<img src=x onerror=alert(1)>\u202e",
            )
        ],
        taskset="<i>set</i>",
    )
    assert main(["--compare", str(old), str(new)]) == 0
    out = capsys.readouterr().out
    assert "\u202e" not in out and "\x1b" not in out
    assert "\\u202eevil\\x1b[2J" in out
    html = (new / "compare.html").read_text()
    assert "<script>alert" not in html and "<img" not in html and "<b>" not in html
    assert "<i>" not in html and "\u202e" not in html and "\x1b" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;\\u202eevil\\x1b[2J" in html
    assert "&lt;img src=x onerror=alert(1)&gt;\\u202e" in html
    assert html.count("<script>") == 1  # the page's own sorting script


def test_odd_types_in_the_files_do_not_crash_it(tmp_path: Path) -> None:
    """A hostile task can write the files: values of the wrong type are read as text or
    left out, never an exception."""
    old = write_run(tmp_path / "old", [Ep("a", "passed", 1.0)])
    summary = json.loads((old / SUMMARY).read_text())
    summary.update(
        taskset=["not", "a", "name"],
        counts={"episodes": "many", "mean_reward": "high", "passed": 2**70},
        pass_at_k={"1": "all", "x": 1.0, "2": True},
        pass_at_k_per_task=[1],
        usage="free",
        usage_per_task={"a": 5},
        started_at={"when": "now"},
    )
    summary["episodes"].append({"task_id": ["list"], "repeat": "0", "status": 7, "reward": "1"})
    summary["episodes"].append("not an entry")
    (old / SUMMARY).write_text(json.dumps(summary))
    (old / "rollouts.jsonl").write_text(
        json.dumps({"task_id": "a", "repeat": 0, "timings": [1], "usage": "x", "turns": [3]})
        + "\nnot json\n"
    )
    new = write_run(tmp_path / "new", [Ep("a", "failed", 0.0, kind=None)])
    new_summary = json.loads((new / SUMMARY).read_text())
    new_summary["episodes"][0].update(failure_kind={"k": 1}, failure_reason=[1, 2], digest=5)
    new_summary["episodes"] = new_summary["episodes"] * 2  # the same episode twice
    (new / "rollouts.jsonl").write_text(  # a time no float holds
        json.dumps({"task_id": "a", "repeat": 0, "timings": {"total_s": 10**400}}) + "\n"
    )
    (new / SUMMARY).write_text(json.dumps(new_summary))
    assert main(["--compare", str(old), str(new), "--all"]) == 0
    comparison = compare_runs(old, new)
    assert [task.task_id for task in comparison.tasks] == ["a"]
    assert comparison.tasks[0].change is Change.REGRESSED
    assert "{'k': 1}" in comparison_table(comparison)
    # Episodes that are not a list: a run with none, every task only in the other.
    summary["episodes"] = 5
    (old / SUMMARY).write_text(json.dumps(summary))
    assert compare_runs(old, new).only_new == ("a",)


def test_a_terminal_that_cannot_show_the_arrows_gets_escapes(tmp_path: Path) -> None:
    old = write_run(tmp_path / "old", [Ep("a", "passed", 1.0)])
    new = write_run(tmp_path / "new", [Ep("a", "failed", 0.0)])
    done = subprocess.run(
        [sys.executable, "-m", "pytest_harbor.report", "--compare", str(old), str(new)],
        capture_output=True,
        text=True,
        encoding="ascii",
        check=False,
        env={**os.environ, "PYTHONIOENCODING": "ascii", "PYTHONPATH": str(REPO_ROOT)},
    )
    assert done.returncode == 0, done.stderr
    assert "passed\\u2192failed" in done.stdout
