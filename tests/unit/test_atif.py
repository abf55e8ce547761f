"""The ATIF v1.7 subset: what a harness may return and the verifier reads."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from pytest_harbor.engine.trajectory import transcript
from pytest_harbor.harnesses.atif import (
    AgentInfo,
    Observation,
    ObservationResult,
    Step,
    ToolCall,
    Trajectory,
)
from pytest_harbor.harnesses.base import AgentRun
from pytest_harbor.tasks import Turn


def agent_step(step_id: int, call_id: str = "c1", answers: str = "c1") -> Step:
    return Step(
        step_id=step_id,
        source="agent",
        message="",
        tool_calls=[
            ToolCall(tool_call_id=call_id, function_name="bash", arguments={"command": "ls"})
        ],
        observation=Observation(results=[ObservationResult(source_call_id=answers, content="x")]),
    )


def test_a_trajectory_round_trips_as_json() -> None:
    trajectory = Trajectory(
        session_id="t__r0/episode",
        agent=AgentInfo(name="a", version="1"),
        steps=[Step(step_id=1, source="user", message="do it"), agent_step(2)],
    )
    data = json.loads(trajectory.to_bytes())
    assert data["schema_version"] == "ATIF-v1.7"
    assert "reasoning_content" not in data["steps"][1]  # unset fields stay out
    assert Trajectory.model_validate(data) == trajectory


def test_step_ids_run_from_one_without_gaps() -> None:
    with pytest.raises(ValidationError, match="step 2 has id 3"):
        Trajectory(
            agent=AgentInfo(name="a", version="1"),
            steps=[Step(step_id=1, source="user", message="x"), agent_step(3)],
        )


def test_an_observation_answers_a_call_of_its_own_step() -> None:
    with pytest.raises(ValidationError, match="answers 'c9'"):
        agent_step(1, answers="c9")


def test_only_agent_steps_carry_agent_fields() -> None:
    with pytest.raises(ValidationError, match="only an agent step may carry model_name"):
        Step(step_id=1, source="user", message="x", model_name="m")


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        Trajectory.model_validate(
            {"agent": {"name": "a", "version": "1"}, "steps": [], "mood": "good"}
        )


@pytest.mark.parametrize(
    "run",
    [
        AgentRun(exit_code=0),
        AgentRun(exit_code=None, timed_out=True),
        AgentRun(response='said "done" \u2713\n\tand \\ more'),
        AgentRun(),
    ],
)
def test_the_two_step_transcript_is_what_the_model_writes(run: AgentRun) -> None:
    """The engine writes the transcript of a harness that gives none without loading the
    model; the bytes are the model's own, and the model reads them back."""
    turn = Turn(
        name="episode",
        instruction="Make \u00e9 a file\nnamed x",
        solution_dir=None,
        tests_dirs=(),
        agent_timeout_sec=None,
        agent_user=None,
        verifier_timeout_sec=10,
        verifier_user=None,
    )
    written = transcript("ds/task/r0", "oracle", turn, run)
    parsed = Trajectory.model_validate_json(written)
    assert [step.source for step in parsed.steps] == ["user", "agent"]
    assert parsed.steps[0].message == turn.instruction
    assert parsed.to_bytes() == written
