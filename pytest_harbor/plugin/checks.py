"""Check mode (`--harbor-check`): what the oracle's repeats and the empty agent say about
each task, gathered on the controller from the test reports, as one list of problems."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest

from pytest_harbor import strict_json
from pytest_harbor.engine import EpisodeResult, TurnResult
from pytest_harbor.engine.outcomes import probe_findings
from pytest_harbor.plugin.item_reports import harbor_data
from pytest_harbor.plugin.ledger import split_trial, trial_of
from pytest_harbor.plugin.nodes import NOP_TRIAL, PROBE_TRIAL, task_warnings
from pytest_harbor.plugin.payload import ReportPayload
from pytest_harbor.tasks import Task

__all__ = ["Problem", "TaskCheck", "TaskRecord"]

SCHEMA_VERSION = 1

#: An oracle run that takes more than this share of a timeout is flagged: a slower
#: machine, or a busier one, makes it fail.
SLOW_SHARE = 0.5

ProblemKind = Literal[
    "no-solution",
    "oracle-failed",
    "nop-passes",
    "flaky-verifier",
    "slow-oracle",
    "no-result",
    "load-warning",
    "refused",
    "probe-scores",
    "git-history",
    "answer-in-image",
    "early-stop-pays",
]


@dataclass(frozen=True)
class Problem:
    kind: ProblemKind
    detail: str

    def as_json(self) -> dict[str, str]:
        return {"kind": self.kind, "detail": self.detail}


@dataclass
class TaskRecord:
    """What the reports said of one task's trials."""

    #: Node ids of the task's items that ran (an --lf run picks them again).
    nodeids: set[str] = field(default_factory=set)
    #: Why the oracle could not run the task (no solution), when it could not.
    unvalidated: str | None = None
    #: The oracle's rows by repeat, and the empty agent's row.
    oracle: dict[int, EpisodeResult] = field(default_factory=dict)
    nop: EpisodeResult | None = None
    #: The probe's row (harnesses/probe.py).
    probe: EpisodeResult | None = None
    #: Trials that ended with no result: trial name -> `kind: reason`.
    lost: dict[str, str] = field(default_factory=dict)


class TaskCheck:
    """Fed every test report of a check run; lists the problems per task at its end."""

    def __init__(self, repeats: int) -> None:
        self.repeats = repeats
        #: `(taskset, task)` -> its record, for each task with an item that ran.
        self.records: dict[tuple[str, str], TaskRecord] = {}

    def add(self, report: pytest.TestReport) -> None:
        payload = harbor_data(report)
        taskset, task, trial_name = split_trial(trial_of(report.nodeid))
        if not task or not (trial_name in (NOP_TRIAL, PROBE_TRIAL) or trial_name[1:].isdigit()):
            return
        record = self.records.setdefault((taskset, task), TaskRecord())
        record.nodeids.add(report.nodeid)
        if report.when not in ("setup", "call", "teardown"):
            if report.failed:  # the worker died in this item
                record.lost[trial_name] = "worker_died: the process running the episode died"
            return
        if payload is None:
            return
        if report.when == "setup":
            if payload.unloadable is not None:
                record.lost[trial_name] = f"unloadable: {payload.unloadable}"
            elif payload.unvalidated and trial_name not in (NOP_TRIAL, PROBE_TRIAL):
                record.unvalidated = payload.skip_reason or "no solution"
            elif report.failed:
                record.lost[trial_name] = _failure_text(payload)
        elif report.when == "call":
            result = payload.result
            if result is not None:
                if trial_name == NOP_TRIAL:
                    record.nop = result
                elif trial_name == PROBE_TRIAL:
                    record.probe = result
                else:
                    record.oracle[int(trial_name[1:])] = result
            elif payload.status == "error":
                record.lost[trial_name] = _failure_text(payload)

    # ------------------------------------------------------------------------ findings

    def problems(
        self,
        tasks: Mapping[tuple[str, str], Task],
        refused: Mapping[tuple[str, str], str] | None = None,
    ) -> dict[tuple[str, str], list[Problem]]:
        """Every checked task's problems (an empty list for a task without any), and the
        task folders that did not load or were refused (`refused`: key -> why)."""
        found = {
            key: _task_problems(record, tasks.get(key)) for key, record in self.records.items()
        }
        for key, why in (refused or {}).items():
            found[key] = [Problem("refused", why)]
        return dict(sorted(found.items()))

    def write(
        self, path: Path, taskset: str, problems: Mapping[tuple[str, str], list[Problem]]
    ) -> Path:
        """`check.json` (the layout's check_file): the problems and rewards per task."""
        entries: dict[str, Any] = {}
        for (owner, task), found in problems.items():
            if owner != taskset:
                continue
            record = self.records.get((owner, task), TaskRecord())
            entries[task] = {
                "problems": [problem.as_json() for problem in found],
                "oracle_rewards": [record.oracle[r].reward for r in sorted(record.oracle)],
                "nop_reward": record.nop.reward if record.nop is not None else None,
                "probe_reward": record.probe.reward if record.probe is not None else None,
            }
        text = strict_json.dumps(
            {"schema_version": SCHEMA_VERSION, "repeats": self.repeats, "tasks": entries},
            indent=2,
        )
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(text + "\n")
        temporary.replace(path)
        return path

    def failed_nodeids(self, problems: Mapping[tuple[str, str], list[Problem]]) -> Iterable[str]:
        """The items of every task with a problem: `--lf` runs the whole task again."""
        for key, found in problems.items():
            if found and key in self.records:
                yield from sorted(self.records[key].nodeids)


def _failure_text(payload: ReportPayload) -> str:
    failure = payload.failure
    if failure is None:
        return "internal_error: no reason given"
    return f"{failure.kind}: {failure.reason}"


def _task_problems(record: TaskRecord, task: Task | None) -> list[Problem]:
    """A task's problems in the order the table lists them: what its folder and its
    trials left undone, then what the oracle's, the empty agent's and the probe's rows
    say."""
    scored = {repeat: row for repeat, row in sorted(record.oracle.items()) if not row.partial}
    found = _load_warnings(task) if task is not None else []
    found += _not_run(record)
    found += _oracle_failures(scored)
    found += _flaky(scored)
    if task is not None:
        found += _slow(scored, task)
    if task is not None:
        found += _early_stop_pays(task)
    found += _nop_passes(record.nop, task)
    if record.probe is not None and not record.probe.mask_sample:
        found += _probed(record.probe, {turn.step for turn in _passing_turns(record.nop)})
    return found


def _load_warnings(task: Task) -> list[Problem]:
    """What loading the task warned of, its paths relative to the task folder."""
    prefix = f"{task.path}{os.sep}"
    return [
        Problem("load-warning", str(warning).removeprefix(prefix))
        for warning in task_warnings(task)
    ]


def _not_run(record: TaskRecord) -> list[Problem]:
    """The oracle's refusal for want of a solution, and each trial that ended without a
    result."""
    found = [] if record.unvalidated is None else [Problem("no-solution", record.unvalidated)]
    for trial, reason in sorted(record.lost.items()):
        who = trial if trial in (NOP_TRIAL, PROBE_TRIAL) else f"oracle {trial}"
        found.append(Problem("no-result", f"{who}: {reason}"))
    return found


def _oracle_failures(scored: Mapping[int, EpisodeResult]) -> list[Problem]:
    """Each masked oracle run, then the failed ones grouped by what they scored (a
    reward below 1 or solve.sh's exit other than 0)."""
    found: list[Problem] = []
    failed: dict[str, list[str]] = {}
    for repeat, row in scored.items():
        if row.mask_sample:
            found.append(Problem("no-result", f"oracle r{repeat}: masked: {row.failure_reason}"))
        elif row.reward != 1.0 or row.solution_exit_code != 0:
            failed.setdefault(_scored(row), []).append(f"r{repeat}")
    for text, repeats in failed.items():
        runs = f"{len(repeats)} of {len(scored)} runs" if len(scored) > 1 else "the run"
        found.append(Problem("oracle-failed", f"{runs} ({', '.join(repeats)}): {text}"))
    return found


def _early_stop_pays(task: Task) -> list[Problem]:
    """Ungated middle steps of a task rolled up by `mean`: an agent that passes the steps
    before one and then breaks its verifier (no valid reward stops the episode) keeps the
    mean of fewer turns, more than one that fails it honestly and scores 0 on the rest.
    The first step has nothing before it to keep, the last nothing after it to lose, and
    a step with a `min_reward` above 0 stops an honest failure as well."""
    steps = task.config.steps or []
    if (task.config.multi_step_reward_strategy or "mean") != "mean" or len(steps) < 3:
        return []
    gated = [_gates(step.min_reward) for step in steps]
    ungated = [index for index in range(1, len(steps) - 1) if not gated[index]]
    if not ungated:
        return []
    # The first of them: breaking it keeps the mean of the turns before it and its own 0;
    # failing it honestly adds the zeros of the turns up to the next gate (or the end).
    first = ungated[0]
    end = next((index for index in range(first + 1, len(steps)) if gated[index]), len(steps) - 1)
    names = ", ".join(steps[index].name for index in ungated)
    many = len(ungated) > 1
    return [
        Problem(
            "early-stop-pays",
            f"step{'s' if many else ''} {names} of {len(steps)} {'have' if many else 'has'} "
            "no min_reward under the mean roll-up: breaking the verifier of "
            f"{steps[first].name} after passing the steps before scores "
            f"{first / (first + 1):.2g}, failing it honestly {first / (end + 1):.2g}",
        )
    ]


def _gates(min_reward: float | dict[str, float] | None) -> bool:
    """Whether a turn scoring 0 misses `min_reward`, and so stops the episode."""
    if isinstance(min_reward, dict):
        return any(threshold > 0 for threshold in min_reward.values())
    return min_reward is not None and min_reward > 0


def _passing_turns(row: EpisodeResult | None) -> list[TurnResult]:
    """The turns of the empty agent's row that scored full marks."""
    return [turn for turn in row.turns if turn.reward >= 1.0] if row is not None else []


def _nop_passes(row: EpisodeResult | None, task: Task | None) -> list[Problem]:
    """An empty agent whose sandbox the verifier accepts (named by step where the task has
    steps, or is not known); a masked row says nothing."""
    if row is None or row.mask_sample:
        return []
    passing = _passing_turns(row)
    if not passing:
        return []
    steps = ", ".join(turn.step for turn in passing)
    where = f" in step {steps}" if task is None or task.config.is_multi_step else ""
    return [
        Problem(
            "nop-passes",
            f"an agent that does nothing scores {passing[0].reward:g}{where}: "
            "the verifier accepts the sandbox as the task leaves it",
        )
    ]


def _probed(row: EpisodeResult, nop_passes: set[str]) -> list[Problem]:
    """What the probe found: a score for files that merely exist (in a step the empty
    agent did not pass already: `nop_passes`), a git history, the solution's or tests'
    text in the image."""
    found: list[Problem] = []
    created = [
        name for turn in row.turns for name in probe_findings(turn.response).get("created", [])
    ]
    scoring = [turn for turn in row.turns if turn.reward > 0.0 and turn.step not in nop_passes]
    # Having created nothing, it is the empty agent: nop-passes says that already.
    if scoring and created:
        names = ", ".join(created[:5]) + (" ..." if len(created) > 5 else "")
        found.append(
            Problem(
                "probe-scores",
                f"an agent creating only {names} scores {scoring[0].reward:g}"
                + (f" in step {scoring[0].step}" if len(row.turns) > 1 else "")
                + ": the verifier checks that files exist, not what they hold",
            )
        )
    first = probe_findings(row.turns[0].response) if row.turns else {}
    if first.get("git"):
        found.append(
            Problem(
                "git-history",
                f"{', '.join(map(str, first['git']))}: a git history an agent can read "
                "(a fix, an answer, the tests' origin)",
            )
        )
    image = [entry for entry in first.get("image", []) if isinstance(entry, dict)]
    if image:
        shown = "; ".join(f"{entry.get('file')} holds `{entry.get('text')}`" for entry in image[:3])
        more = f" (and {len(image) - 3} more files)" if len(image) > 3 else ""
        found.append(
            Problem(
                "answer-in-image",
                f"the image holds text of the task's solution/ or tests/: {shown}{more}",
            )
        )
    return found


def _scored(row: EpisodeResult) -> str:
    text = f"reward {row.reward:g}, solve.sh exit {row.solution_exit_code}"
    if row.failure_kind:
        text += f" ({row.failure_kind}: {row.failure_reason})"
    return text


def _flaky(rows: Mapping[int, EpisodeResult]) -> list[Problem]:
    """Rewards that differ across the oracle's repeats, step by step."""
    unmasked = [row for row in rows.values() if not row.mask_sample]
    if len(unmasked) < 2:
        return []
    by_step: dict[str, list[float]] = {}
    for row in unmasked:
        for turn in row.turns:
            by_step.setdefault(turn.step, []).append(turn.reward)
    found = []
    for step, rewards in by_step.items():
        if len(set(rewards)) > 1:
            where = "" if len(by_step) == 1 else f"step {step}: "
            found.append(
                Problem(
                    "flaky-verifier",
                    f"{where}rewards differ across {len(rewards)} oracle runs: "
                    + ", ".join(f"{reward:g}" for reward in rewards),
                )
            )
    return found


def _slow(rows: Mapping[int, EpisodeResult], task: Task) -> list[Problem]:
    """The slowest oracle run of each step against the step's timeouts."""
    turns = {turn.name: turn for turn in task.turns}
    found = []
    for step, turn in turns.items():
        runs = [t for row in rows.values() for t in row.turns if t.step == step]
        where = "" if len(turns) == 1 else f"step {step}: "
        for phase, budget, name in (
            ("agent_s", turn.agent_timeout_sec, "solve.sh"),
            ("verify_s", turn.verifier_timeout_sec, "the verifier"),
        ):
            spent = [getattr(t.timings, phase) or 0.0 for t in runs]
            if budget and spent and max(spent) > SLOW_SHARE * budget:
                found.append(
                    Problem(
                        "slow-oracle",
                        f"{where}{name} took {max(spent):.1f} s of its {budget:g} s timeout",
                    )
                )
    return found
