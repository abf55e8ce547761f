"""The HTML report made from hand-written results folders: loader, charts, page, command."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from pytest_harbor.report import find_summaries, load_taskset, render_report, write_report
from pytest_harbor.report.__main__ import main
from pytest_harbor.report.charts import histogram, timeline, timeline_svg
from pytest_harbor.report.transcripts import Budget, transcript_html

ATTACK = '</script><script>alert(1)</script><img src=x onerror="alert(2)">'


def trajectory(*messages: str) -> dict[str, Any]:
    return {
        "schema_version": "ATIF-v1.7",
        "agent": {"name": "scripted", "version": "1"},
        "steps": [
            {"step_id": number, "source": "user" if number == 1 else "agent", "message": text}
            for number, text in enumerate(messages, start=1)
        ],
    }


def row(
    task: str,
    repeat: int,
    *,
    folder: Path,
    reward: float = 1.0,
    worker: str | None = "gw0",
    started_at: str = "2026-12-01T10:00:00+00:00",
    timings: dict[str, float] | None = None,
    steps: tuple[str, ...] = ("episode",),
    **fields: Any,
) -> dict[str, Any]:
    """A rollouts.jsonl row; its verifier folders (absolute, as the writer names them) get a
    test-stdout.txt, a reward.txt and a trajectory.json."""
    turns = []
    for step in steps:
        logs = folder / "verifier" / f"{task}__r{repeat}"
        if step != "episode":
            logs = logs / step
        logs.mkdir(parents=True, exist_ok=True)
        (logs / "test-stdout.txt").write_text(f"checked {task} {step}\n")
        (logs / "reward.txt").write_text(f"{reward}\n")
        (logs / "trajectory.json").write_text(json.dumps(trajectory(f"do {step}", "done")))
        turns.append(
            {
                "step": step,
                "reward": reward,
                "verifier_logs_dir": str(logs),
                "timings": {"setup_s": 0.5, "agent_s": 2.0, "verify_s": 1.0},
            }
        )
    data: dict[str, Any] = {
        "task_id": task,
        "taskset": folder.name,
        "repeat": repeat,
        "agent": "oracle",
        "reward": reward,
        "started_at": started_at,
        "timings": timings or {"build_s": 4.0, "seed_s": 1.0, "agent_s": 2.0, "verify_s": 1.0},
        "turns": turns,
        "verifier_logs_dir": turns[0]["verifier_logs_dir"] if len(steps) == 1 else None,
        **fields,
    }
    if worker is not None:
        data["worker"] = worker
    return data


def write_results(
    folder: Path,
    rows: list[dict[str, Any]],
    failures: list[dict[str, Any]] = (),  # type: ignore[assignment]
    *,
    pass_at_k: dict[str, float] | None = None,
    usage: dict[str, Any] | None = None,
) -> Path:
    """A taskset's results folder as a run leaves it; the summary's paths are relative."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "rollouts_failures.jsonl").write_text("".join(json.dumps(f) + "\n" for f in failures))
    episodes = []
    for r in rows:
        logs = []
        for turn in r["turns"]:
            base = Path(turn["verifier_logs_dir"]).relative_to(folder)
            logs.append(
                {
                    "step": turn["step"],
                    "verifier_dir": str(base),
                    "test_stdout": str(base / "test-stdout.txt"),
                    "reward_file": str(base / "reward.txt"),
                    "trajectory": str(base / "trajectory.json"),
                }
            )
        status = r.get("status") or ("passed" if r["reward"] >= 1 else "failed")
        episodes.append(
            {
                "task_id": r["task_id"],
                "repeat": r["repeat"],
                "status": status,
                "reward": r["reward"],
                "failure_kind": r.get("failure_kind"),
                "failure_reason": r.get("failure_reason"),
                "logs": logs,
            }
        )
    for f in failures:
        episodes.append(
            {
                "task_id": f["task_id"],
                "repeat": f["repeat"],
                "status": "no_result",
                "reward": None,
                "failure_kind": f["failure_kind"],
                "failure_reason": f["failure_reason"],
                "stage": f["stage"],
                "retry": True,
            }
        )
    scored = [r["reward"] for r in rows]
    summary = {
        "schema_version": 1,
        "run_id": "run-1",
        "taskset": folder.name,
        "agent": "oracle",
        "model": None,
        "repeats": 1 + max((e["repeat"] for e in episodes), default=0),
        "files": {"rollouts": "rollouts.jsonl", "failures": "rollouts_failures.jsonl"},
        "counts": {
            "episodes": len(episodes),
            "passed": sum(e["status"] == "passed" for e in episodes),
            "failed": sum(e["status"] == "failed" for e in episodes),
            "masked": 0,
            "no_result": len(failures),
            "mean_reward": sum(scored) / len(scored) if scored else None,
        },
        "usage": usage,
        "pass_at_k": pass_at_k or {},
        "episodes": episodes,
    }
    path = folder / "rollouts_run_summary.json"
    path.write_text(json.dumps(summary))
    return path


def failure(task: str, repeat: int, kind: str, reason: str, stage: str = "seed") -> dict[str, Any]:
    return {
        "task_id": task,
        "repeat": repeat,
        "stage": stage,
        "failure_kind": kind,
        "failure_reason": reason,
    }


def hrefs(html: str) -> list[str]:
    return [h for h in re.findall(r'href="([^"#][^"]*)"', html)]


# ---------------------------------------------------------------------------- charts


def test_histogram_bins_rewards_over_zero_to_one() -> None:
    bins = histogram([0.0, 0.3, 0.35, 0.5, 0.99, 1.0, 1.0])
    assert len(bins) == 10
    assert [b.count for b in bins] == [1, 0, 0, 2, 0, 1, 0, 0, 0, 3]
    assert bins[3].low == pytest.approx(0.3) and bins[-1].high == pytest.approx(1.0)


def test_histogram_widens_for_rewards_outside_zero_to_one() -> None:
    bins = histogram([-1.0, 3.0], bins=4)
    assert (bins[0].low, bins[-1].high) == (-1.0, 3.0)
    assert [b.count for b in bins] == [1, 0, 0, 1]


def test_timeline_has_a_lane_per_worker_and_phases_end_to_end(tmp_path: Path) -> None:
    folder = tmp_path / "ts"
    rows = [
        row("a", 0, folder=folder, worker="gw1", started_at="2026-12-01T10:00:10+00:00"),
        row("b", 0, folder=folder, worker="gw0", started_at="2026-12-01T10:00:00+00:00"),
        row("c", 0, folder=folder, worker="gw10", started_at="2026-12-01T10:00:00+00:00"),
        row("d", 0, folder=folder, worker="gw2", started_at="2026-12-01T10:00:05+00:00"),
        row("e", 0, folder=folder, worker="gw0", started_at="2026-12-01T10:00:09+00:00"),
    ]
    taskset = load_taskset(write_results(folder, rows))
    chart = timeline(taskset.episodes)
    assert [lane.worker for lane in chart.lanes] == ["gw0", "gw1", "gw2", "gw10"]
    gw0 = chart.lanes[0]
    assert [bar.episode for bar in gw0.bars] == ["b__r0", "e__r0"]
    # b started at the origin + its 4 s build wait; the phases follow one another.
    first = gw0.bars[0].segments
    assert [(s.phase, s.start, s.end) for s in first] == [
        ("build", 0.0, 4.0),
        ("start", 4.0, 5.0),
        ("agent", 5.0, 7.5),  # the turn's session setup and agent time
        ("verify", 7.5, 8.5),
    ]
    assert chart.span_s == pytest.approx(18.5)  # a: starts at 14, ends 4.5 s later
    svg = timeline_svg(chart)
    assert svg.count('class="lane"') == 4
    assert svg.count('class="phase phase-agent"') == 5


def test_timeline_lays_out_each_turn_of_a_multi_step_episode(tmp_path: Path) -> None:
    folder = tmp_path / "ts"
    rows = [
        row(
            "multi",
            0,
            folder=folder,
            steps=("01-a", "02-b"),
            timings={"build_s": 0.0, "seed_s": 1.0, "agent_install_s": 2.0},
        )
    ]
    (bar,) = timeline(load_taskset(write_results(folder, rows)).episodes).lanes[0].bars
    assert [(s.phase, s.step, s.start, s.end) for s in bar.segments] == [
        ("start", None, 0.0, 3.0),  # the seed and the agent's install
        ("agent", "01-a", 3.0, 5.5),
        ("verify", "01-a", 5.5, 6.5),
        ("agent", "02-b", 6.5, 9.0),
        ("verify", "02-b", 9.0, 10.0),
    ]


def test_rows_of_older_versions_without_worker_share_the_lane_unknown(tmp_path: Path) -> None:
    folder = tmp_path / "ts"
    rows = [row("a", 0, folder=folder, worker=None), row("b", 0, folder=folder, worker=None)]
    rows.append(row("c", 0, folder=folder, worker="main"))
    rows.append(row("d", 0, folder=folder, started_at=None))  # type: ignore[arg-type]
    chart = timeline(load_taskset(write_results(folder, rows)).episodes)
    assert [(lane.worker, len(lane.bars)) for lane in chart.lanes] == [("main", 1), ("unknown", 2)]
    assert chart.untimed == 1
    html = render_report([folder / "rollouts_run_summary.json"], folder / "report.html")
    assert 'data-worker="unknown"' in html
    assert "1 episode(s) without recorded times are left out" in html


# ---------------------------------------------------------------------------- page


def test_report_shows_summary_tasks_charts_and_transcripts(tmp_path: Path) -> None:
    folder = tmp_path / "ts"
    rows = [
        row("hello", 0, folder=folder, reward=1.0),
        row(
            "hello",
            1,
            folder=folder,
            reward=0.0,
            failure_kind="verifier_failed",
            failure_reason="exit 1",
        ),
        row("poem", 0, folder=folder, steps=("01-title", "02-verse"), worker="gw1"),
        row("poem", 1, folder=folder, steps=("01-title", "02-verse"), worker="gw1", reward=0.5),
    ]
    usage = {"prompt_tokens": 12345, "completion_tokens": 678, "requests": 9, "cost_usd": None}
    summary = write_results(folder, rows, pass_at_k={"1": 0.5, "2": 0.75}, usage=usage)
    html = render_report([summary], folder / "report.html")
    assert html.count('class="bar"') == 10
    assert re.search(r'class="bar" data-count="2"', html)  # the two rewards of 1.0
    assert html.count('class="point"') == 2  # pass@1 and pass@2
    assert html.count('class="lane"') == 2
    assert "12,345" in html and ">requests<" in html
    # The task table: one row per task, a cell per repeat, links to the logs.
    table = html.split('class="tasks sortable"')[1].split("</table>")[0]
    assert table.count("<tr>") == 3 and "<th>r1</th>" in table
    assert 'href="verifier/hello__r1/test-stdout.txt"' in table
    assert 'href="verifier/hello__r1/trajectory.json"' in table
    assert 'href="verifier/poem__r0/"' in table  # a multi-step episode: its folder
    # Failures by kind; a plain low reward in a group of its own, with the verifier's
    # last words on the page.
    assert "<strong>verifier_failed</strong> (1)" in html
    assert "<strong>the verifier scored below a pass</strong> (1)" in html
    failures = html.split("<h3>Failures</h3>")[1].split("<h3>")[0]
    assert '<pre class="log">checked poem 02-verse</pre>' in failures
    # Transcripts, per step for the multi-step episode.
    assert html.count('<details class="episode"') == 4
    assert "<h4>02-verse · reward 0.500</h4>" in html
    assert "do 02-verse" in html and "checked poem 01-title" in html


def test_agent_output_renders_as_text(tmp_path: Path) -> None:
    folder = tmp_path / "ts"
    rows = [
        row("hello", 0, folder=folder, reward=0.0, failure_kind="x" + ATTACK, failure_reason=ATTACK)
    ]
    summary = write_results(folder, rows)
    logs = folder / "verifier" / "hello__r0"
    hostile = trajectory(ATTACK, "<b>bold</b>")
    hostile["steps"][1]["tool_calls"] = [
        {"tool_call_id": ATTACK, "function_name": ATTACK, "arguments": {"cmd": ATTACK}}
    ]
    hostile["steps"][1]["observation"] = {"results": [{"content": ATTACK}]}
    hostile["agent"]["name"] = ATTACK
    (logs / "trajectory.json").write_text(json.dumps(hostile))
    (logs / "test-stdout.txt").write_text(ATTACK)
    html = render_report([summary], folder / "report.html")
    assert html.count("<script>") == 1  # the page's own
    assert "<img" not in html and "<b>bold" not in html
    assert "&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x" in html
    assert html.count("&lt;img src=x onerror=") >= 7


def test_a_hostile_task_id_renders_as_text(tmp_path: Path) -> None:
    folder = tmp_path / "ts"
    name = '<img src=x onerror="alert(1)">'
    summary = write_results(folder, [row(name, 0, folder=folder)])
    html = render_report([summary], folder / "report.html")
    assert "<img" not in html
    # Links are quoted paths: no markup, no scheme.
    assert 'href="verifier/%3Cimg%20src%3Dx%20onerror%3D%22alert%281%29%22%3E__r0/"' in html


def test_check_json_makes_a_task_check_section_first(tmp_path: Path) -> None:
    folder = tmp_path / "ts"
    summary = write_results(folder, [row("a", 0, folder=folder), row("b", 0, folder=folder)])
    check = {
        "schema_version": 1,
        "repeats": 3,
        "tasks": {
            "a": {"problems": [], "oracle_rewards": [1.0, 1.0, 1.0], "nop_reward": 0.0},
            "b": {
                "problems": [
                    {"kind": "flaky-verifier", "detail": "rewards 1.0, 0.0, 1.0"},
                    {"kind": "nop-passes", "detail": "nop scored 1.0"},
                ],
                "oracle_rewards": [1.0, 0.0, 1.0],
                "nop_reward": 1.0,
            },
            "c": {"problems": [], "oracle_rewards": [1.0], "nop_reward": None},
        },
    }
    (folder / "check.json").write_text(json.dumps(check))
    html = render_report([summary], folder / "report.html")
    section = html.split("<h2>Task check: ts</h2>")[1].split("</section>")[0]
    assert html.index("<h2>Task check: ts</h2>") < html.index("<h2>ts</h2>")
    assert "1 task(s) with problems; 2 task(s) without problems" in section
    assert "flaky-verifier" in section and "nop-passes" in section
    assert "1.000, 0.000, 1.000" in section
    (folder / "check.json").unlink()
    assert "Task check" not in render_report([summary], folder / "report.html")


def test_a_single_pass_at_k_is_a_value_not_a_chart(tmp_path: Path) -> None:
    folder = tmp_path / "ts"
    summary = write_results(folder, [row("a", 0, folder=folder)], pass_at_k={"1": 1.0})
    html = render_report([summary], folder / "report.html")
    assert "pass@1 = 1.000" in html and 'class="chart pass-at-k"' not in html


def test_a_taskset_with_only_failures(tmp_path: Path) -> None:
    folder = tmp_path / "ts"
    failures = [
        failure("a", 0, "sandbox_start_failed", "the image did not build"),
        failure("b", 0, "sandbox_start_failed", "the image did not build"),
        failure("c", 0, "episode_timeout", "the deadline passed", stage="turn"),
    ]
    summary = write_results(folder, [], failures)
    html = render_report([summary], folder / "report.html")
    assert "No scored episode." in html
    assert "No episode recorded its times." in html
    assert "<strong>sandbox_start_failed</strong> (2)" in html
    assert "<strong>episode_timeout</strong> (1)" in html
    assert html.index("sandbox_start_failed</strong>") < html.index("episode_timeout</strong>")
    assert "the deadline passed" in html and "<td>turn</td>" in html


def test_an_empty_taskset(tmp_path: Path) -> None:
    summary = write_results(tmp_path / "ts", [])
    html = render_report([summary], tmp_path / "ts" / "report.html")
    assert "No episodes in this run." in html
    assert "<svg" not in html


def test_missing_files_are_said_not_fatal(tmp_path: Path) -> None:
    folder = tmp_path / "ts"
    summary = write_results(folder, [row("a", 0, folder=folder), row("b", 0, folder=folder)])
    (folder / "verifier" / "a__r0" / "trajectory.json").unlink()
    (folder / "verifier" / "a__r0" / "test-stdout.txt").unlink()
    shutil.rmtree(folder / "verifier" / "b__r0")
    (folder / "rollouts.jsonl").unlink()
    html = render_report([summary], folder / "report.html")
    assert "No trajectory.json." in html
    assert "verifier/a__r0/trajectory.json" not in html
    assert "No verifier logs." in html  # b's folder is gone
    assert "No episode recorded its times." in html  # no rows
    assert html.count('<details class="episode"') == 2


def test_unreadable_lines_are_noted(tmp_path: Path) -> None:
    folder = tmp_path / "ts"
    summary = write_results(folder, [row("a", 0, folder=folder)])
    with (folder / "rollouts.jsonl").open("a") as stream:
        stream.write('{"task_id": "half\n')
    taskset = load_taskset(summary)
    assert taskset.notes == ("rollouts.jsonl: 1 line(s) that are not rows were left out",)
    assert "1 line(s) that are not rows" in render_report([summary], folder / "r.html")


def test_long_trajectories_are_cut_with_a_link(tmp_path: Path) -> None:
    path = tmp_path / "trajectory.json"
    path.write_text(json.dumps(trajectory(*(f"{n} " + "x" * 1000 for n in range(50)))))
    html = transcript_html(path, "t.json", Budget(per_trajectory=10_500))
    assert html.count('class="step ') == 10
    assert "40 more step(s) not shown" in html and 'href="t.json"' in html
    # The page's total: once spent, a transcript is only a link.
    budget = Budget(remaining=25_000, per_trajectory=20_000)
    assert transcript_html(path, "t.json", budget).count('class="step ') == 19
    assert transcript_html(path, "t.json", budget).count('class="step ') == 5
    assert "50 more step(s) not shown" in transcript_html(path, "t.json", budget)
    budget.take(budget.remaining)
    assert "reached its cap" in transcript_html(path, "t.json", budget)


def test_a_trajectory_that_is_not_json_shows_its_start(tmp_path: Path) -> None:
    path = tmp_path / "trajectory.json"
    path.write_text("<script>" + "y" * 5000)
    html = transcript_html(path, "t.json", Budget(per_trajectory=1000))
    assert "&lt;script&gt;" in html and "first 1 KB of 5 KB" in html


# ---------------------------------------------------------------------------- files and command


def test_links_are_relative_to_the_report_and_survive_a_move(tmp_path: Path) -> None:
    folder = tmp_path / "results" / "harbor" / "ts"
    write_results(folder, [row("a", 0, folder=folder)])
    moved = tmp_path / "elsewhere" / "ts"
    shutil.move(folder, moved)
    # Rows still name the old, now missing, folders: the summary's paths are used.
    assert main([str(moved.parent), "-o", str(tmp_path / "out" / "all.html")]) == 0
    html = (tmp_path / "out" / "all.html").read_text()
    links = hrefs(html)
    assert "../elsewhere/ts/verifier/a__r0/trajectory.json" in links
    assert all((tmp_path / "out" / link).exists() for link in links)
    assert "do episode" in html  # the transcript was read from the moved folder


def test_the_command_covers_every_summary_under_the_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("one", "two"):
        folder = tmp_path / "harbor" / name
        write_results(folder, [row("a", 0, folder=folder)])
    assert len(find_summaries(tmp_path)) == 2
    assert main([str(tmp_path)]) == 0
    html = (tmp_path / "report.html").read_text()
    assert '<a href="#ts0">one</a>' in html and '<a href="#ts1">two</a>' in html
    assert f"report: {tmp_path / 'report.html'} (2 taskset(s))" in capsys.readouterr().out


@pytest.mark.parametrize("make", [True, False])
def test_the_command_refuses_a_folder_without_a_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: bool
) -> None:
    folder = tmp_path / "nothing"
    if make:
        folder.mkdir()
    assert main([str(folder)]) == 2
    error = capsys.readouterr().err
    assert str(folder) in error
    assert ("holds no rollouts_run_summary.json" if make else "is not a folder") in error
    assert not (folder / "report.html").exists()


def test_write_report_masks_and_writes_whole(tmp_path: Path) -> None:
    folder = tmp_path / "ts"
    summary = write_results(folder, [row("a", 0, folder=folder, failure_reason="key sk-123")])
    out = write_report(
        [summary], folder / "report.html", redact=lambda t: t.replace("sk-123", "***")
    )
    text = out.read_text()
    assert "key ***" in text and "sk-123" not in text
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")


def test_a_missing_number_is_a_dash(tmp_path: Path) -> None:
    summary = write_results(tmp_path / "ts", [])
    html = render_report([summary], tmp_path / "ts" / "report.html")
    assert '<span class="value">\u2013</span><span class="label">mean reward' in html
    assert "&amp;" not in html


def test_odd_rows_do_not_keep_the_report_from_being_written(tmp_path: Path) -> None:
    """Rows an older version or a hand may have written: Infinity and NaN (not JSON, but
    Python writes them), numbers as strings, fields of the wrong shape."""
    folder = tmp_path / "ts"
    rows = [
        row("t1", 0, folder=folder, reward=float("inf")),
        row("t2", 0, folder=folder, reward=float("nan")),
        row("t3", 0, folder=folder, reward=1e308),
        row("t4", 0, folder=folder, reward=-1e308),
    ]
    summary = write_results(folder, rows, pass_at_k={"1": float("nan")})
    odd = [
        {"task_id": "shapes", "repeat": 0, "reward": "1", "turns": "x", "timings": 5},
        {"task_id": "more", "repeat": "0", "reward": None, "turns": [5, None], "usage": []},
    ]
    with (folder / "rollouts.jsonl").open("a") as handle:
        handle.write("".join(json.dumps(entry) + "\n" for entry in odd))
    out = write_report([summary], folder / "report.html")
    page = re.sub(r"<script.*?</script>", "", out.read_text(), flags=re.S)
    assert page.count("<tr>") > 4
    assert "Infinity" not in page and "NaN" not in page and ">inf" not in page


def test_the_header_the_interruption_and_the_agents_log(tmp_path: Path) -> None:
    folder = tmp_path / "ts"
    rows = [row("hello", 0, folder=folder, reward=0.0)]
    summary_file = write_results(folder, rows)
    agent = folder / "agent" / "hello__r0"
    agent.mkdir(parents=True)
    (agent / "oracle.txt").write_text("solve.sh said this\n")
    summary = json.loads(summary_file.read_text())
    summary["model"] = {"name": "m-1", "base_url": "http://127.0.0.1:9/v1", "params": {}}
    summary["interrupted"] = True
    summary["episodes"][0]["logs"][0]["agent_log"] = "agent/hello__r0/oracle.txt"
    summary_file.write_text(json.dumps(summary))
    html = render_report([summary_file], folder / "report.html")
    assert "model m-1 at http://127.0.0.1:9/v1" in html
    assert "--harbor-resume runs only those" in html
    assert 'href="agent/hello__r0/oracle.txt">oracle.txt</a>' in html
    assert "<strong>the verifier scored 0</strong> (1)" in html
