"""An episode's time budget, sized from its task and the run settings.

Per turn, once the sandbox is ready: a step's set-up script and healthcheck + harness
set-up allowance + agent budget + 30 s per collect hook + verifier timeout + verifier grace
(+ the start of a sandbox to verify in: a separate verifier's, or the snapshot's with
`verify_from_snapshot`).
The *nominal* episode adds one sandbox start; the *worst case* adds one start, and its
cleanup as grace, per image-pull attempt (`image_pull_retries + 1`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_harbor.engine.failures import EpisodeError, FailureKind
from pytest_harbor.engine.rewards import REWARD_FILES
from pytest_harbor.sandboxes.copies import (
    ARTIFACTS_COPY,
    ARTIFACTS_RESULTS_COPY,
    REWARD_FILE_COPY,
    VERIFIER_FOLDER_COPY,
)
from pytest_harbor.settings import HarborSettings
from pytest_harbor.tasks import Task, Turn
from pytest_harbor.tasks.config import HealthcheckConfig

__all__ = [
    "BACKSTOP_MARGIN_S",
    "HOOK_ALLOWANCE_S",
    "EpisodeBudget",
    "backstop_seconds",
    "episode_budget",
    "healthcheck_seconds",
    "setup_seconds",
]

#: What the budget counts for each `[[verifier.collect]]` hook.
HOOK_ALLOWANCE_S = 30.0
#: What the backstop adds on top of everything an episode may legitimately take.
BACKSTOP_MARGIN_S = 60.0


@dataclass(frozen=True)
class EpisodeBudget:
    """Seconds: what the turns need, the nominal and worst-case episode, and the deadline.

    The figures are None when a turn has no agent budget (`[agent].timeout_sec` unset):
    such an episode is bounded by `default_episode_timeout_seconds` alone.
    """

    turns_s: float | None
    nominal_s: float | None
    worst_s: float | None
    deadline_s: float
    warning: str | None = None


def episode_budget(
    task: Task, settings: HarborSettings, *, separate_verifier: bool
) -> EpisodeBudget:
    """Size the episode; raise EpisodeError when enforcement is off and it cannot fit."""
    default = settings.default_episode_timeout_seconds
    turns = _turns_seconds(task, settings, separate_verifier)
    if turns is None:
        return EpisodeBudget(None, None, None, deadline_s=default)
    start = settings.sandbox_ready_timeout_s
    nominal = turns + start
    worst = turns + (start + settings.cleanup_timeout_seconds) * (settings.image_pull_retries + 1)
    figures = f"turns {turns:g} s, nominal episode {nominal:g} s, worst case {worst:g} s"
    if settings.enforce_task_timeouts:
        warning = None
        if worst > default:
            warning = (
                f"{task.id}: the episode budget is above default_episode_timeout_seconds = "
                f"{default:g} s ({figures}); the episode deadline follows the worst case"
            )
        return EpisodeBudget(turns, nominal, worst, deadline_s=worst, warning=warning)
    if nominal > default:
        raise EpisodeError(
            FailureKind.BUDGET_REFUSED,
            f"{task.id} does not fit default_episode_timeout_seconds = {default:g} s with "
            f"enforce_task_timeouts off ({figures}): raise default_episode_timeout_seconds to "
            f"at least {nominal:g} s, or {worst:g} s to cover a retried seed, or turn "
            "enforce_task_timeouts on",
        )
    warning = None
    if worst > default:
        warning = (
            f"{task.id}: fits default_episode_timeout_seconds = {default:g} s only without a "
            f"retried seed ({figures}); an episode whose seed retries its image pulls may "
            "time out"
        )
    return EpisodeBudget(turns, nominal, worst, deadline_s=default, warning=warning)


def _turns_seconds(task: Task, settings: HarborSettings, separate_verifier: bool) -> float | None:
    total = 0.0
    hooks = HOOK_ALLOWANCE_S * len(task.config.verifier.collect)
    for turn in task.turns:
        if turn.agent_timeout_sec is None:
            return None
        total += (
            setup_seconds(turn, settings)
            + (healthcheck_seconds(turn.healthcheck) if turn.healthcheck else 0.0)
            + settings.harness_setup_allowance_s
            + turn.agent_timeout_sec
            + hooks
            + turn.verifier_timeout_sec
            + settings.verifier_grace_s
            # A second sandbox to verify in: a separate verifier, or the snapshot's.
            + (
                settings.sandbox_ready_timeout_s
                if separate_verifier or settings.verify_from_snapshot
                else 0.0
            )
        )
    return total


def setup_seconds(turn: Turn, settings: HarborSettings) -> float:
    """The bound on a step's `workdir/setup.sh`: `step_setup_timeout_s`, else the step's
    agent budget; 0 without a script (a turn with neither bound has no budget at all)."""
    if turn.setup_script is None:
        return 0.0
    return settings.step_setup_timeout_s or turn.agent_timeout_sec or 0.0


def healthcheck_seconds(check: HealthcheckConfig) -> float:
    """The longest a healthcheck may take before it fails: its start period, then
    `retries` probes and the pauses between them."""
    return check.start_period_sec + check.retries * (check.timeout_sec + check.interval_sec)


def backstop_seconds(task: Task, settings: HarborSettings, *, separate_verifier: bool) -> float:
    """The longest a pytest item of the task may run before the backstop stops it: the
    image builds, the wait for a place under the cap, the episode deadline and its cleanup
    (once more, with the pause before it, for each retry `agent_outcome_policy` may make)
    and a margin. The engine's own deadlines end an episode well before. The copies out of
    each verification count here at their caps, not in the deadline (which follows the
    seed's budget): a copy at its cap must never end an episode without a result."""
    try:
        deadline = episode_budget(task, settings, separate_verifier=separate_verifier).deadline_s
    except EpisodeError:
        deadline = settings.default_episode_timeout_seconds  # refused at seed, at once
    builds = task.config.environment.build_timeout_sec * (2 if separate_verifier else 1)
    retrying = settings.agent_outcome_policy.most_retries
    attempts = 1 + (retrying.retries if retrying else 0)
    copies = _copies_seconds(task, separate_verifier)
    return (
        builds
        + (settings.queue_timeout_seconds or 0.0)
        + (deadline + copies + settings.cleanup_timeout_seconds) * attempts
        + (retrying.total_backoff_s if retrying else 0.0)
        + BACKSTOP_MARGIN_S
    )


def _copies_seconds(task: Task, separate_verifier: bool) -> float:
    """The longest the copies of each turn's verification may take at their caps: the
    reward files, then /logs/verifier; the artifacts before them for a separate one."""
    per_turn = (
        len(REWARD_FILES) * REWARD_FILE_COPY.seconds
        + VERIFIER_FOLDER_COPY.seconds
        + ARTIFACTS_RESULTS_COPY.seconds  # the turn's artifacts, copied out for the results
    )
    if separate_verifier:
        per_turn += ARTIFACTS_COPY.seconds
    return per_turn * len(task.turns)
