"""The `harbor` section from a run's report, without a run: the parts the acceptance tests
cannot reach cheaply (a taskset scored but never written, a failed report, the check's
table) and the order of everything it says."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pytest_harbor.plugin.checks import Problem
from pytest_harbor.plugin.summary import TerminalSummary
from pytest_harbor.redaction import Redactor
from pytest_harbor.relay import Counts, RunSpend
from pytest_harbor.run.metrics import TasksetScore

RESULTS = Path("/results")


class Reporter:
    """The terminal: each line written, and the sections begun, in order."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.config = SimpleNamespace(option=SimpleNamespace(keyword="", markexpr=""))

    def section(self, title: str) -> None:
        self.lines.append(f"== {title} ==")

    def write_line(self, line: str, **markup: bool) -> None:
        self.lines.append(line)


def report_of(scores: dict[str, TasksetScore], begun: set[str], **fields: Any) -> SimpleNamespace:
    """A run's report with `scores` per taskset, those in `begun` written to, and nothing
    else to say unless `fields` says it."""
    layout = SimpleNamespace(
        rollouts_file=lambda taskset: RESULTS / taskset / "rollouts.jsonl",
        summary_file=lambda taskset: RESULTS / taskset / "summary.json",
        report_file=lambda taskset: RESULTS / taskset / "report.html",
        taskset_dir=lambda taskset: RESULTS / taskset / "runs" / "this",
        root_dir=lambda taskset: RESULTS / taskset,
    )
    run = SimpleNamespace(
        redactor=Redactor(),
        layout=layout,
        options=SimpleNamespace(report_path=fields.pop("report_path", None), only_tasks=[]),
        harness=SimpleNamespace(validates=False),
        provider=None,
    )
    planned = SimpleNamespace(
        plans={},
        manifests=dict.fromkeys(scores),
        folder_notes=fields.pop("folder_notes", {}),
        reaped=0,
    )
    state = SimpleNamespace(
        run=run,
        planned=planned,
        ledger=SimpleNamespace(
            entries=lambda taskset: range(scores[taskset].episodes), score=scores.__getitem__
        ),
        writer=SimpleNamespace(begun=begun.__contains__),
        reports=fields.pop("reports", []),
        report_errors=fields.pop("report_errors", []),
        check=fields.pop("check", None),
        problems=fields.pop("problems", {}),
        check_files={},
        all_kept=False,
        kept=0,
        cut_short=0,
        unwritten=0,
        reaped=0,
        builds=SimpleNamespace(started=False),
        nothing_validatable=False,
        spend=fields.pop("spend", None),
    )
    assert not fields, f"unknown fields {fields}"
    return state


def section_of(state: SimpleNamespace) -> list[str]:
    reporter = Reporter()
    summary = TerminalSummary(state)  # type: ignore[arg-type]
    summary.pytest_terminal_summary(reporter)  # type: ignore[arg-type]
    return reporter.lines


def scored(episodes: int) -> TasksetScore:
    return TasksetScore(episodes=episodes, statuses={"passed": episodes}, mean_reward=1.0)


def test_a_run_that_ran_nothing_and_left_nothing_out_says_nothing() -> None:
    assert section_of(report_of({"a": TasksetScore()}, begun=set())) == []


def test_each_part_of_the_section_comes_in_its_place() -> None:
    state = report_of(
        {"a": scored(2), "b": scored(1), "c": TasksetScore()},
        begun={"a"},
        folder_notes={"a": ["a: the run in /results/a is now in /results/a/runs/old"]},
        reports=[RESULTS / "a" / "report.html", Path("/run.html")],
        report_path=Path("/run.html"),
        report_errors=["could not write the HTML report /x.html: OSError: full"],
        check=SimpleNamespace(repeats=2),
        problems={("a", "t"): [Problem("oracle-failed", "the run (r0): reward 0")]},
    )
    assert section_of(state) == [
        "== harbor ==",
        "a: 2 episodes, mean reward 1.000 (2 passed, 0 failed, 0 masked, 0 no result)",
        "  rows: /results/a/rollouts.jsonl",
        "  summary: /results/a/summary.json",
        "  report: /results/a/report.html",
        # Scored but never written: no files to name.
        "b: 1 episode, mean reward 1.000 (1 passed, 0 failed, 0 masked, 0 no result)",
        "a: the run in /results/a is now in /results/a/runs/old",
        "report: /run.html",
        "could not write the HTML report /x.html: OSError: full",
        "a: task check (oracle x2, nop and probe per task): 1 task(s), 1 with problems",
        "  task  problem        detail",
        "  t  oracle-failed  the run (r0): reward 0",
    ]


def test_the_runs_spend_ends_the_section_and_its_budget_says_it_stopped_the_run() -> None:
    counts = Counts(requests=3, prompt_tokens=900, completion_tokens=60, cost_usd=0.0123)
    spend = RunSpend(counts=counts)
    lines = section_of(report_of({"a": scored(1)}, begun={"a"}, spend=spend))
    assert lines[-1] == "model calls: 3, 900 prompt and 60 completion tokens, 0.0123 USD"
    stopped = RunSpend(
        counts=Counts(requests=1, unpriced=1), budget_reached="--harbor-max-tokens=5 reached"
    )
    lines = section_of(report_of({"a": scored(1)}, begun={"a"}, spend=stopped))
    assert lines[-2:] == [
        "model calls: 1, 0 prompt and 0 completion tokens, 0.0000 USD "
        "(+ 1 call(s) of a model the price table lacks)",
        "harbor: the run's budget stopped it: --harbor-max-tokens=5 reached; the episodes "
        "left without a result (harbor:budget_spent) run with --harbor-resume",
    ]
