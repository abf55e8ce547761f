"""Per-episode cost of a two-service Compose task against a single-container task.

Runs, through the oracle at -n 1, R repeats of two tasks: `example_datasets/compose/
sidecar-api` (main plus an HTTP sidecar whose health check main waits for), and the same
task without its Compose file (one container, a trivial solution and test). Prints, for
each: the whole run's wall time less pytest's start-up (the same run with every item
deselected), divided by the episodes, and the medians of the phases rollouts.jsonl records
(start: creating and starting the sandbox, or the project; episode: seed to verified).

    .venv/bin/python bench/compose_overhead.py [--repeats 10]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIDECAR = ROOT / "example_datasets" / "compose" / "sidecar-api"


def make_tasks(root: Path) -> dict[str, Path]:
    compose = root / "compose"
    shutil.copytree(SIDECAR, compose / "sidecar-api")
    single = root / "single" / "one-container"
    shutil.copytree(SIDECAR, single)
    (single / "environment" / "docker-compose.yaml").unlink()
    (single / "instruction.md").write_text("Write 1 to /tmp/answer.\n")
    (single / "solution" / "solve.sh").write_text("echo 1 > /tmp/answer\n")
    (single / "tests" / "test.sh").write_text("cp /tmp/answer /logs/verifier/reward.txt\n")
    return {"two-service compose": compose, "single container": single.parent}


def run(dataset: Path, results: Path, repeats: int, *extra: str) -> float:
    command = [
        sys.executable,
        "-m",
        "pytest",
        f"--harbor-dataset={dataset}",
        f"--harbor-results-dir={results}",
        f"--harbor-repeats={repeats}",
        "-n",
        "1",
        "-q",
        "-p",
        "no:cacheprovider",
        *extra,
    ]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, cwd=dataset.parent)
    elapsed = time.monotonic() - started
    if done.returncode not in (0, 5):
        sys.exit(f"{dataset.name}: pytest failed\n{done.stdout[-3000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        for name, dataset in make_tasks(Path(scratch)).items():
            results = Path(scratch) / f"results-{dataset.name}"
            run(dataset, results, 1)  # warm-up: images built, caches filled
            shutil.rmtree(results)
            startup = run(dataset, results, args.repeats, "-k", "nothing-matches-this")
            shutil.rmtree(results, ignore_errors=True)
            wall = run(dataset, results, args.repeats)
            rows_file = next(results.rglob("rollouts.jsonl"))
            rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
            assert len(rows) == args.repeats and all(r["reward"] == 1.0 for r in rows), rows
            timings = {
                phase: statistics.median(r["timings"][phase] or 0.0 for r in rows)
                for phase in ("start_s", "seed_s", "agent_s", "verify_s")
            }
            episode = statistics.median(
                sum(r["timings"][p] or 0.0 for p in ("seed_s", "agent_s", "verify_s")) for r in rows
            )
            per_episode = (wall - startup) / args.repeats
            print(
                f"{name}: {per_episode:.3f} s wall per episode ({args.repeats} at -n 1, "
                f"past {startup:.1f} s start-up); medians: start {timings['start_s']:.3f}, "
                f"episode {episode:.3f} (seed {timings['seed_s']:.3f}, agent "
                f"{timings['agent_s']:.3f}, verify {timings['verify_s']:.3f})"
            )


if __name__ == "__main__":
    main()
