"""The ATIF v1.7 subset: what a harness may return and the verifier reads."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from pytest_harbor.harnesses.atif import (
    AgentInfo,
    Observation,
    ObservationResult,
    Step,
    ToolCall,
    Trajectory,
)


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
