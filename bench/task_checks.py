"""What checking a task's files costs: the Compose model and the Dockerfile allow-list,
against `docker compose config`, which every Compose task runs anyway.

For each Compose task of `example_datasets/compose` prints the median of N timings of:
reading the file as written (`check_source`), reading the canonical configuration into
the model and writing the project out (`read_project`), checking each Dockerfile the task
builds, and one `docker compose config` of the same file (the whole `read_compose`).

    .venv/bin/python bench/task_checks.py [--repeats 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from pytest_harbor.sandboxes.compose.model import read_project
from pytest_harbor.sandboxes.compose.project import read_compose, run_config
from pytest_harbor.sandboxes.compose.source import check_source
from pytest_harbor.tasks.dockerfiles import check_dockerfile_text

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "example_datasets" / "compose"
IMAGE = "debian:bookworm-slim"


def median_us(action: object, repeats: int) -> float:
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()  # type: ignore[operator]
        timings.append(time.perf_counter() - started)
    return statistics.median(timings) * 1e6


def bench_task(task: Path, repeats: int) -> str:
    environment = task / "environment"
    file = environment / "docker-compose.yaml"
    with tempfile.TemporaryDirectory() as scratch:
        # As read_compose does: `main` runs the task's image unless the file says otherwise.
        base = Path(scratch) / "base.json"
        base.write_text(json.dumps({"services": {"main": {"image": IMAGE}}}))
        config = run_config([base, file], environment, {"PATH": os.environ["PATH"]})
    dockerfiles = [path.read_text() for path in environment.rglob("Dockerfile")]
    source = median_us(lambda: check_source(task, file), repeats)
    model = median_us(lambda: read_project(task, file, config), repeats)
    checked = median_us(lambda: [check_dockerfile_text(text) for text in dockerfiles], repeats)

    def whole() -> None:
        read_compose(
            task,
            file,
            main_build=None,
            main_image=IMAGE,
            task_env={},
            variables={},
            overlays=[],
        )

    return f"{task.name:<14}{source:>9.0f}{model:>9.0f}{checked:>13.0f}{median_us(whole, 5):>16.0f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=200)
    repeats = parser.parse_args().repeats
    print(f"median of {repeats} timings (config: of 5), microseconds")
    print(f"{'task':<14}{'source':>9}{'model':>9}{'dockerfiles':>13}{'compose config':>16}")
    for task in sorted(path for path in COMPOSE.iterdir() if (path / "task.toml").is_file()):
        print(bench_task(task, repeats))


if __name__ == "__main__":
    main()
