"""Results from what ran: a turn's from its agent run and verification, an episode's from
its turns (rolled up by the task's strategy) and its clock."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_harbor.engine.context import EpisodeContext
from pytest_harbor.engine.failures import FailureKind
from pytest_harbor.engine.results import EpisodeResult, PhaseTimings, TurnResult, TurnTimings
from pytest_harbor.engine.rollup import RollUp, roll_up
from pytest_harbor.engine.verification import VerifierRun
from pytest_harbor.harnesses.base import AgentRun, Usage
from pytest_harbor.tasks import Turn

__all__ = ["TurnOutput", "episode_result", "turn_result"]


@dataclass(frozen=True)
class TurnOutput:
    """A turn's result, and the folder that holds what the verifier left in
    /logs/verifier (with the transcript it was given)."""

    result: TurnResult
    verifier_dir: Path

    @property
    def verifier_files(self) -> dict[str, bytes]:
        """The files of `verifier_dir` (read now: mind their size)."""
        if not self.verifier_dir.is_dir():
            return {}
        return {
            path.relative_to(self.verifier_dir).as_posix(): path.read_bytes()
            for path in sorted(self.verifier_dir.rglob("*"))
            if path.is_file()
        }


def turn_result(
    turn: Turn,
    agent: AgentRun,
    verification: VerifierRun,
    timings: TurnTimings,
    notes: Sequence[str],
    *,
    oracle: bool,
) -> TurnResult:
    """The turn's result: the verifier's finding, else the agent's failure, else (for the
    oracle) a solve.sh that exited non-zero."""
    reading = verification.reading
    kind, reason = reading.failure_kind, reading.failure_reason
    failure = agent.failure
    notes = list(notes)
    if failure is not None and failure.claimed:
        notes.append(
            f"the cause {failure.cause} is one the agent can bring about (read from the "
            "agent's own output, or a sandbox a root agent stopped): the turn was verified "
            "and scored"
        )
    if kind is None and failure is not None:
        kind, reason = FailureKind.for_agent_cause(failure.cause), failure.message
    elif failure is not None:
        # The verifier's finding is the turn's kind; the agent's failure stays on record.
        notes.append(f"the agent failed ({failure.cause}): {failure.message}")
    elif kind is None and oracle and agent.exit_code != 0:
        kind = FailureKind.SOLUTION_FAILED
        reason = f"solve.sh exited with code {agent.exit_code}"
    return TurnResult(
        step=turn.name,
        reward=reading.reward,
        verifier_rewards=reading.rewards,
        mask_sample=reading.masked,
        failure_kind=kind,
        failure_reason=reason,
        failure_cause=failure.cause if failure is not None else None,
        reward_file=reading.source,
        agent_exit_code=agent.exit_code,
        agent_timed_out=agent.timed_out,
        verifier_exit_code=verification.exit_code,
        verifier_timed_out=verification.timed_out,
        agent_log_tail=agent.log_tail,
        response=agent.response,
        usage=agent.usage,
        notes=notes,
        timings=timings,
    )


def _rolled(
    context: EpisodeContext,
    turns: Sequence[TurnResult],
    stopped_after: str | None,
    stop_reason: str | None,
) -> RollUp:
    """The turns rolled up by the task's strategy, over the declared steps with the strict
    roll-up (`multi_step_rollup = declared`), else over those that ran."""
    task = context.task
    strategy = task.config.multi_step_reward_strategy or "mean"
    strict = task.config.is_multi_step and context.settings.multi_step_rollup == "declared"
    declared = [turn.name for turn in task.turns] if strict else None
    return roll_up(turns, strategy, stopped_after, stop_reason, declared=declared)


def episode_result(
    context: EpisodeContext,
    turns: Sequence[TurnResult],
    *,
    attempts: int,
    spent: Sequence[Usage],
    stopped_after: str | None,
    stop_reason: str | None,
) -> EpisodeResult:
    """The result of the turns that ran: a single-step task's one turn, or a multi-step
    task's turns rolled up by its `multi_step_reward_strategy`. `spent` is the model usage
    of attempts given up for a retry."""
    task, clock, oracle = context.task, context.clock, context.harness.validates
    last = turns[-1]
    rolled = _rolled(context, turns, stopped_after, stop_reason)
    exit_codes = [turn.agent_exit_code for turn in turns]
    usages = [turn.usage for turn in turns if turn.usage is not None]
    causes = [turn.failure_cause for turn in turns if turn.failure_cause]
    phases = clock.phases
    return EpisodeResult(
        task_id=task.id,
        taskset=context.taskset,
        repeat=context.repeat,
        agent=context.harness.name,
        model=context.model.name if context.model else None,
        digest=task.digest,
        reward=rolled.reward,
        verifier_rewards=rolled.verifier_rewards,
        mask_sample=rolled.mask_sample,
        failure_kind=rolled.failure_kind,
        failure_reason=rolled.failure_reason,
        failure_cause=causes[-1] if causes else None,
        verifier_mode=rolled.verifier_mode,
        solution_exit_code=(
            next((code for code in exit_codes if code != 0), 0) if oracle else None
        ),
        response=last.response,
        usage=sum(usages[1:], usages[0]) if usages else None,
        retried_usage=sum(spent[1:], spent[0]) if spent else None,
        attempts=attempts,
        stopped_after_turn=stopped_after,
        started_at=clock.started_at,
        finished_at=clock.finished_at,
        timings=PhaseTimings(
            build_s=phases.get("build_s"),
            agent_install_s=phases.get("agent_install_s"),
            start_s=phases.get("start_s"),
            seed_s=phases.get("seed_s"),
            agent_s=sum(turn.timings.agent_s or 0.0 for turn in turns),
            verify_s=sum(turn.timings.verify_s or 0.0 for turn in turns),
            cleanup_s=phases.get("cleanup_s"),
            total_s=clock.total_s,
        ),
        turns=list(turns),
    )
