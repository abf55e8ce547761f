"""ATIF v1.7 trajectories: the strict subset a harness returns and a verifier reads.

Unknown fields are refused, step ids run from 1 without gaps, an observation answers a tool
call of its own step, and fields that only an agent step may carry stay off the others.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pytest_harbor import strict_json
from pytest_harbor.harnesses.base import ATIF_VERSION

__all__ = [
    "ATIF_VERSION",
    "AgentInfo",
    "FinalMetrics",
    "Observation",
    "ObservationResult",
    "Step",
    "StepMetrics",
    "ToolCall",
    "Trajectory",
]


class _Atif(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ToolCall(_Atif):
    tool_call_id: str
    function_name: str
    arguments: dict[str, Any]
    extra: dict[str, Any] | None = None


class ObservationResult(_Atif):
    source_call_id: str | None = None
    content: str | None = None
    extra: dict[str, Any] | None = None


class Observation(_Atif):
    results: list[ObservationResult]


class StepMetrics(_Atif):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    cost_usd: float | None = None
    extra: dict[str, Any] | None = None


class Step(_Atif):
    step_id: int = Field(ge=1)
    timestamp: str | None = None
    source: Literal["system", "user", "agent"]
    message: str
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    observation: Observation | None = None
    metrics: StepMetrics | None = None
    model_name: str | None = None
    reasoning_effort: str | None = None
    llm_call_count: int | None = Field(default=None, ge=0)
    extra: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Step:
        if self.source != "agent":
            agent_only = [
                name
                for name in (
                    "model_name",
                    "reasoning_effort",
                    "reasoning_content",
                    "tool_calls",
                    "metrics",
                )
                if getattr(self, name) is not None
            ]
            if agent_only:
                raise ValueError(
                    f"step {self.step_id}: only an agent step may carry {', '.join(agent_only)}"
                )
        if self.llm_call_count == 0 and (self.metrics or self.reasoning_content):
            raise ValueError(
                f"step {self.step_id}: llm_call_count 0 allows no metrics or reasoning_content"
            )
        if self.observation is not None:
            calls = {call.tool_call_id for call in self.tool_calls or ()}
            for result in self.observation.results:
                if result.source_call_id is not None and result.source_call_id not in calls:
                    raise ValueError(
                        f"step {self.step_id}: observation answers {result.source_call_id!r}, "
                        "which is no tool call of this step"
                    )
        return self


class AgentInfo(_Atif):
    name: str
    version: str
    model_name: str | None = None
    tool_definitions: list[dict[str, Any]] | None = None
    extra: dict[str, Any] | None = None


class FinalMetrics(_Atif):
    total_prompt_tokens: int | None = None
    total_completion_tokens: int | None = None
    total_cached_tokens: int | None = None
    total_cost_usd: float | None = None
    total_steps: int | None = None
    extra: dict[str, Any] | None = None


class Trajectory(_Atif):
    schema_version: Literal["ATIF-v1.7"] = ATIF_VERSION
    session_id: str | None = None
    agent: AgentInfo
    steps: list[Step] = Field(min_length=1)
    notes: str | None = None
    final_metrics: FinalMetrics | None = None
    extra: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _numbered(self) -> Trajectory:
        for expected, step in enumerate(self.steps, start=1):
            if step.step_id != expected:
                raise ValueError(
                    f"step ids must run 1, 2, 3, ...: step {expected} has id {step.step_id}"
                )
        return self

    def to_bytes(self) -> bytes:
        """The document as /logs/agent/trajectory.json holds it."""
        data = self.model_dump(mode="json", exclude_none=True)
        return (strict_json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode()
