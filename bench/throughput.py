"""Episodes per second: N trivial episodes through the oracle with -n W, several rounds.

Each round is one whole pytest run (start-up, collection and shut-down included), and
its result files are checked: one row per episode, an empty failures file, a summary
that counts every episode as passed. A last run with --harbor-resume, which has nothing
left to do, shows what resuming a finished run costs.

    .venv/bin/python bench/throughput.py [--tasks 40] [--workers 2] [--rounds 3]

With `--against PYTHON`, another interpreter (a virtualenv with another version of
pytest-harbor installed) runs the same dataset in turns with this one, and the rates of
both are printed, so that the machine's drift falls on both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from episode_overhead import IMAGE, make_dataset, pytest_run


def check_files(results: Path, taskset: str, episodes: int) -> None:
    folder = results / "harbor" / "validation" / taskset / "latest"
    rows = (folder / "rollouts.jsonl").read_text().splitlines()
    failures = (folder / "rollouts_failures.jsonl").read_text().splitlines()
    summary = json.loads((folder / "rollouts_run_summary.json").read_text())
    if len(rows) != episodes or failures or summary["counts"]["passed"] != episodes:
        sys.exit(
            f"result files are off: {len(rows)} rows, {len(failures)} failures, "
            f"summary counts {summary['counts']}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", help="another interpreter to compare with, in turns")
    args = parser.parse_args()
    sides = {"this": sys.executable}
    if args.against:
        sides["against"] = args.against
    with tempfile.TemporaryDirectory(prefix="harbor-bench-") as scratch:
        root = Path(scratch)
        dataset = make_dataset(root, args.tasks)
        print(f"{args.tasks} trivial episodes on {IMAGE}, -n {args.workers}")
        rates: dict[str, list[float]] = {side: [] for side in sides}
        for round_ in range(1, args.rounds + 1):
            for side, python in sides.items():
                results = root / f"results-{side}"
                wall, code, output = pytest_run(dataset, args.workers, results, python=python)
                if code != 0:
                    sys.exit(f"pytest failed ({code}):\n{output}")
                check_files(results, dataset.name, args.tasks)
                rates[side].append(args.tasks / wall)
                print(f"round {round_} {side}: {wall:.2f} s, {rates[side][-1]:.2f} episodes/s")
        for side, found in rates.items():
            print(
                f"{side}: median {statistics.median(found):.2f} episodes/s "
                f"(min {min(found):.2f}, max {max(found):.2f})"
            )
        results = root / "results-this"
        wall, code, output = pytest_run(dataset, args.workers, results, "--harbor-resume")
        if code != 0:  # every episode kept and passed: nothing left to run, the run passes
            sys.exit(f"the resumed run did not find everything done ({code}):\n{output}")
        check_files(results, dataset.name, args.tasks)
        print(f"--harbor-resume of the finished run: {wall:.2f} s, nothing run again")


if __name__ == "__main__":
    main()
