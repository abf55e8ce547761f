"""fenced-bash: a complete pytest-harbor harness in one module.

Each turn it runs the ```bash blocks of the instruction, in order, in the sandbox, as the
agent user from the working directory, and stops at the first block that fails. It keeps a
log on the host, reports an ATIF trajectory with one step per block, and classifies its
failures the way the harness contract asks.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pytest_harbor.harnesses import (
    AgentFailure,
    AgentRun,
    Harness,
    HarnessOptionsError,
    SessionContext,
    Trajectory,
    TurnContext,
)
from pytest_harbor.harnesses.atif import (
    AgentInfo,
    Observation,
    ObservationResult,
    Step,
    ToolCall,
)

BLOCK = re.compile(r"```(?:bash|sh)\n(.*?)```", re.DOTALL)


class FencedBashHarness(Harness):
    """The harness: made once per process, with the `--harbor-agent-option` values."""

    name = "fenced-bash"

    def __init__(self, options: Mapping[str, Any]) -> None:
        unknown = set(options) - {"stop_on_error"}
        if unknown:
            raise HarnessOptionsError(
                f"fenced-bash takes stop_on_error only, not {sorted(unknown)}"
            )
        self.stop_on_error = bool(options.get("stop_on_error", True))

    def unavailable_reason(self, task: Any) -> str | None:
        # Items of a task this harness cannot work on are skipped with this reason.
        if not any(BLOCK.search(turn.instruction) for turn in task.turns):
            return "the instruction has no ```bash block"
        return None

    def open_session(self, context: SessionContext) -> FencedBashSession:
        # Set-up (installing tools, say) happens here, within harness_setup_allowance_s.
        return FencedBashSession(self)


class FencedBashSession:
    """One episode's session: runs turns, then is closed (always)."""

    def __init__(self, harness: FencedBashHarness) -> None:
        self.harness = harness

    def run_turn(self, context: TurnContext) -> AgentRun:
        log = context.logs.host_dir / "fenced-bash.log"
        steps = [Step(step_id=1, source="user", message=context.instruction)]
        last_exit = 0
        for number, block in enumerate(BLOCK.findall(context.instruction), start=1):
            if context.cancel.is_set():  # the deadline passed or the run was interrupted
                return AgentRun(timed_out=True, trajectory=_trajectory(context, steps))
            # context.sandbox cuts every command off at the turn's deadline.
            done = context.sandbox.exec(
                ["bash", "-c", block],
                user=context.agent_user,
                workdir=context.workdir,
                timeout=context.deadline.remaining(),
            )
            output = done.stdout + done.stderr
            with log.open("a") as handle:
                handle.write(f"$ block {number} exited {done.exit_code}\n{output}")
            call_id = f"block-{number}"
            steps.append(
                Step(
                    step_id=len(steps) + 1,
                    source="agent",
                    message=f"running block {number}",
                    tool_calls=[
                        ToolCall(
                            tool_call_id=call_id, function_name="bash", arguments={"command": block}
                        )
                    ],
                    observation=Observation(
                        results=[ObservationResult(source_call_id=call_id, content=output)]
                    ),
                )
            )
            if done.timed_out:
                return AgentRun(timed_out=True, trajectory=_trajectory(context, steps))
            last_exit = done.exit_code
            if done.exit_code != 0 and self.harness.stop_on_error:
                return AgentRun(
                    exit_code=done.exit_code,
                    trajectory=_trajectory(context, steps),
                    failure=AgentFailure(
                        cause="agent_crashed", message=f"block {number} exited {done.exit_code}"
                    ),
                )
        return AgentRun(
            exit_code=last_exit,
            response=f"ran {len(steps) - 1} block(s)",
            trajectory=_trajectory(context, steps),
        )

    def close(self, context: SessionContext) -> None:
        pass  # nothing held: a harness with a process or a connection lets it go here


def _trajectory(context: TurnContext, steps: list[Step]) -> Trajectory:
    return Trajectory(
        session_id=f"{context.episode_id}/{context.step}",
        agent=AgentInfo(name="fenced-bash", version="1.0.0"),
        steps=steps,
    )
