"""Start-up: how long importing the plugin takes, and a whole one-task run, warm.

The import is timed inside a fresh interpreter, after pytest's own (which every run pays
anyway), so the figure is the plugin's alone; every xdist worker pays it again. The run is
`pytest --harbor-dataset=example_datasets/quickstart -k hello`, start to exit, its image
already made (one run first, not counted).

    .venv/bin/python bench/startup.py [--rounds 7]

With `--against PYTHON`, another interpreter (a virtualenv with another version of
pytest-harbor installed) takes turns with this one, so the machine's drift falls on both,
and each figure is printed for both (median, min and max over the rounds).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DATASET = Path(__file__).resolve().parent.parent / "example_datasets" / "quickstart"

_IMPORT = (
    "import time; import pytest; started = time.perf_counter(); "
    "import pytest_harbor.plugin; print(time.perf_counter() - started)"
)


def import_s(python: str) -> float:
    done = subprocess.run([python, "-c", _IMPORT], capture_output=True, text=True, check=True)
    return float(done.stdout.strip())


def one_task_s(python: str, results: Path) -> float:
    command = [
        python,
        "-m",
        "pytest",
        f"--harbor-dataset={DATASET}",
        f"--harbor-results-dir={results}",
        "-k",
        "hello",
        "-q",
        "-p",
        "no:cacheprovider",
    ]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, cwd=DATASET.parent)
    took = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"the one-task run failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return took


def spread(values: list[float]) -> str:
    return (
        f"median {statistics.median(values):.3f} s "
        f"(min {min(values):.3f}, max {max(values):.3f}, {len(values)} runs)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--against", help="another interpreter to compare with, in turns")
    args = parser.parse_args()
    sides = {"this": sys.executable}
    if args.against:
        sides["against"] = args.against
    scratch = Path(tempfile.mkdtemp(prefix="harbor-startup-"))
    try:
        imports: dict[str, list[float]] = {side: [] for side in sides}
        runs: dict[str, list[float]] = {side: [] for side in sides}
        for side, python in sides.items():  # warm: the image made, the files read once
            one_task_s(python, scratch / side)
        for _ in range(args.rounds):
            for side, python in sides.items():
                imports[side].append(import_s(python))
                runs[side].append(one_task_s(python, scratch / side))
        for side in sides:
            print(f"{side:>7}: plugin import {spread(imports[side])}")
            print(f"{side:>7}: one-task run {spread(runs[side])}")
        if args.against:
            ratio = statistics.median(runs["this"]) / statistics.median(runs["against"])
            print(f"one-task run, this / against: {ratio:.2f}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
