"""shell-agent's turns against a scripted model server on 127.0.0.1 and a sandbox that
answers in the test: answers, tool calls, the step limit, failures, the deadline, MCP
servers that cannot be reached, and a continued session."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from pytest_harbor.engine.harness_calls import InProcessGate
from pytest_harbor.harnesses.base import AgentLogs, AgentRun, Deadline, TurnContext
from pytest_harbor.harnesses.mcp.access import NO_MCP, GrantedServer, McpAccess
from pytest_harbor.harnesses.model import ModelConfig
from pytest_harbor.harnesses.shell_agent import ShellAgentHarness
from pytest_harbor.sandboxes.base import ExecResult, SandboxError
from pytest_harbor.tasks import Task, load_task
from pytest_harbor.tasks.config import MCPServerConfig
from tests.fixtures import BASE_IMAGE
from tests.model_server import (
    MODEL,
    Script,
    ScriptedModel,
    answer,
    error,
    tool_call,
)


@dataclass
class CommandSandbox:
    """Runs nothing: records each command and answers as `act` says (exit 0 by default)."""

    act: Callable[[Sequence[str]], ExecResult] = lambda command: ExecResult(0, b"done\n")
    commands: list[tuple[str, str | None, str | None]] = field(default_factory=list)

    def exec(
        self,
        command: Sequence[str],
        *,
        user: str | None = None,
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        self.commands.append((command[-1].removeprefix("exec 2>&1\n"), user, workdir))
        return self.act(command)


@pytest.fixture
def task(tmp_path: Path) -> Task:
    folder = tmp_path / "task"
    (folder / "tests").mkdir(parents=True)
    (folder / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (folder / "instruction.md").write_text("Write hello.txt.\n")
    (folder / "task.toml").write_text(f'[environment]\ndocker_image = "{BASE_IMAGE}"\n')
    return load_task(folder)


def unreachable_server(mode: str) -> McpAccess:
    """A granted server: this test's sandbox cannot relay a connection to it."""
    config = MCPServerConfig.model_validate(
        {"name": "tools", "transport": "streamable-http", "url": "http://tools:8000/mcp"}
    )
    server = GrantedServer(config=config, headers={}, variables={})
    return McpAccess(mode=mode, granted=(server,))  # type: ignore[arg-type]


def context_for(
    server: ScriptedModel,
    task: Task,
    sandbox: CommandSandbox,
    *,
    index: int = 0,
    seconds: float = 30,
    cancel: threading.Event | None = None,
    mcp: McpAccess = NO_MCP,
) -> TurnContext:
    return TurnContext(
        episode_id="task__0",
        sandbox=sandbox,  # type: ignore[arg-type]
        task=task,
        workdir="/app",
        agent_user="agent",
        model=ModelConfig(name=MODEL, base_url=server.url, api_key=SecretStr(server.api_key)),
        logs=AgentLogs(sandbox_dir="/logs/agent", host_dir=Path("/nonexistent")),
        deadline=Deadline.after(seconds),
        cancel=cancel or threading.Event(),
        model_gate=InProcessGate(4),
        mcp=mcp,
        turn=task.turns[0],
        index=index,
    )


def run_turn(
    server: ScriptedModel,
    task: Task,
    sandbox: CommandSandbox | None = None,
    options: Mapping[str, Any] | None = None,
    **context: Any,
) -> AgentRun:
    harness = ShellAgentHarness({"backoff_base_s": 0, "max_request_attempts": 1, **(options or {})})
    turn = context_for(server, task, sandbox or CommandSandbox(), **context)
    return harness.open_session(turn).run_turn(turn)


def sources(run: AgentRun) -> list[str]:
    assert run.trajectory is not None
    return [step.source for step in run.trajectory.steps]


def test_an_answer_without_a_tool_call_ends_the_turn(
    serve: Callable[[Script], ScriptedModel], task: Task
) -> None:
    server = serve(lambda r: answer("all done"))
    run = run_turn(server, task)
    assert (run.exit_code, run.timed_out, run.response, run.failure) == (0, False, "all done", None)
    assert sources(run) == ["system", "user", "agent"]
    assert run.trajectory is not None and run.trajectory.notes is None
    assert server.requests[0].messages[0]["role"] == "system"
    assert server.requests[0].instructions == ["Write hello.txt.\n"]


def test_a_tool_call_runs_as_the_agent_user_and_its_output_is_sent_back(
    serve: Callable[[Script], ScriptedModel], task: Task
) -> None:
    server = serve(lambda r: tool_call("touch hello.txt") if r.number == 0 else answer("ok"))
    sandbox = CommandSandbox()
    run = run_turn(server, task, sandbox)
    assert sandbox.commands == [("touch hello.txt", "agent", "/app")]
    assert server.requests[1].tool_results == ["exit code: 0\ndone\n"]
    assert (run.exit_code, run.response) == (0, "ok")
    assert sources(run) == ["system", "user", "agent", "agent"]
    assert run.usage is not None and run.usage.requests == 2


def test_the_step_limit_ends_the_turn_without_an_answer_and_says_so(
    serve: Callable[[Script], ScriptedModel], task: Task
) -> None:
    server = serve(lambda r: tool_call("true"))
    run = run_turn(server, task, options={"max_steps": 2})
    assert (run.exit_code, run.response, run.failure) == (0, None, None)
    assert run.trajectory is not None
    assert run.trajectory.notes == "stopped after max_steps = 2 model responses"
    assert len(server.requests) == 2


def test_a_failing_endpoint_is_the_turns_failure(
    serve: Callable[[Script], ScriptedModel], task: Task
) -> None:
    server = serve(lambda r: error(400, "temperature must be below 2"))
    run = run_turn(server, task)
    assert run.failure is not None
    assert (run.failure.cause, run.failure.status_code) == ("api_error", 400)
    assert (run.exit_code, run.timed_out, run.response) == (None, False, None)


def test_a_cancelled_turn_times_out_and_answers_the_calls_it_never_ran(
    serve: Callable[[Script], ScriptedModel], task: Task
) -> None:
    cancel = threading.Event()

    def cancelling(command: Sequence[str]) -> ExecResult:
        cancel.set()
        return ExecResult(0)

    calls = [
        {"id": name, "type": "function", "function": {"name": "bash", "arguments": arguments}}
        for name, arguments in (("first", '{"command": "a"}'), ("second", '{"command": "b"}'))
    ]
    server = serve(lambda r: tool_call(calls=calls))
    harness = ShellAgentHarness({"max_request_attempts": 1})
    sandbox = CommandSandbox(cancelling)
    turn = context_for(server, task, sandbox, cancel=cancel)
    session = harness.open_session(turn)
    run = session.run_turn(turn)
    assert (run.exit_code, run.timed_out, run.failure) == (None, True, None)
    assert [command for command, _, _ in sandbox.commands] == ["a"]
    answered = [(m["tool_call_id"], m["content"]) for m in session.messages if m["role"] == "tool"]  # type: ignore[attr-defined]
    assert answered == [("first", "exit code: 0\n"), ("second", "not run: the turn ended")]


def test_a_sandbox_lost_before_the_deadline_is_raised(
    serve: Callable[[Script], ScriptedModel], task: Task
) -> None:
    def lost(command: Sequence[str]) -> ExecResult:
        raise SandboxError("the sandbox is gone")

    server = serve(lambda r: tool_call("true"))
    with pytest.raises(SandboxError, match="the sandbox is gone"):
        run_turn(server, task, CommandSandbox(lost))


def test_a_sandbox_lost_once_the_turn_is_cancelled_is_a_timeout(
    serve: Callable[[Script], ScriptedModel], task: Task
) -> None:
    cancel = threading.Event()

    def lost(command: Sequence[str]) -> ExecResult:
        cancel.set()
        raise SandboxError("the sandbox is gone")

    server = serve(lambda r: tool_call("true"))
    run = run_turn(server, task, CommandSandbox(lost), cancel=cancel)
    assert (run.exit_code, run.timed_out, run.failure) == (None, True, None)


@pytest.mark.parametrize(("index", "claimed"), [(0, False), (1, True)])
def test_a_required_mcp_server_that_cannot_connect_fails_the_turn_before_any_request(
    serve: Callable[[Script], ScriptedModel], task: Task, index: int, claimed: bool
) -> None:
    server = serve(lambda r: answer("never asked"))
    run = run_turn(server, task, mcp=unreachable_server("required"), index=index)
    assert run.failure is not None
    assert (run.failure.cause, run.failure.claimed) == ("tools_unavailable", claimed)
    assert run.failure.message == (
        "required MCP servers cannot be used: tools: this sandbox cannot relay connections"
    )
    assert (run.trajectory, server.requests) == (None, [])


def test_an_optional_mcp_server_that_cannot_connect_is_noted(
    serve: Callable[[Script], ScriptedModel], task: Task
) -> None:
    server = serve(lambda r: tool_call("true"))
    run = run_turn(server, task, options={"max_steps": 1}, mcp=unreachable_server("optional"))
    assert run.exit_code == 0 and run.trajectory is not None
    assert run.trajectory.notes == (
        "stopped after max_steps = 1 model responses; "
        "MCP servers not connected: tools: this sandbox cannot relay connections"
    )
    assert run.trajectory.final_metrics is not None
    assert run.trajectory.final_metrics.extra == {"mcp_tool_calls": 0}


def test_a_continued_session_sends_its_system_prompt_once(
    serve: Callable[[Script], ScriptedModel], task: Task
) -> None:
    server = serve(lambda r: answer("done"))
    harness = ShellAgentHarness({"system_prompt": "Be brief."})
    first = context_for(server, task, CommandSandbox())
    session = harness.open_session(first)
    session.run_turn(first)
    second = session.run_turn(context_for(server, task, CommandSandbox(), index=1))
    assert sources(second) == ["user", "agent"]
    roles = [m["role"] for m in server.requests[1].messages]
    assert roles == ["system", "user", "assistant", "user"]
    assert server.requests[1].messages[0]["content"] == "Be brief."


def test_each_session_sends_its_own_key_over_the_shared_connection_pool(task: Task) -> None:
    """In a run every episode holds a token of its own for the same model: a process's
    sessions share one pool, never the first session's key."""
    with ScriptedModel(lambda r: answer("ok"), api_key=None) as server:
        sent = _keys_sent(server, task)
    assert sent == ["Bearer hbr-first-episode", "Bearer hbr-second-episode"]


def _keys_sent(server: ScriptedModel, task: Task) -> list[str | None]:
    harness = ShellAgentHarness({"backoff_base_s": 0, "max_request_attempts": 1})
    sent: list[str | None] = []
    for token in ("hbr-first-episode", "hbr-second-episode"):
        turn = context_for(server, task, CommandSandbox())
        model = turn.model
        assert model is not None
        turn = dataclasses.replace(
            turn, model=model.model_copy(update={"api_key": SecretStr(token)})
        )
        harness.open_session(turn).run_turn(turn)
        sent.append(server.requests[-1].headers.get("Authorization"))
    assert len(harness._clients) == 1
    return sent
