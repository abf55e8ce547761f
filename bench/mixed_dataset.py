"""A dataset of mixed cost, cold and warm, against its critical-path bound.

Generates tasks whose Dockerfiles take different times to build (`RUN sleep`, each its
own image) and whose verifiers take different times (a few long ones, named last, so
that collection order would start them last). Runs it through the oracle at -n 2:

- cold, building each image in the first episode that needs it
  (`image_build_concurrency=0`: build then run, task by task, two at a time);
- cold, with the images built ahead (the default pool);
- warm (images cached), twice: the first run records the durations, the second is
  ordered by them.

Each cold run has Dockerfiles no builder has seen. For each it prints the wall time, and
for the warm runs the bound no schedule can beat:
the longest trial, or the sum of the trials' times over the workers, whichever is more.

    .venv/bin/python bench/mixed_dataset.py [--tasks 12]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_harbor.sandboxes.images import image_tag_for

IMAGE = "debian:bookworm-slim"
WORKERS = 2


def make_dataset(root: Path, count: int) -> Path:
    """The tasks; their Dockerfiles carry a token of their own, so that no builder cache
    (BuildKit keeps one apart from the images) makes a cold run warm."""
    nonce = uuid.uuid4().hex[:12]
    dataset = root / "mixed"
    shutil.rmtree(dataset, ignore_errors=True)
    for index in range(count):
        long = index >= count - 2
        build = 1 + (index * 3) % 7  # 1..7 s
        verify = 12 if long else 0.5 + (index % 4)  # two long verifiers, named last
        task = dataset / f"task-{index:02d}{'-long' if long else ''}"
        (task / "tests").mkdir(parents=True)
        (task / "solution").mkdir()
        (task / "environment").mkdir()
        (task / "environment" / "Dockerfile").write_text(
            f"FROM {IMAGE}\nRUN echo {task.name}-{nonce} > /task-name && sleep {build}\n"
        )
        (task / "task.toml").write_text("[verifier]\ntimeout_sec = 120\n")
        (task / "instruction.md").write_text("Write 1 to /tmp/answer.\n")
        (task / "solution" / "solve.sh").write_text("echo 1 > /tmp/answer\n")
        (task / "tests" / "test.sh").write_text(
            f"sleep {verify}; cp /tmp/answer /logs/verifier/reward.txt\n"
        )
    return dataset


def remove_images(dataset: Path) -> None:
    for task in sorted(dataset.iterdir()):
        subprocess.run(
            ["docker", "image", "rm", "-f", image_tag_for(task / "environment")],
            capture_output=True,
            check=False,
        )


def run(dataset: Path, results: Path, *extra: str) -> tuple[float, list[dict]]:
    command = [
        sys.executable,
        "-m",
        "pytest",
        f"--harbor-dataset={dataset}",
        f"--harbor-results-dir={results}",
        "-n",
        str(WORKERS),
        "-q",
        "-p",
        "no:cacheprovider",
        *extra,
    ]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, cwd=dataset.parent)
    wall = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"pytest failed:\n{done.stdout[-3000:]}")
    rows_file = next(results.rglob("rollouts.jsonl"))
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    return wall, rows


def bound(rows: list[dict]) -> float:
    trials = [
        sum(row["timings"][phase] or 0.0 for phase in ("seed_s", "agent_s", "verify_s"))
        for row in rows
    ]
    return max(max(trials), sum(trials) / WORKERS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=12)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        results = Path(scratch) / "results"
        dataset = make_dataset(Path(scratch), args.tasks)
        one_by_one, _ = run(dataset, results, "--harbor-set=image_build_concurrency=0")
        shutil.rmtree(results)
        remove_images(dataset)
        dataset = make_dataset(Path(scratch), args.tasks)
        ahead, _ = run(dataset, results)
        shutil.rmtree(results)
        print(f"{args.tasks} tasks at -n {WORKERS}, builds of 1 to 7 s, verifiers 0.5 to 12 s")
        print(f"  cold, build then run task by task: {one_by_one:6.1f} s")
        print(f"  cold, images built ahead:          {ahead:6.1f} s  ({one_by_one / ahead:.2f}x)")

        first, rows = run(dataset, results)  # no record yet: collection order
        ordered, rows = run(dataset, results)  # ordered by the record the first one left
        floor = bound(rows)
        print(f"  warm, no record (collection order): {first:5.1f} s")
        print(
            f"  warm, longest first:                {ordered:5.1f} s  (bound {floor:.1f} s, "
            f"{(ordered / floor - 1) * 100:+.0f}% over it, start-up included)"
        )
        remove_images(dataset)


if __name__ == "__main__":
    main()
