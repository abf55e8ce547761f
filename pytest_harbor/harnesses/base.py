"""The harness contract: how every agent (the oracle, a host-side agent, a CLI in the
sandbox) takes part in an episode.

An episode opens a session (`Harness.open_session`), runs one turn per step
(`HarnessSession.run_turn`) and closes it (`HarnessSession.close`, always called, also after
a failure or an interrupt). Each call runs in a thread of its own and gets a context: the
sandbox, the task, the turn, the deadline, a cancel signal, the model and where to put its
files. The engine enforces the deadline whatever the harness does: at the deadline it sets
`cancel`, the sandbox handed to the call stops working, and a call still running a few
seconds later is left behind while the episode goes on to verification.
"""

from __future__ import annotations

import difflib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pytest_harbor.agent_outcomes import AgentCause
from pytest_harbor.harnesses.mcp.access import McpAccess
from pytest_harbor.harnesses.model import ModelConfig
from pytest_harbor.sandboxes.base import ImageConfig, Sandbox, SandboxProvider
from pytest_harbor.tasks.task import Task, Turn

if TYPE_CHECKING:
    from pytest_harbor.harnesses.atif import Trajectory

__all__ = [
    "AGENT_LOGS",
    "ATIF_VERSION",
    "AgentFailure",
    "AgentLogs",
    "AgentRun",
    "AgentSetupError",
    "Deadline",
    "Harness",
    "HarnessFactory",
    "HarnessOptionsError",
    "HarnessSession",
    "ModelGate",
    "ModelGateSlot",
    "PreparesImage",
    "RecipeError",
    "SessionContext",
    "SpeaksModelApi",
    "TurnContext",
    "Usage",
    "no_options",
    "parse_options",
]

#: The trajectory format a harness returns and a verifier reads (harnesses/atif.py).
ATIF_VERSION: Final = "ATIF-v1.7"

#: The agent's own folder in the sandbox (kept across the turns of a multi-step task).
AGENT_LOGS = "/logs/agent"


@dataclass(frozen=True)
class Deadline:
    """A moment on the `time.monotonic()` clock by which a call must return."""

    at: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds)

    def remaining(self) -> float:
        """Seconds left, never below 0."""
        return max(0.0, self.at - time.monotonic())

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.at


@dataclass(frozen=True)
class AgentLogs:
    """Where a harness keeps its own files: `sandbox_dir` inside the sandbox (the verifier
    can read it), `host_dir` on this machine (kept with the run's results)."""

    sandbox_dir: str
    host_dir: Path

    def place(self, relative: str) -> Path:
        """`host_dir / relative`, its folders below `host_dir` made. `host_dir` itself is
        never made again: a harness that outlived its call (abandoned at a deadline or an
        interrupted run) may write only while the run still keeps its folder, and gets
        FileNotFoundError once the run has cleared it."""
        target = self.host_dir / relative
        folder = self.host_dir
        for part in Path(relative).parent.parts:
            folder = folder / part
            folder.mkdir(exist_ok=True)
        if not self.host_dir.is_dir():
            raise FileNotFoundError(f"{self.host_dir} is gone")
        return target


class ModelGateSlot(Protocol):
    def release(self) -> None: ...


class ModelGate(Protocol):
    """Caps the model requests in flight across every process of the run on this host."""

    def acquire(self, timeout: float) -> ModelGateSlot | None:
        """A place for one request (release it when the answer is in), or None when none
        came free within `timeout` seconds."""
        ...


@dataclass(frozen=True)
class SessionContext:
    """What every harness call gets. `sandbox` works only while the call lasts: take it
    from the context of each call, never keep it from an earlier one."""

    episode_id: str
    sandbox: Sandbox
    task: Task
    workdir: str | None
    agent_user: str | None
    model: ModelConfig | None
    logs: AgentLogs
    #: The call must return by then; `cancel` is set when it is time to stop early.
    deadline: Deadline
    cancel: threading.Event
    model_gate: ModelGate
    #: The task's MCP servers: those granted (`task_mcp_grants`) with their headers
    #: filled in, and those not (harnesses/mcp/access.py).
    mcp: McpAccess
    #: What the image the sandbox started from declares (its entrypoint, command,
    #: environment, labels, healthcheck), as the provider read it.
    image: ImageConfig = field(default_factory=ImageConfig, kw_only=True)


@dataclass(frozen=True)
class TurnContext(SessionContext):
    """A turn: the step to work on (its instruction, budgets, users) and its index."""

    turn: Turn
    index: int

    @property
    def instruction(self) -> str:
        return self.turn.instruction

    @property
    def step(self) -> str:
        return self.turn.name


class Usage(BaseModel):
    """Model usage: tokens, requests and, when the endpoint tells, cost; and the calls of
    MCP tools."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)
    requests: int = Field(default=0, ge=0)
    cost_usd: float | None = None
    #: The part of prompt_tokens read from the endpoint's prompt cache (left out of the row
    #: while there were none).
    cached_tokens: int = Field(default=0, ge=0, exclude_if=lambda count: not count)
    #: Calls of MCP tools (left out of the row while there were none).
    tool_calls: int = Field(default=0, ge=0, exclude_if=lambda count: not count)

    #: The largest count kept: an agent's log may claim a count of thousands of digits,
    #: which sums, formats and JSON writers refuse past Python's integer-string limit.
    MOST: ClassVar[int] = 2**63 - 1

    @field_validator(
        "prompt_tokens", "completion_tokens", "requests", "tool_calls", "cached_tokens"
    )
    @classmethod
    def _at_most(cls, count: int) -> int:
        return min(count, cls.MOST)

    def __add__(self, other: Usage) -> Usage:
        costs = [cost for cost in (self.cost_usd, other.cost_usd) if cost is not None]
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            requests=self.requests + other.requests,
            cost_usd=sum(costs) if costs else None,
            cached_tokens=self.cached_tokens + other.cached_tokens,
            tool_calls=self.tool_calls + other.tool_calls,
        )


@dataclass(frozen=True)
class AgentFailure:
    """Why a turn failed, classified; `agent_outcome_policy` decides what follows."""

    cause: AgentCause
    message: str
    #: The HTTP status of the model call that failed, when there was one.
    status_code: int | None = None
    #: The cause was read from what the sandbox produced (an in-sandbox agent's output),
    #: which the agent can write, or is one the agent can bring about (a root agent can
    #: end its sandbox's first process): a claim, not something the engine saw. A claimed cause
    #: is recorded, and the turn is verified and scored whatever `agent_outcome_policy`
    #: says (a retry would be a fresh try for the asking, no result a way out of the score).
    claimed: bool = False


@dataclass(frozen=True)
class AgentRun:
    """What a harness reports for one turn."""

    #: The agent's exit status (solve.sh's for the oracle; 0 when a host-side agent ended
    #: its turn itself).
    exit_code: int | None = None
    timed_out: bool = False
    #: The last lines of the agent's own log, shown when the turn fails.
    log_tail: str = ""
    #: The agent's final answer.
    response: str | None = None
    #: Every step of the turn; without one the engine writes a two-step transcript.
    trajectory: Trajectory | None = None
    usage: Usage | None = None
    failure: AgentFailure | None = None


class RecipeError(ValueError):
    """A CLI agent's recipe that cannot be used; names the file and the field."""


class AgentSetupError(Exception):
    """What the agent needs could not be set up (an install failed, say): the turn fails
    with `cause`, and `agent_outcome_policy` decides what follows."""

    def __init__(self, message: str, cause: AgentCause = "agent_crashed") -> None:
        super().__init__(message)
        self.cause: AgentCause = cause


class HarnessOptionsError(ValueError):
    """`--harbor-agent-option` values a harness does not take; names the key."""


class HarnessSession(Protocol):
    """One agent session: one turn per step (or, with `turn_sessions = continue`, every
    step of a multi-step task), then close."""

    def run_turn(self, context: TurnContext) -> AgentRun:
        """Work on `context.turn` in `context.sandbox` until done, `context.deadline` or
        `context.cancel`. Report failures as `AgentRun.failure`; an exception counts as
        `agent_crashed`."""
        ...

    def close(self, context: SessionContext) -> None:
        """Let go of the sandbox and anything the session holds; always called once."""
        ...


class Harness(Protocol):
    """A kind of agent. Subclass it to take the defaults below."""

    name: str
    #: True for the oracle: outcomes follow the validation contract (reward 1, exit 0).
    validates: ClassVar[bool] = False
    #: True for a harness that runs only the task's own code or the engine's (the oracle,
    #: `nop`, the author check's probe): nothing under evaluation shares a sandbox with
    #: the verifier's secrets, so a root one is not refused beside them.
    trusted: ClassVar[bool] = False
    #: Whether one session can carry on across the turns of a multi-step task.
    can_continue: ClassVar[bool] = False
    #: Whether the harness talks to a model (`--harbor-model` and `--harbor-model-url`).
    needs_model: ClassVar[bool] = False

    def unavailable_reason(self, task: Task) -> str | None:
        """Why this harness cannot run `task` (its items are skipped), or None."""
        return None

    def prepare_image(
        self, image: str, provider: SandboxProvider, labels: Mapping[str, str]
    ) -> str:
        """The image the agent's sandbox starts from: the task's `image` itself, or one
        made from it with what the agent needs (an install), labelled with `labels`.
        Called before the episode's clock starts, like the task's own build; raise
        AgentSetupError when it cannot be made."""
        return image

    def open_session(self, context: SessionContext) -> HarnessSession:
        """Set up for an episode (within `harness_setup_allowance_s`, not the agent's
        budget) and return the session that runs its turns."""
        ...


@runtime_checkable
class PreparesImage(Protocol):
    """A harness that starts its agent's sandbox from an image of its own (every harness
    subclassing Harness is one; the default keeps the task's image)."""

    def prepare_image(
        self, image: str, provider: SandboxProvider, labels: Mapping[str, str]
    ) -> str: ...


@runtime_checkable
class SpeaksModelApi(Protocol):
    """A harness whose agent talks to the model through an API other than chat
    completions (`responses`, `anthropic-messages`): the run's model check asks that."""

    model_api: str


#: How a harness is made from its name: called with `options`, the `--harbor-agent-option`
#: values (an empty dict when none were given). A class taking `options` will do.
HarnessFactory = Callable[..., Harness]


def no_options(name: str, options: Mapping[str, Any]) -> None:
    """For harnesses that take no options: refuse any."""
    if options:
        raise HarnessOptionsError(
            f"the {name} harness takes no options, got: {', '.join(sorted(options))}"
        )


OptionsModel = TypeVar("OptionsModel", bound=BaseModel)


def parse_options(
    model: type[OptionsModel], name: str, options: Mapping[str, Any] | None
) -> OptionsModel:
    """`options` read as `model`; HarnessOptionsError names the harness and the first bad
    key."""
    try:
        return model.model_validate(dict(options or {}))
    except ValidationError as error:
        first = error.errors()[0]
        key = ".".join(str(part) for part in first["loc"])
        if first["type"] == "extra_forbidden":
            known = sorted(model.model_fields)
            near = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
            hint = f"did you mean {near[0]}?" if near else f"it takes {', '.join(known)}"
            raise HarnessOptionsError(f"{name} has no option {key}; {hint}") from None
        message = first["msg"].removeprefix("Value error, ")
        raise HarnessOptionsError(f"{name} option {key}: {message}") from None
