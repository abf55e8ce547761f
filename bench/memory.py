"""Peak memory of a run whose verifier prints a gigabyte and writes 10,000 files.

Runs one such task with `-n 1` (a controller and a worker) and watches both processes'
peak resident memory (VmHWM in /proc) until they end; then checks that the episode kept
its reward. Goal: under 300 MB each.

    .venv/bin/python bench/memory.py [--gigabytes 1] [--files 10000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

IMAGE = "debian:bookworm-slim"


def make_task(root: Path, gigabytes: float, files: int) -> Path:
    task = root / "big" / "loud-verifier"
    (task / "tests").mkdir(parents=True)
    (task / "solution").mkdir()
    (task / "task.toml").write_text(
        f'[verifier]\ntimeout_sec = 600\n[environment]\ndocker_image = "{IMAGE}"\n'
    )
    (task / "instruction.md").write_text("Nothing to do.\n")
    (task / "solution" / "solve.sh").write_text("true\n")
    size = int(gigabytes * 1_000_000_000)
    (task / "tests" / "test.sh").write_text(
        textwrap.dedent(
            f"""\
            head -c {size} /dev/zero | tr '\\0' 'x'
            mkdir -p /logs/verifier/many
            i=0
            while [ $i -lt {files} ]; do echo $i > /logs/verifier/many/$i.txt; i=$((i+1)); done
            echo 1 > /logs/verifier/reward.txt
            """
        )
    )
    return task.parent


def descendants(root: int) -> set[int]:
    found, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            if child not in found:
                found.add(child)
                frontier.append(child)
    return found


def peak_kib(pid: int) -> tuple[str, int] | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return cmdline, int(line.split()[1])
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gigabytes", type=float, default=1.0)
    parser.add_argument("--files", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        dataset = make_task(Path(scratch), args.gigabytes, args.files)
        results = Path(scratch) / "results"
        started = time.monotonic()
        run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "-p",
                "no:anyio",
                f"--harbor-dataset={dataset}",
                f"--harbor-results-dir={results}",
                "-n",
                "1",
                "-q",
            ],
            cwd=scratch,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        peaks: dict[int, tuple[str, int]] = {}
        while run.poll() is None:
            for pid in descendants(run.pid):
                seen = peak_kib(pid)
                if seen is not None and "python" in seen[0]:
                    peaks[pid] = seen
            time.sleep(0.05)
        output = run.stdout.read() if run.stdout else ""
        elapsed = time.monotonic() - started
        rows = (results / "harbor" / "validation" / "big" / "latest" / "rollouts.jsonl").read_text()
        (row,) = [json.loads(line) for line in rows.splitlines()]
    print(
        f"verifier printed {args.gigabytes:g} GB and wrote {args.files} files; "
        f"run took {elapsed:.1f} s; reward {row['reward']}, "
        f"cut: {len(row['turns'][0]['verifier_files_cut'])} file(s)"
    )
    for pid, (_, kib) in sorted(peaks.items()):
        role = "controller" if pid == run.pid else "worker"
        print(f"  {role:10} pid {pid}: peak RSS {kib / 1024:.0f} MB")
    if run.returncode != 0:
        print(output[-3000:])
        raise SystemExit(run.returncode)
    worst = max(kib for _, kib in peaks.values()) / 1024
    print(f"largest peak: {worst:.0f} MB (goal: under 300 MB each)")


if __name__ == "__main__":
    main()
