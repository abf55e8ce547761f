"""Per-episode overhead of trivial tasks, and episodes per second, with -n 1 and -n 2.

Generates N trivial tasks (prebuilt image, one-line solve.sh and test.sh), runs them
through the oracle with pytest-xdist, and prints, per worker count: the median
wall time per episode once pytest's start-up (measured by the same run with every item
deselected) is taken off, episodes per second over the whole pytest run (start-up
included), and the median of each phase from rollouts.jsonl. A sandbox starts while the
episode before it runs and is removed in the background, so the phases overlap: `start`
(create and start the container) is mostly hidden, and `episode` (seed to verifier done)
is shorter than the wall time an episode costs.

    .venv/bin/python bench/episode_overhead.py [--tasks 40] [--workers 1 2] [--user nobody]

With `--against PYTHON`, the same dataset also runs with another interpreter (a virtualenv
with another version of pytest-harbor installed, say main's), the two taking turns
`--rounds` times so that the machine's drift falls on both, and each figure is printed
for both with its median over the rounds:

    git worktree add /tmp/main main
    python3 -m venv /tmp/main/.venv && /tmp/main/.venv/bin/pip install -e /tmp/main
    .venv/bin/python bench/episode_overhead.py --against /tmp/main/.venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

IMAGE = "debian:bookworm-slim"


def make_dataset(root: Path, count: int, user: str | None = None) -> Path:
    dataset = root / ("trivial" if user is None else f"trivial-{user}")
    agent = "" if user is None else f'\n[agent]\nuser = "{user}"\n'

    for index in range(count):
        task = dataset / f"task-{index:03d}"
        (task / "tests").mkdir(parents=True)
        (task / "solution").mkdir()
        (task / "task.toml").write_text(
            textwrap.dedent(
                f"""\
                [environment]
                docker_image = "{IMAGE}"

                [verifier]
                timeout_sec = 60
                """
            )
            + agent
        )
        (task / "instruction.md").write_text("Write 1 to /tmp/answer.\n")
        (task / "solution" / "solve.sh").write_text("echo 1 > /tmp/answer\n")
        (task / "tests" / "test.sh").write_text("cp /tmp/answer /logs/verifier/reward.txt\n")
    return dataset


def pytest_run(
    dataset: Path, workers: int, results: Path, *extra: str, python: str = sys.executable
) -> tuple[float, int, str]:
    command = [
        python,
        "-m",
        "pytest",
        # Only the plugins a run needs (other plugins a virtualenv happens to hold are
        # loaded by pytest at every start, and differ between the two compared).
        *("-p", "xdist.plugin", "-p", "pytest_timeout", "-p", "pytest_harbor.plugin"),
        f"--harbor-dataset={dataset}",
        f"--harbor-results-dir={results}",
        "-n",
        str(workers),
        "-q",
        "-p",
        "no:cacheprovider",
        *extra,
    ]
    started = time.monotonic()
    # Compiled modules are cached as they are on a user's machine (this project's CI
    # machines turn that off), so that start-up counts what a user waits for.
    environment = {
        key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"
    }
    environment["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    completed = subprocess.run(
        command, capture_output=True, text=True, cwd=dataset.parent, env=environment
    )
    return time.monotonic() - started, completed.returncode, completed.stdout + completed.stderr


def run(
    dataset: Path, workers: int, results: Path, python: str = sys.executable
) -> dict[str, float]:
    # The same run with every item deselected: start-up, collection, shut-down.
    fixed, code, output = pytest_run(dataset, workers, results, "-k", "no-such-task", python=python)
    if code != 5:
        sys.exit(f"the empty run did not select zero items ({code}):\n{output}")
    wall, code, output = pytest_run(dataset, workers, results, python=python)
    if code != 0:
        sys.exit(f"pytest failed ({code}):\n{output}")
    rows_file = results / "harbor" / "validation" / dataset.name / "latest" / "rollouts.jsonl"
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    timings = [row["timings"] for row in rows]

    def median(key: str) -> float:
        return float(statistics.median(t[key] for t in timings if t.get(key) is not None))

    return {
        "episodes": len(rows),
        "wall_s": wall,
        "episodes_per_s": len(rows) / wall,
        "fixed_s": fixed,
        "wall_per_episode_s": (wall - fixed) / len(rows),
        "median_episode_s": median("total_s"),
        "median_start_s": median("start_s"),
        "median_seed_s": median("seed_s"),
        "median_agent_s": median("agent_s"),
        "median_verify_s": median("verify_s"),
    }


def describe(numbers: dict[str, float]) -> str:
    return (
        f"{numbers['episodes_per_s']:.2f} episodes/s "
        f"({numbers['episodes']:.0f} in {numbers['wall_s']:.1f} s, start-up included); "
        f"{numbers['wall_per_episode_s']:.3f} s wall per episode past the "
        f"{numbers['fixed_s']:.1f} s start-up; medians: start "
        f"{numbers['median_start_s']:.3f} (overlapped), episode "
        f"{numbers['median_episode_s']:.3f} "
        f"(seed {numbers['median_seed_s']:.3f}, agent {numbers['median_agent_s']:.3f}, "
        f"verify {numbers['median_verify_s']:.3f})"
    )


def median_of(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(numbers[key] for numbers in rounds) for key in rounds[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--user", help="the agent's user (the oracle runs as root otherwise)")
    parser.add_argument("--against", help="another interpreter to compare with, in turns")
    parser.add_argument("--rounds", type=int, default=3, help="turns each, with --against")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="harbor-bench-") as scratch:
        root = Path(scratch)
        dataset = make_dataset(root, args.tasks, args.user)
        who = f"as {args.user}" if args.user else "as root"
        print(f"{args.tasks} trivial episodes on {IMAGE}, the agent {who}")
        for workers in args.workers:
            if args.against is None:
                print(f"-n {workers}: " + describe(run(dataset, workers, root / f"n{workers}")))
                continue
            sides: dict[str, list[dict[str, float]]] = {"this": [], "against": []}
            for turn in range(args.rounds):
                for side, python in (("this", sys.executable), ("against", args.against)):
                    results = root / f"n{workers}-{side}-{turn}"
                    sides[side].append(run(dataset, workers, results, python))
            for side, rounds in sides.items():
                numbers = median_of(rounds)
                print(f"-n {workers} {side:>7}: " + describe(numbers))
            this, against = (median_of(sides[side]) for side in ("this", "against"))
            print(
                f"-n {workers}: wall per episode {this['wall_per_episode_s']:.3f} s against "
                f"{against['wall_per_episode_s']:.3f} s "
                f"({this['wall_per_episode_s'] - against['wall_per_episode_s']:+.3f} s)"
            )


if __name__ == "__main__":
    main()
