"""Numbers over a run's episodes: each episode's status, mean reward, pass@k."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from math import comb
from typing import Literal

from pytest_harbor.engine.results import EpisodeResult
from pytest_harbor.harnesses.base import Usage
from pytest_harbor.strict_json import mean

__all__ = [
    "EpisodeStatus",
    "TasksetScore",
    "episode_passed",
    "episode_status",
    "pass_at_k",
    "pass_at_k_values",
    "score_taskset",
]

#: What became of one task and repeat. `no_result`: the episode produced nothing (its
#: failure is in rollouts_failures.jsonl); `skipped`: it never started (no solution for
#: the oracle, a task left out as unloadable); `not_run`: selected but never reached
#: (an interrupted run, say); `partial`: a row of the turns that ran, some steps of the
#: episode not selected (out of the score, like a masked one).
EpisodeStatus = Literal["passed", "failed", "masked", "partial", "no_result", "skipped", "not_run"]


def episode_passed(result: EpisodeResult, *, validation: bool, pass_reward: float) -> bool:
    """Whether a scored (unmasked) episode passes: for the oracle, every turn scored 1 and
    its solve.sh exited 0; for an agent, the episode's reward reaches `pass_reward`."""
    if validation:
        return all(turn.reward == 1.0 and turn.agent_exit_code == 0 for turn in result.turns)
    return result.reward >= pass_reward


def episode_status(result: EpisodeResult, *, validation: bool, pass_reward: float) -> EpisodeStatus:
    """The status of an episode with a row."""
    if result.mask_sample:
        return "masked"
    if result.partial:
        return "partial"
    return (
        "passed"
        if episode_passed(result, validation=validation, pass_reward=pass_reward)
        else ("failed")
    )


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k from `n` samples of which `c` passed:
    1 - C(n-c, k) / C(n, k). Needs 1 <= k <= n."""
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_at_k_values(repeats: int) -> list[int]:
    """k = 1, 2, 4, ... up to `repeats`."""
    values = []
    k = 1
    while k <= repeats:
        values.append(k)
        k *= 2
    return values


@dataclass
class TasksetScore:
    """The numbers the terminal and the run summary show for one taskset."""

    episodes: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    #: Mean reward over scored episodes (masked ones are out of the score).
    mean_reward: float | None = None
    failure_kinds: dict[str, int] = field(default_factory=dict)
    #: k -> pass@k per task (tasks with at least k scored episodes) ...
    pass_at_k_per_task: dict[int, dict[str, float]] = field(default_factory=dict)
    #: ... and its mean over those tasks.
    pass_at_k: dict[int, float] = field(default_factory=dict)
    #: Model tokens, requests and cost over every episode with a row, retried attempts
    #: included (None: no model was used) ...
    usage: Usage | None = None
    #: ... and per task.
    usage_per_task: dict[str, Usage] = field(default_factory=dict)

    def count(self, status: str) -> int:
        return self.statuses.get(status, 0)


def _spent(result: EpisodeResult) -> Usage | None:
    """What an episode's model calls took: its kept attempt's and its retried ones'."""
    usages = [usage for usage in (result.usage, result.retried_usage) if usage is not None]
    return sum(usages[1:], usages[0]) if usages else None


def score_taskset(
    episodes: Iterable[tuple[str, EpisodeStatus, EpisodeResult | None, str | None]],
    *,
    repeats: int,
) -> TasksetScore:
    """Score `(task_id, status, row or None, failure kind or None)` per episode."""
    score = TasksetScore()
    rewards: list[float] = []
    samples: dict[str, list[bool]] = {}
    for task_id, status, result, failure_kind in episodes:
        if status == "not_run":
            score.statuses[status] = score.statuses.get(status, 0) + 1
            continue
        score.episodes += 1
        score.statuses[status] = score.statuses.get(status, 0) + 1
        if failure_kind:
            score.failure_kinds[failure_kind] = score.failure_kinds.get(failure_kind, 0) + 1
        spent = None if result is None else _spent(result)
        if spent is not None:
            score.usage = spent if score.usage is None else score.usage + spent
            held = score.usage_per_task.get(task_id)
            score.usage_per_task[task_id] = spent if held is None else held + spent
        if result is not None and status in ("passed", "failed"):
            rewards.append(result.reward)
            samples.setdefault(task_id, []).append(status == "passed")
    if rewards:
        score.mean_reward = mean(rewards)
    if repeats > 1:
        for k in pass_at_k_values(repeats):
            per_task = {
                task_id: pass_at_k(len(passed), sum(passed), k)
                for task_id, passed in sorted(samples.items())
                if len(passed) >= k
            }
            if per_task:
                score.pass_at_k_per_task[k] = per_task
                score.pass_at_k[k] = mean(per_task.values())
    return score
