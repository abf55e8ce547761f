"""A long run that must stay flat: 1,000 trivial episodes (100 tasks, 10 repeats) at -n 4,
printing for each hundred episodes the rate, the controller's and workers' memory and open
file descriptors, and the engine's container count, then the infrastructure errors (rows
of rollouts_failures.jsonl and items that errored), which must be 0.

    .venv/bin/python bench/soak.py [--tasks 100] [--repeats 10] [--workers 4]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import docker

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.chaos import children  # noqa: E402

IMAGE = "debian:bookworm-slim"


@dataclass
class Sample:
    at: float
    episodes: int
    controller_rss_mb: float
    worker_rss_mb: float
    controller_fds: int
    worker_fds: int
    containers: int


def make_dataset(folder: Path, tasks: int) -> None:
    for number in range(tasks):
        task = folder / f"t{number:03d}"
        (task / "tests").mkdir(parents=True)
        (task / "solution").mkdir()
        (task / "task.toml").write_text(f'[environment]\ndocker_image = "{IMAGE}"\n')
        (task / "instruction.md").write_text("Write 1 to /tmp/answer.\n")
        (task / "solution" / "solve.sh").write_text("echo 1 > /tmp/answer\n")
        (task / "tests" / "test.sh").write_text("cp /tmp/answer /logs/verifier/reward.txt\n")


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def fds(pid: int) -> int:
    try:
        return len(list(Path(f"/proc/{pid}/fd").iterdir()))
    except OSError:
        return 0


def count_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--workers", type=int, default=4)
    arguments = parser.parse_args()
    total = arguments.tasks * arguments.repeats
    client = docker.from_env()
    with tempfile.TemporaryDirectory(prefix="harbor-soak-") as scratch:
        dataset = Path(scratch) / "soak"
        dataset.mkdir()
        make_dataset(dataset, arguments.tasks)
        results = Path(scratch) / "results"
        rows = results / "harbor" / "validation" / "soak" / "latest" / "rollouts.jsonl"
        failures = rows.with_name("rollouts_failures.jsonl")
        command = [
            sys.executable,
            "-m",
            "pytest",
            f"--harbor-dataset={dataset}",
            f"--harbor-results-dir={results}",
            f"--harbor-repeats={arguments.repeats}",
            "--harbor-report=none",
            "-p",
            "no:cacheprovider",
            "-q",
            "-n",
            str(arguments.workers),
        ]
        started = time.monotonic()
        log = Path(scratch) / "run.log"
        with log.open("w") as output:
            run = subprocess.Popen(command, cwd=scratch, stdout=output, stderr=subprocess.STDOUT)
            samples: list[Sample] = []
            marks: list[Sample] = []
            while run.poll() is None:
                time.sleep(1.0)
                workers = children(run.pid)
                done = count_lines(rows) + count_lines(failures)
                sample = Sample(
                    at=time.monotonic() - started,
                    episodes=done,
                    controller_rss_mb=rss_mb(run.pid),
                    worker_rss_mb=max((rss_mb(pid) for pid in workers), default=0.0),
                    controller_fds=fds(run.pid),
                    worker_fds=max((fds(pid) for pid in workers), default=0),
                    containers=len(client.api.containers(filters={"label": "pytest-harbor.run"})),
                )
                samples.append(sample)
                while done >= (len(marks) + 1) * 100:
                    marks.append(sample)
        elapsed = time.monotonic() - started
        print(f"{total} episodes at -n {arguments.workers}: {elapsed:.0f} s in all")
        print(
            "episodes  per s (this hundred)  controller MB  worker MB (max)  "
            "controller fds  worker fds (max)  containers"
        )
        previous_at = 0.0
        for index, mark in enumerate(marks):
            span = mark.at - previous_at
            rate = 100 / span if span > 0 else float("nan")
            previous_at = mark.at
            print(
                f"{(index + 1) * 100:8d}  {rate:20.2f}  {mark.controller_rss_mb:13.0f}  "
                f"{mark.worker_rss_mb:15.0f}  {mark.controller_fds:14d}  "
                f"{mark.worker_fds:16d}  {mark.containers:10d}"
            )
        peak = max((sample.containers for sample in samples), default=0)
        written = count_lines(rows)
        errors = 0
        for line in failures.read_text().splitlines() if failures.exists() else []:
            errors += 1
            print("  failure:", json.loads(line).get("failure_kind"))
        left = len(client.api.containers(all=True, filters={"label": "pytest-harbor.run"}))
        print(
            f"rows {written} of {total}; infrastructure errors {errors}; exit status "
            f"{run.returncode}; containers at most {peak} at once, {left} left after"
        )
        if run.returncode != 0:
            print(log.read_text()[-3000:])
        return 0 if (errors == 0 and written == total and run.returncode == 0) else 1


if __name__ == "__main__":
    sys.exit(main())
