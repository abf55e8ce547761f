"""A run's model spend in its summary and its report: per task and in all, the attempts
given up for a retry counted with the kept ones."""

from __future__ import annotations

from pytest_harbor.engine import EpisodeResult, TurnResult
from pytest_harbor.harnesses.base import Usage
from pytest_harbor.report.spend import spend_table
from pytest_harbor.run.metrics import score_taskset


def _row(task: str, repeat: int, usage: Usage | None, retried: Usage | None) -> EpisodeResult:
    return EpisodeResult(
        task_id=task,
        taskset="ts",
        repeat=repeat,
        agent="claude-code",
        reward=1.0,
        usage=usage,
        retried_usage=retried,
        turns=[TurnResult(step="episode", reward=1.0)],
    )


def test_the_spend_of_a_task_holds_its_retried_attempts_too() -> None:
    rows = [
        _row("a", 0, Usage(prompt_tokens=100, requests=2, cost_usd=0.5), None),
        _row("a", 1, Usage(prompt_tokens=10, requests=1, cost_usd=0.25), Usage(requests=3)),
        _row("b", 0, Usage(completion_tokens=7, requests=1, cost_usd=None), None),
        _row("c", 0, None, None),
    ]
    score = score_taskset(((row.task_id, "passed", row, None) for row in rows), repeats=2)
    assert score.usage_per_task["a"] == Usage(prompt_tokens=110, requests=6, cost_usd=0.75)
    assert score.usage_per_task["b"].cost_usd is None
    assert "c" not in score.usage_per_task
    assert score.usage is not None and score.usage.requests == 7


def test_the_report_shows_each_tasks_spend_and_says_what_is_unpriced() -> None:
    summary = {
        "usage_per_task": {
            "a": {"requests": 6, "prompt_tokens": 110, "completion_tokens": 0, "cost_usd": 0.75},
            "b<script>": {"requests": 1, "prompt_tokens": 0, "cost_usd": None},
        }
    }
    html = spend_table(summary)
    assert "<h3>Model spend</h3>" in html
    assert '<td data-sort="0.75">0.7500</td>' in html
    assert "unpriced" in html
    assert "b&lt;script&gt;" in html and "<script>" not in html
    assert spend_table({}) == ""
    assert spend_table({"usage_per_task": "not a table"}) == ""
