"""Time and size of the HTML report of a large synthetic run.

Writes a results folder of TASKS x REPEATS episodes (1000 by default) run by 8 workers,
each with a verifier folder holding test-stdout.txt, reward.txt and an ATIF
trajectory.json of about 20 steps (one in 50 is a 400 KB trajectory, past the per
trajectory cap); then makes its report and prints how long that took and how large the
page is. Goal: a few seconds and a page bounded by the caps, whatever the run's size.

    .venv/bin/python bench/report_size.py [--tasks 250] [--repeats 4]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pytest_harbor.report import TOTAL_LIMIT, TRAJECTORY_LIMIT, write_report
from pytest_harbor.run.metrics import pass_at_k

WORKERS = 8


def trajectory(rng: random.Random, big: bool) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [
        {"step_id": 1, "source": "user", "message": "Fix the failing test in /app. " * 10}
    ]
    while len(steps) < 20:
        number = len(steps) + 1
        call = f"call-{number}"
        output = "line of output\n" * rng.randint(5, 80)
        if big and number == 2:
            output = "a very long log line\n" * 20_000  # 400 KB
        steps.append(
            {
                "step_id": number,
                "source": "agent",
                "message": "Looking at the files. " * rng.randint(1, 20),
                "tool_calls": [
                    {
                        "tool_call_id": call,
                        "function_name": "bash",
                        "arguments": {"command": f"cat /app/file{number}.py | head -n 50"},
                    }
                ],
                "observation": {"results": [{"source_call_id": call, "content": output}]},
                "metrics": {"prompt_tokens": 1000 * number, "completion_tokens": 50},
            }
        )
    return {
        "schema_version": "ATIF-v1.7",
        "agent": {"name": "bench", "version": "1"},
        "steps": steps,
    }


def make_results(folder: Path, tasks: int, repeats: int) -> Path:
    rng = random.Random(7)
    start = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
    clocks = [0.0] * WORKERS
    rows, episodes = [], []
    passed: dict[str, int] = {}
    for number in range(tasks * repeats):
        task, repeat = f"task-{number // repeats:04d}", number % repeats
        logs = folder / "verifier" / f"{task}__r{repeat}"
        logs.mkdir(parents=True)
        reward = rng.choice([0.0, 0.0, 0.5, 1.0, 1.0, 1.0])
        (logs / "test-stdout.txt").write_text("test output\n" * rng.randint(1, 400))
        (logs / "reward.txt").write_text(f"{reward}\n")
        big = number % 50 == 0
        (logs / "trajectory.json").write_text(json.dumps(trajectory(rng, big)))
        worker = number % WORKERS
        phases = {
            "build_s": rng.uniform(0, 5),
            "seed_s": rng.uniform(0.3, 2),
            "agent_s": rng.uniform(5, 60),
            "verify_s": rng.uniform(0.5, 5),
        }
        started = clocks[worker] + phases["build_s"]
        clocks[worker] = started + phases["seed_s"] + phases["agent_s"] + phases["verify_s"]
        rows.append(
            {
                "task_id": task,
                "taskset": folder.name,
                "repeat": repeat,
                "agent": "bench",
                "reward": reward,
                "worker": f"gw{worker}",
                "started_at": (start + timedelta(seconds=started)).isoformat(),
                "timings": {**phases, "total_s": clocks[worker] - started},
                "turns": [{"step": "episode", "reward": reward, "verifier_logs_dir": str(logs)}],
            }
        )
        relative = logs.relative_to(folder)
        episodes.append(
            {
                "task_id": task,
                "repeat": repeat,
                "status": "passed" if reward == 1.0 else "failed",
                "reward": reward,
                "failure_kind": None if reward else rng.choice([None, "verifier_failed"]),
                "logs": [
                    {
                        "step": "episode",
                        "verifier_dir": str(relative),
                        "test_stdout": str(relative / "test-stdout.txt"),
                        "reward_file": str(relative / "reward.txt"),
                        "trajectory": str(relative / "trajectory.json"),
                    }
                ],
            }
        )
        passed[task] = passed.get(task, 0) + (reward == 1.0)
    ks = [k for k in (1, 2, 4, 8, 16) if k <= repeats]
    per_task = {str(k): {t: pass_at_k(repeats, c, k) for t, c in passed.items()} for k in ks}
    summary = {
        "schema_version": 1,
        "taskset": folder.name,
        "agent": "bench",
        "repeats": repeats,
        "counts": {
            "episodes": len(episodes),
            "passed": sum(e["status"] == "passed" for e in episodes),
            "failed": sum(e["status"] == "failed" for e in episodes),
            "mean_reward": sum(row["reward"] for row in rows) / len(rows),
        },
        "usage": {"prompt_tokens": 10**8, "completion_tokens": 10**6, "requests": 20_000},
        "pass_at_k": {k: sum(v.values()) / len(v) for k, v in per_task.items()},
        "pass_at_k_per_task": per_task,
        "episodes": episodes,
    }
    (folder / "rollouts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    path = folder / "rollouts_run_summary.json"
    path.write_text(json.dumps(summary))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=250)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--keep", type=Path, help="copy the report here, to open it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "bench"
        summary = make_results(folder, args.tasks, args.repeats)
        on_disk = sum(p.stat().st_size for p in (folder / "verifier").rglob("trajectory.json"))
        began = time.perf_counter()
        out = write_report([summary], folder / "report.html")
        seconds = time.perf_counter() - began
        size = out.stat().st_size
        print(
            f"episodes: {args.tasks * args.repeats}, trajectories on disk: {on_disk / 1e6:.1f} MB"
        )
        print(f"report: {seconds:.2f} s, {size / 1e6:.1f} MB")
        print(
            f"caps: {TRAJECTORY_LIMIT / 1e3:.0f} KB of text per trajectory, "
            f"{TOTAL_LIMIT / 1e6:.0f} MB in all"
        )
        if args.keep:
            shutil.copyfile(out, args.keep)


if __name__ == "__main__":
    main()
