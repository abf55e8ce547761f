"""Crash safety under chaos, at length: many rounds of a run over a generated dataset
killed (SIGKILL to the controller or an xdist worker) at a random moment, each followed
by the checks (every process of the run gone, nothing of it left on the engine within
60 s, every line of the results a valid row, no episode twice, no row a killed run wrote
changed or lost) and a resume that completes the set. Prints the counts, which must all
be 0, and the seed to replay a run.

    .venv/bin/python bench/chaos.py --rounds 30 [--tasks 12] [--workers 2] [--seed N]
"""

from __future__ import annotations

import argparse
import random
import secrets
import sys
import tempfile
import time
from pathlib import Path

import docker

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.chaos import ChaosTally, chaos_dataset, chaos_round  # noqa: E402

IMAGE = "debian:bookworm-slim"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--tasks", type=int, default=12)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=None)
    arguments = parser.parse_args()
    seed = arguments.seed if arguments.seed is not None else secrets.randbelow(2**32)
    rng = random.Random(seed)
    client = docker.from_env()
    tally = ChaosTally()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="harbor-chaos-") as scratch:
        dataset = Path(scratch) / "chaos"
        dataset.mkdir()
        tasks = chaos_dataset(dataset, arguments.tasks, seed, IMAGE)
        results = Path(scratch) / "results"
        for number in range(arguments.rounds):
            chaos_round(client, dataset, results, tasks, rng, tally, workers=arguments.workers)
            print(f"round {number + 1}: {tally.line()}", flush=True)
    print(f"\nseed {seed}, {time.monotonic() - started:.0f} s")
    print(tally.line())
    print(tally.kills())
    for note in tally.notes:
        if not note.split(": ", 1)[-1].startswith(("run, killed", "resume, killed")):
            print(" ", note)
    return 0 if tally.clean else 1


if __name__ == "__main__":
    sys.exit(main())
