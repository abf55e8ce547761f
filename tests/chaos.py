"""Chaos rounds for crash safety: a run over a generated dataset, SIGKILL sent to one of its
processes (the controller, or an xdist worker) at a random moment, then the checks: every
process of the run gone, nothing of it left on the engine within 60 s, every complete line
of the results a valid row, no episode twice. The next round resumes (`--harbor-resume`);
a last round without a kill must leave every episode with exactly one row. Used by the
suite (a few rounds) and by bench/chaos.py (many)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import docker

from pytest_harbor.labels import TASK_LABEL
from pytest_harbor.writers.runs import runs_of

__all__ = ["ChaosTally", "chaos_dataset", "chaos_round", "children", "leftovers"]

#: Every process of a run ends within this long of its controller's kill.
PROCESSES_END_S = 60.0
#: What a run leaves on the engine is gone within this long of its processes' end.
LEFT_GONE_S = 60.0


@dataclass
class ChaosTally:
    """What the rounds found; every count but `rounds` must stay 0."""

    rounds: int = 0
    leaks: int = 0
    lingering: int = 0
    invalid_lines: int = 0
    duplicated_rows: int = 0
    lost_rows: int = 0
    #: What the kills hit, and the rows killed runs had written that resumes kept.
    killed: dict[str, int] = field(default_factory=dict)
    rows_kept: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (
            self.leaks
            or self.lingering
            or self.invalid_lines
            or self.duplicated_rows
            or self.lost_rows
        )

    def kills(self) -> str:
        hit = ", ".join(f"{what} {count}" for what, count in sorted(self.killed.items()))
        return f"kills: {hit}; rows of killed runs kept by resumes: {self.rows_kept}"

    def line(self) -> str:
        return (
            f"rounds {self.rounds}, leaks {self.leaks}, lingering processes {self.lingering}, "
            f"invalid lines {self.invalid_lines}, duplicated rows {self.duplicated_rows}, "
            f"lost rows {self.lost_rows}"
        )


def chaos_dataset(folder: Path, tasks: int, seed: int, image: str) -> list[str]:
    """`tasks` trivial tasks under `folder` (a dataset), each taking a random moment;
    their names."""
    rng = random.Random(seed)
    names = []
    for number in range(tasks):
        name = f"t{number:03d}"
        task = folder / name
        (task / "tests").mkdir(parents=True)
        (task / "solution").mkdir()
        (task / "task.toml").write_text(f'[environment]\ndocker_image = "{image}"\n')
        (task / "instruction.md").write_text("Write 1 to /tmp/answer.\n")
        pause = rng.uniform(0.0, 1.5)
        (task / "solution" / "solve.sh").write_text(f"sleep {pause:.2f}\necho 1 > /tmp/answer\n")
        (task / "tests" / "test.sh").write_text("cp /tmp/answer /logs/verifier/reward.txt\n")
        names.append(name)
    return names


def _start(dataset: Path, results: Path, workers: int, resume: bool) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "pytest",
        f"--harbor-dataset={dataset}",
        f"--harbor-results-dir={results}",
        "-p",
        "no:cacheprovider",
        "-q",
        "-n",
        str(workers),
    ]
    if resume:
        # A run killed before it wrote its manifest left nothing to continue: then the
        # resume starts afresh, as a script that resumes until done would have it.
        command.append("--harbor-resume-or-start")
    return subprocess.Popen(
        command,
        cwd=dataset.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def leftovers(client: docker.DockerClient, taskset: str) -> list[str]:
    """Containers, networks and volumes of the taskset's sandboxes still on the engine."""
    mine = f"{taskset}/"
    found = [
        f"container {item.name}"
        for item in client.containers.list(
            all=True, filters={"label": TASK_LABEL}, ignore_removed=True
        )
        if item.labels.get(TASK_LABEL, "").startswith(mine)
    ]
    found += [
        f"network {item.name}"
        for item in client.networks.list(filters={"label": TASK_LABEL})
        if (item.attrs.get("Labels") or {}).get(TASK_LABEL, "").startswith(mine)
    ]
    found += [
        f"volume {item.name}"
        for item in client.volumes.list(filters={"label": TASK_LABEL})
        if (item.attrs.get("Labels") or {}).get(TASK_LABEL, "").startswith(mine)
    ]
    return found


def _check_rows(rows_file: Path, tally: ChaosTally, *, final: bool) -> set[tuple[str, int]]:
    """The episodes with a row; counts lines that are not a row (a torn last line is
    allowed between rounds: the next run drops it) and episodes with two."""
    if not rows_file.is_file():
        return set()
    text = rows_file.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    torn = lines.pop()  # after the last newline: empty, or a line cut by the kill
    if torn and final:
        tally.invalid_lines += 1
        tally.notes.append(f"a torn last line in {rows_file}: {torn[:80]!r}")
    seen: set[tuple[str, int]] = set()
    for line in lines:
        try:
            row = json.loads(line)
            key = (str(row["task_id"]), int(row["repeat"]))
        except (ValueError, KeyError, TypeError):
            tally.invalid_lines += 1
            tally.notes.append(f"not a row in {rows_file}: {line[:80]!r}")
            continue
        if key in seen:
            tally.duplicated_rows += 1
            tally.notes.append(f"a second row of {key} in {rows_file}")
        seen.add(key)
    return seen


def chaos_round(
    client: docker.DockerClient,
    dataset: Path,
    results: Path,
    tasks: list[str],
    rng: random.Random,
    tally: ChaosTally,
    *,
    workers: int = 2,
    longest_s: float = 8.0,
) -> None:
    """A fresh run killed at a random moment; half the time a resume killed too; then a
    resume left alone, after which every task has exactly one row and every row the
    killed runs wrote is kept as it was."""
    tally.rounds += 1
    _killed(client, dataset, results, rng, tally, workers, longest_s, resume=False)
    before = _rows(_rows_file(results, dataset.name))
    if rng.random() < 0.5:
        _killed(client, dataset, results, rng, tally, workers, longest_s, resume=True)
        before = _kept(before, _rows(_rows_file(results, dataset.name)), tally, "a killed resume")
    run = _start(dataset, results, workers, resume=True)
    try:
        run.wait(timeout=600)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    _check_left(client, dataset.name, tally)
    rows_file = _rows_file(results, dataset.name)
    seen = _check_rows(rows_file, tally, final=True)
    _kept(before, _rows(rows_file), tally, "the last resume")
    tally.rows_kept += len(before)
    missing = sorted(set(tasks) - {task.split("/")[-1] for task, _ in seen})
    tally.lost_rows += len(missing)
    if missing:
        tally.notes.append(f"round {tally.rounds}: no row after the resume for {missing}")


def _killed(
    client: docker.DockerClient,
    dataset: Path,
    results: Path,
    rng: random.Random,
    tally: ChaosTally,
    workers: int,
    longest_s: float,
    *,
    resume: bool,
) -> None:
    """A run of which one process gets SIGKILL at a random moment; then every process of
    it must end, and nothing of it stay on the engine."""
    run = _start(dataset, results, workers, resume=resume)
    time.sleep(rng.uniform(0.3, longest_s))
    spawned = children(run.pid)
    victim = rng.choice(spawned) if spawned and rng.random() < 0.5 else run.pid
    what = "the controller" if victim == run.pid else "a worker"
    if run.poll() is not None:
        what = "nothing (the run had ended)"
    else:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            what += " (gone already)"
    tally.killed[what] = tally.killed.get(what, 0) + 1
    tally.notes.append(f"round {tally.rounds}: {'resume' if resume else 'run'}, killed {what}")
    deadline = time.monotonic() + PROCESSES_END_S
    while _group_alive(run.pid) and time.monotonic() < deadline:
        run.poll()
        time.sleep(0.2)
    if _group_alive(run.pid):
        tally.lingering += 1
        tally.notes.append(f"round {tally.rounds}: processes still there {PROCESSES_END_S:g} s on")
        os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    _check_left(client, dataset.name, tally)
    _check_rows(_rows_file(results, dataset.name), tally, final=False)


def _rows(rows_file: Path) -> dict[tuple[str, int], object]:
    """The complete, readable rows of the file by episode."""
    found: dict[tuple[str, int], object] = {}
    if not rows_file.is_file():
        return found
    for line in rows_file.read_text(encoding="utf-8", errors="replace").split("\n")[:-1]:
        try:
            row = json.loads(line)
            found[(str(row["task_id"]), int(row["repeat"]))] = row
        except (ValueError, KeyError, TypeError):
            continue
    return found


def _kept(
    before: dict[tuple[str, int], object],
    after: dict[tuple[str, int], object],
    tally: ChaosTally,
    what: str,
) -> dict[tuple[str, int], object]:
    """Every row of `before` is in `after` as it was (a scored episode is never run
    again, nor lost); returns `after`."""
    for key, row in before.items():
        if after.get(key) != row:
            tally.lost_rows += 1
            tally.notes.append(f"round {tally.rounds}: {what} changed or lost the row of {key}")
    return after


def _check_left(client: docker.DockerClient, taskset: str, tally: ChaosTally) -> None:
    deadline = time.monotonic() + LEFT_GONE_S
    left = leftovers(client, taskset)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = leftovers(client, taskset)
    if left:
        tally.leaks += len(left)
        tally.notes.append(f"round {tally.rounds}: left after {LEFT_GONE_S:g} s: {left}")


def _rows_file(results: Path, taskset: str) -> Path:
    """The rows of the run a resume continues: the newest with a manifest."""
    runs = runs_of(results / "harbor" / "validation" / taskset)
    return (runs[0] if runs else results / "none") / "rollouts.jsonl"
