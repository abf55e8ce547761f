"""Throughput of trivial tasks on one Docker engine and on two.

Starts a second dockerd on this machine (its own socket, data root and bridge, as the
suite's tests do), then runs the same dataset of trivial tasks (prebuilt image, a short
solve.sh and test.sh) through the oracle three ways at -n W:

- one engine, as a run without `hosts` uses it;
- the same engine named as the only host (the fleet's own cost: placement, pings);
- two engines, each with room for half of the run's sandboxes.

Prints the wall time of each run and episodes per second (median of --runs). On one
machine the second engine shares the CPUs, so this measures the fleet's overhead and the
engines' own contention, not a bigger machine.

    .venv/bin/python bench/two_engines.py [--tasks 24] [--workers 4] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.second_engine import FIRST_ENGINE, SecondEngine  # noqa: E402

TASK_TOML = '[environment]\ndocker_image = "debian:bookworm-slim"\n'


def make_dataset(root: Path, tasks: int) -> Path:
    dataset = root / "trivial"
    for index in range(tasks):
        task = dataset / f"t{index:03d}"
        (task / "tests").mkdir(parents=True)
        (task / "solution").mkdir()
        (task / "task.toml").write_text(TASK_TOML)
        (task / "instruction.md").write_text("Write 1 to /tmp/answer.\n")
        (task / "solution" / "solve.sh").write_text("echo 1 > /tmp/answer\n")
        (task / "tests" / "test.sh").write_text("cp /tmp/answer /logs/verifier/reward.txt\n")
    return dataset


def run(dataset: Path, workers: int, hosts: list[dict[str, object]] | None) -> float:
    command = [
        sys.executable,
        "-m",
        "pytest",
        f"--harbor-dataset={dataset}",
        f"--harbor-results-dir={dataset.parent / 'results'}",
        "-n",
        str(workers),
        "-q",
        "-p",
        "no:cacheprovider",
    ]
    if hosts is not None:
        command.append(f"--harbor-set=sandbox_provider_options={json.dumps({'hosts': hosts})}")
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, cwd=dataset.parent)
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"pytest failed\n{done.stdout[-3000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=24)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    # Each worker holds up to two sandboxes: its episode's and the next one's, started
    # early; a capacity of twice the workers leaves the early starts alone.
    room = 2 * args.workers
    second = SecondEngine().start()
    try:
        with tempfile.TemporaryDirectory(prefix="harbor-bench-") as scratch:
            dataset = make_dataset(Path(scratch), args.tasks)
            setups: dict[str, list[dict[str, object]] | None] = {
                "one engine (no hosts)": None,
                "one engine as the only host": [{"url": FIRST_ENGINE, "capacity": args.workers}],
                "two engines": [
                    {"url": FIRST_ENGINE, "capacity": room // 2},
                    {"url": second.url, "capacity": room // 2},
                ],
            }
            # A first run loads the image into the second engine; it is not timed.
            run(dataset, args.workers, setups["two engines"])
            print(
                f"{args.tasks} trivial tasks through the oracle at -n {args.workers}, "
                f"median of {args.runs} runs"
            )
            # Interleaved, round by round, so that a drift of the machine hits all alike.
            times: dict[str, list[float]] = {name: [] for name in setups}
            for _ in range(args.runs):
                for name, hosts in setups.items():
                    times[name].append(run(dataset, args.workers, hosts))
            for name, taken in times.items():
                median = statistics.median(taken)
                print(
                    f"  {name:30s} {median:6.2f} s   {args.tasks / median:5.2f} episodes/s"
                    f"   (runs: {', '.join(f'{t:.2f}' for t in taken)})"
                )
    finally:
        second.stop()


if __name__ == "__main__":
    main()
