"""Datasets by reference: what fetching a registry dataset costs, cold and from the cache.

Makes a git repository of N task folders (copies of the quick-start tasks), a registry in
Harbor's format naming each at one commit, and resolves `harbor:bench@1.0` into a fresh
cache (cold: one fetch, N folders taken out, N digests), then again (warm: the registry
read, N cached folders and the view hashed again, nothing fetched), then once more after
one cached folder is edited (that one fetched again from the objects kept). Prints the
median over the rounds, and git's calls.

    .venv/bin/python bench/references.py [--tasks 100] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from pytest_harbor.datasets.resolve import DatasetCache

QUICKSTART = Path(__file__).resolve().parent.parent / "example_datasets" / "quickstart"


def make_repo(root: Path, tasks: int) -> tuple[str, str]:
    repo = root / "repo"
    sources = sorted(path for path in QUICKSTART.iterdir() if (path / "task.toml").is_file())
    for index in range(tasks):
        shutil.copytree(sources[index % len(sources)], repo / "tasks" / f"task-{index:04d}")
    run = ["git", "-C", str(repo)]
    subprocess.run([*run[:1], "init", "-q", str(repo)], check=True)
    subprocess.run([*run, "add", "-A"], check=True)
    subprocess.run(
        [*run, "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "tasks"], check=True
    )
    commit = subprocess.run(
        [*run, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return f"file://{repo}", commit


def timed(cache: Path, registry: Path) -> float:
    started = time.perf_counter()
    DatasetCache(cache, lambda _: None).resolve("harbor:bench@1.0", str(registry))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        url, commit = make_repo(root, args.tasks)
        registry = root / "registry.json"
        names = [f"task-{index:04d}" for index in range(args.tasks)]
        registry.write_text(
            json.dumps(
                [
                    {
                        "name": "bench",
                        "version": "1.0",
                        "tasks": [
                            {
                                "name": n,
                                "git_url": url,
                                "git_commit_id": commit,
                                "path": f"tasks/{n}",
                            }
                            for n in names
                        ],
                    }
                ]
            )
        )
        log = root / "git.log"
        shim = root / "shim"
        shim.mkdir()
        real = shutil.which("git")
        (shim / "git").write_text(f'#!/bin/sh\necho "$1 $2 $3" >> {log}\nexec {real} "$@"\n')
        (shim / "git").chmod(0o755)
        os.environ["PATH"] = f"{shim}{os.pathsep}{os.environ['PATH']}"
        cold, warm, healed = [], [], []
        for round_ in range(args.rounds):
            cache = root / f"cache-{round_}"
            cold.append(timed(cache, registry))
            warm.append(timed(cache, registry))
            entry = next((cache / "tasks").glob("*/tree"))
            (entry / "instruction.md").write_text("edited\n")
            healed.append(timed(cache, registry))
        calls = log.read_text().splitlines()
        fetches = sum(" fetch " in f" {line} " for line in calls) // args.rounds
        print(f"{args.tasks} tasks at one commit, median of {args.rounds} rounds:")
        print(f"  cold (fetch, take out, hash):      {statistics.median(cold):.3f} s")
        print(f"  warm (every folder hashed again):  {statistics.median(warm):.3f} s")
        print(f"  one cached folder edited:          {statistics.median(healed):.3f} s")
        print(f"  git fetches per cold resolve:      {fetches}")
        per_task = statistics.median(warm) / args.tasks * 1000
        print(f"  warm cost per task:                {per_task:.2f} ms")


if __name__ == "__main__":
    main()
