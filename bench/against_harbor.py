"""The same trivial tasks through the oracle under Harbor's own runner (`harbor run`, its
docker environment) and under pytest-harbor, with the same concurrency, in turns.

Each round runs the dataset (N tasks on a prebuilt image, one-line solve.sh and test.sh,
as bench/episode_overhead.py makes them) once through `harbor run -a oracle -n WORKERS`
and once through `pytest --harbor-dataset -n WORKERS`, whole commands start to exit, and
checks that each scored every task 1. Prints the median, min and max wall time of each
and the ratio of the medians. Needs .venv-harbor (made by .ci/setup).

    .venv/bin/python bench/against_harbor.py [--tasks 10] [--workers 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from episode_overhead import make_dataset  # noqa: E402

from tests.harbor_agents import HARBOR_PYTHON  # noqa: E402

#: Both keep their compiled modules, as on a user's machine (this project's CI machines
#: turn that off); a warm-up run of each, outside the rounds, compiles them.
ENVIRONMENT = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}


def harbor_run(dataset: Path, workers: int, jobs: Path) -> float:
    harbor = HARBOR_PYTHON.parent / "harbor"
    command = [str(harbor), "run", "-p", str(dataset), "-a", "oracle", "-n", str(workers)]
    command += ["-o", str(jobs)]
    # LiteLLM's price list from its local copy: this machine has no internet to fetch it.
    env = {**ENVIRONMENT, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - started
    rewards = [
        json.loads(path.read_text()).get("verifier_result", {}).get("rewards", {}).get("reward")
        for path in sorted(jobs.glob("*/*/result.json"))
    ]
    if done.returncode != 0 or rewards != [1.0] * len(list(dataset.iterdir())):
        sys.exit(f"harbor run did not score every task 1 ({rewards}):\n{done.stdout[-3000:]}")
    return elapsed


def pytest_harbor(dataset: Path, workers: int, results: Path) -> float:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    command += [f"--harbor-dataset={dataset}", f"--harbor-results-dir={results}"]
    command += ["-n", str(workers)]
    started = time.perf_counter()
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=results.parent, env=ENVIRONMENT
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"pytest-harbor failed:\n{done.stdout[-3000:]}")
    return elapsed


def show(name: str, times: list[float]) -> None:
    print(
        f"  {name:<14} median {statistics.median(times):6.2f} s"
        f"  (min {min(times):.2f}, max {max(times):.2f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not HARBOR_PYTHON.exists():
        sys.exit(".venv-harbor is missing: run .ci/setup on a machine with Python 3.12")
    with tempfile.TemporaryDirectory(prefix="harbor-bench-") as scratch:
        root = Path(scratch)
        dataset = make_dataset(root, args.tasks)
        harbor_run(dataset, args.workers, root / "jobs-warm")
        pytest_harbor(dataset, args.workers, root / "results-warm")
        times: dict[str, list[float]] = {"harbor run": [], "pytest-harbor": []}
        for round_ in range(args.rounds):
            times["harbor run"].append(harbor_run(dataset, args.workers, root / f"jobs-{round_}"))
            results = root / f"results-{round_}"
            times["pytest-harbor"].append(pytest_harbor(dataset, args.workers, results))
        print(f"{args.tasks} trivial tasks through the oracle, {args.workers} at once:")
        for name, taken in times.items():
            show(name, taken)
        ratio = statistics.median(times["harbor run"]) / statistics.median(times["pytest-harbor"])
        print(f"  harbor run / pytest-harbor: {ratio:.1f}x")


if __name__ == "__main__":
    main()
