"""`shell-agent`: a host-side agent on any OpenAI-compatible Chat Completions endpoint.

It offers the model one function tool, `bash`, runs each call in the sandbox as the agent
user from the working directory, and sends back the exit code and the output. A reply
without a tool call ends the turn. With `turn_sessions = continue` it keeps its messages
across the turns of a multi-step task.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from pytest_harbor.harnesses.atif import (
    AgentInfo,
    FinalMetrics,
    Observation,
    ObservationResult,
    Step,
    StepMetrics,
    ToolCall,
    Trajectory,
)
from pytest_harbor.harnesses.base import (
    AgentFailure,
    AgentRun,
    Harness,
    HarnessSession,
    SessionContext,
    TurnContext,
    Usage,
    parse_options,
)
from pytest_harbor.harnesses.chat import (
    ChatClient,
    ChatError,
    ChatReply,
    OutOfTime,
    RetryPolicy,
    UsageMeter,
)
from pytest_harbor.harnesses.model import ModelConfig
from pytest_harbor.harnesses.model_request import RequestShape
from pytest_harbor.redaction import Redactor
from pytest_harbor.sandboxes.base import SandboxError
from pytest_harbor.sandboxes.pipes import OpensPipes, Pipe
from pytest_harbor.untrusted import load_json

if TYPE_CHECKING:
    from pytest_harbor.harnesses.mcp.client import McpTools

__all__ = ["BASH_TOOL", "ShellAgentHarness", "ShellAgentOptions", "cut_output"]

BASH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": (
            "Run a shell command in the sandbox with bash and return its exit code and "
            "output (stdout and stderr together)."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The command to run."},
                "timeout_sec": {
                    "type": "integer",
                    "description": "Seconds after which the command is killed.",
                },
            },
            "required": ["command"],
        },
    },
}

_SYSTEM_PROMPT = """\
You are an agent working in a Linux sandbox to complete the task the user gives you.

You have one tool, `bash`. It runs a shell command in the sandbox{user} from {workdir} and \
returns its exit code and its output (stdout and stderr together; output longer than \
{cap} bytes is cut in the middle). Every command runs in a fresh shell: files persist, \
`cd` and variables do not. Commands must not wait for input. A command is killed after \
{timeout:g} seconds unless you pass a different `timeout_sec`.

{mcp}Work step by step: look around, make the changes, check your work. When the task is done, \
reply with a short summary and no tool call; that ends your turn."""


_MCP_PROMPT = """\
You also have the tools of the task's MCP servers, named `mcp__<server>__<tool>`: call them \
as their descriptions say; each answers with its result as text.

"""
#: The longest a turn waits for its MCP servers to connect.
_CONNECT_S = 30.0
#: What the model is sent for an MCP tool's answer with no text.
EMPTY_ANSWER = "(the tool answered with no text)"


class ShellAgentOptions(BaseModel):
    """The `--harbor-agent-option` keys shell-agent takes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Model responses per turn before the turn ends without an answer.
    max_steps: int = Field(default=100, ge=1)
    #: A command's timeout when the model gives none (never past the agent's deadline).
    command_timeout_sec: float = Field(default=120.0, gt=0)
    #: The most output bytes a tool message holds (its head and tail are kept).
    max_output_bytes: int = Field(default=16384, ge=256)
    #: Tries of one model request (429, 5xx and connection errors are tried again).
    max_request_attempts: int = Field(default=6, ge=1)
    #: The first pause between tries (doubling up to `backoff_max_s`), unless the endpoint
    #: sends `Retry-After`.
    backoff_base_s: float = Field(default=1.0, ge=0)
    backoff_max_s: float = Field(default=60.0, ge=0)
    #: One request's longest wait for an answer.
    request_timeout_sec: float = Field(default=600.0, gt=0)
    #: Replaces the built-in system prompt.
    system_prompt: str | None = None


def _package_version() -> str:
    try:
        return version("pytest-harbor")
    except PackageNotFoundError:
        return "0"


class ShellAgentHarness(Harness):
    """The host-side shell agent (see the module's docstring)."""

    name = "shell-agent"
    can_continue: ClassVar[bool] = True
    needs_model: ClassVar[bool] = True
    #: What the run's pre-flight sends: a request as _Turn._ask() makes them.
    model_request: ClassVar[RequestShape] = RequestShape(
        "chat-completions", tools=(BASH_TOOL,), with_params=True
    )

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options = parse_options(ShellAgentOptions, "shell-agent", options)
        self._clients: dict[str, ChatClient] = {}
        self._lock = threading.Lock()

    def open_session(self, context: SessionContext) -> HarnessSession:
        if context.model is None:
            raise ValueError("shell-agent needs a model (--harbor-model and --harbor-model-url)")
        return _ShellSession(self, self._client(context.model), context.model)

    def _client(self, model: ModelConfig) -> ChatClient:
        """One connection pool per model per process, shared by its sessions (each sends
        its own key: in a run, the token of its episode)."""
        key = json.dumps(model.identity(), sort_keys=True)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                client = self._clients[key] = ChatClient(
                    model,
                    retry=RetryPolicy(
                        attempts=self.options.max_request_attempts,
                        base_s=self.options.backoff_base_s,
                        max_s=self.options.backoff_max_s,
                    ),
                    request_timeout_s=self.options.request_timeout_sec,
                    redactor=Redactor(model.secret_values()),
                )
            return client


class _ShellSession:
    """The messages of one session and the loop of each turn."""

    def __init__(self, harness: ShellAgentHarness, client: ChatClient, model: ModelConfig) -> None:
        self.options = harness.options
        self.client = client
        #: The model as the session was given it: its key is the session's own.
        self.model = model
        self.messages: list[dict[str, Any]] = []

    def close(self, context: SessionContext) -> None:
        self.messages = []

    def run_turn(self, context: TurnContext) -> AgentRun:
        turn = _Turn(self, context)
        return turn.run()


class _Turn:
    """One turn: ask, run the tool calls, ask again, until an answer, the step limit, the
    deadline or a failure."""

    def __init__(self, session: _ShellSession, context: TurnContext) -> None:
        self.session = session
        self.context = context
        self.options = session.options
        self.model = session.model
        self.meter = UsageMeter()
        self.steps: list[Step] = []
        self.tools: McpTools | None = None
        self.tool_calls = 0

    def run(self) -> AgentRun:
        if self.context.mcp.granted:
            self.tools = _connect(self.context, Redactor(self.context.mcp.secrets))
        try:
            return self._run()
        finally:
            if self.tools is not None:
                self.tools.close()

    def _run(self) -> AgentRun:
        unusable = self._required_tools_unusable()
        if unusable is not None:
            return AgentRun(failure=unusable)
        self._begin()
        answer: str | None = None
        failure: AgentFailure | None = None
        timed_out = False
        notes = None
        try:
            answer, stopped = self._converse()
            notes = self._notes(stopped)
        except ChatError as error:
            failure = AgentFailure(error.cause, error.message, error.status_code)
        except OutOfTime:
            timed_out = True
        except SandboxError:
            if not (self.context.cancel.is_set() or self.context.deadline.expired):
                raise
            timed_out = True
        self._answer_pending_calls()
        usage = self.meter.usage + Usage(tool_calls=self.tool_calls)
        return AgentRun(
            exit_code=0 if failure is None and not timed_out else None,
            timed_out=timed_out,
            response=answer,
            trajectory=self._trajectory(usage, notes),
            usage=usage,
            failure=failure,
        )

    def _required_tools_unusable(self) -> AgentFailure | None:
        """The turn's failure when `task_mcp_grants = required` and a granted server did
        not connect; no model request is made then."""
        tools = self.tools
        if tools is None or not tools.failures or not self.context.mcp.required:
            return None
        message = f"required MCP servers cannot be used: {_failures(tools)}"
        # After a first turn the agent has had the sandbox (and the servers): a claim.
        claimed = self.context.index > 0
        return AgentFailure("tools_unavailable", message, claimed=claimed)

    def _begin(self) -> None:
        """The system prompt, once per session, then the turn's instruction."""
        messages = self.session.messages
        if not messages:
            prompt = self.options.system_prompt or self._system_prompt()
            messages.append({"role": "system", "content": prompt})
            self._step("system", prompt)
        messages.append({"role": "user", "content": self.context.instruction})
        self._step("user", self.context.instruction)

    def _converse(self) -> tuple[str | None, str | None]:
        """Ask and run the tool calls until a reply without any: its text is the answer.
        Without one after `max_steps` replies, the answer is None and the note says why."""
        for _ in range(self.options.max_steps):
            reply = self._ask()
            calls = self._keep_reply(reply)
            content = reply.message.get("content")
            text = content if isinstance(content, str) else ""
            if not calls:
                self._step("agent", text, usage=reply.usage)
                return text, None
            self._act(text, calls, reply.usage)
        return None, f"stopped after max_steps = {self.options.max_steps} model responses"

    def _keep_reply(self, reply: ChatReply) -> list[Any]:
        """Add the reply to the session's messages; its tool calls, each with an id."""
        messages = self.session.messages
        calls = _with_ids(reply.message.get("tool_calls"), f"call_{len(messages)}")
        said: dict[str, Any] = {"role": "assistant", "content": reply.message.get("content")}
        if calls:
            said["tool_calls"] = calls
        messages.append(said)
        return calls

    def _notes(self, stopped: str | None) -> str | None:
        """The trajectory's notes: why the turn stopped without an answer, and the granted
        MCP servers that did not connect."""
        notes = [stopped] if stopped else []
        if self.tools is not None and self.tools.failures:
            notes.append(f"MCP servers not connected: {_failures(self.tools)}")
        return "; ".join(notes) or None

    def _answer_pending_calls(self) -> None:
        """Tool calls the turn ended before running get an answer, so a continued session
        sends the endpoint a well-formed history."""
        messages = self.session.messages
        last = max(
            (i for i, message in enumerate(messages) if message["role"] == "assistant"),
            default=None,
        )
        if last is None:
            return
        answered = {m.get("tool_call_id") for m in messages[last + 1 :] if m["role"] == "tool"}
        for number, call in enumerate(messages[last].get("tool_calls") or []):
            call_id = _parts(call, f"call_{last}_{number}")[0]
            if call_id not in answered:
                messages.append(
                    {"role": "tool", "tool_call_id": call_id, "content": "not run: the turn ended"}
                )

    def _ask(self) -> ChatReply:
        body: dict[str, Any] = {"tool_choice": "auto", **self.model.params}
        body.update(model=self.model.name, messages=self.session.messages, tools=self._tools())
        return self.session.client.complete(
            body,
            deadline=self.context.deadline,
            cancel=self.context.cancel,
            gate=self.context.model_gate,
            meter=self.meter,
            headers=self.model.headers(),
        )

    def _tools(self) -> list[dict[str, Any]]:
        """`bash`, and the tools of the granted MCP servers that connected."""
        offered = [tool.definition() for tool in (self.tools.tools if self.tools else {}).values()]
        return [BASH_TOOL, *offered]

    def _call_tool(self, name: str, raw: Any) -> tuple[dict[str, Any], str]:
        """An MCP tool's call: its arguments and the answer the model is sent."""
        assert self.tools is not None
        arguments, problem = _object_arguments(raw)
        if problem is not None:
            return {}, f"error: {problem}"
        self.tool_calls += 1
        timeout = min(self.options.command_timeout_sec, self.context.deadline.remaining())
        answer = self.tools.call(name, arguments, timeout)
        text = cut_output(answer.text.encode(), self.options.max_output_bytes) or EMPTY_ANSWER
        return arguments, f"error: {text}" if answer.is_error else text

    def _act(self, text: str, calls: list[Any], usage: Usage) -> None:
        """Run the tool calls of one response in order and answer each."""
        recorded: list[ToolCall] = []
        results: list[ObservationResult] = []
        for number, call in enumerate(calls):
            call_id, name, raw = _parts(call, f"call_{len(self.steps)}_{number}")
            mcp = self.tools is not None and name in self.tools.tools
            if mcp:
                arguments, output = self._call_tool(name, raw)
                problem = None
            else:
                arguments, problem = _arguments(name, raw, self._tools())
                output = ""
            recorded.append(
                ToolCall(
                    tool_call_id=call_id,
                    function_name=name,
                    arguments=arguments if isinstance(arguments, dict) else {},
                    extra=None if problem is None else {"raw_arguments": str(raw)},
                )
            )
            if problem is not None:
                output = f"error: {problem}"
            elif not mcp:
                # Only a call of bash runs a command: an MCP tool's empty answer never does.
                output = self._bash(arguments)
            self.session.messages.append(
                {"role": "tool", "tool_call_id": call_id, "content": output}
            )
            results.append(ObservationResult(source_call_id=call_id, content=output))
            if self.context.cancel.is_set() or self.context.deadline.expired:
                break
        self._step(
            "agent",
            text,
            usage=usage,
            tool_calls=recorded,
            observation=Observation(results=results),
        )

    def _bash(self, arguments: dict[str, Any]) -> str:
        asked = arguments.get("timeout_sec", self.options.command_timeout_sec)
        timeout = min(float(asked), self.context.deadline.remaining())
        done = self.context.sandbox.exec(
            ["bash", "-c", "exec 2>&1\n" + arguments["command"]],
            user=self.context.agent_user,
            workdir=self.context.workdir,
            env={"DEBIAN_FRONTEND": "noninteractive"},
            timeout=timeout,
        )
        output = cut_output(done.stdout_bytes + done.stderr_bytes, self.options.max_output_bytes)
        if done.timed_out:
            return f"the command was killed after {timeout:g} s (its timeout)\n{output}"
        return f"exit code: {done.exit_code}\n{output}"

    def _step(
        self,
        source: str,
        message: str,
        *,
        usage: Usage | None = None,
        tool_calls: list[ToolCall] | None = None,
        observation: Observation | None = None,
    ) -> None:
        agent = source == "agent"
        self.steps.append(
            Step(
                step_id=len(self.steps) + 1,
                timestamp=datetime.now(UTC).isoformat(timespec="milliseconds"),
                source=source,  # type: ignore[arg-type]
                message=message,
                tool_calls=tool_calls,
                observation=observation,
                metrics=None
                if usage is None
                else StepMetrics(
                    prompt_tokens=usage.prompt_tokens,
                    completion_tokens=usage.completion_tokens,
                    cost_usd=usage.cost_usd,
                ),
                model_name=self.model.name if agent else None,
            )
        )

    def _trajectory(self, usage: Usage, notes: str | None) -> Trajectory:
        return Trajectory(
            session_id=f"{self.context.episode_id}/{self.context.step}",
            agent=AgentInfo(
                name="shell-agent",
                version=_package_version(),
                model_name=self.model.name,
                tool_definitions=self._tools(),
            ),
            steps=self.steps,
            notes=notes,
            final_metrics=FinalMetrics(
                total_prompt_tokens=usage.prompt_tokens,
                total_completion_tokens=usage.completion_tokens,
                total_cost_usd=usage.cost_usd,
                total_steps=len(self.steps),
                extra={"mcp_tool_calls": self.tool_calls} if self.tools is not None else None,
            ),
        )

    def _system_prompt(self) -> str:
        user = self.context.agent_user
        return _SYSTEM_PROMPT.format(
            user=f" as user {user}" if user else "",
            workdir=self.context.workdir or "the image's working directory",
            cap=self.options.max_output_bytes,
            timeout=self.options.command_timeout_sec,
            mcp=_MCP_PROMPT if self.tools is not None and self.tools.tools else "",
        )


def _with_ids(calls: Any, prefix: str) -> list[Any]:
    """The tool calls of a response, each with an id (made up where the model gave none)."""
    if not isinstance(calls, list):
        return []
    named = []
    for number, call in enumerate(calls):
        if isinstance(call, dict) and not call.get("id"):
            call = {**call, "id": f"{prefix}_{number}"}
        named.append(call)
    return named


def _failures(tools: McpTools) -> str:
    """The servers that did not connect and why, in the order of their names."""
    return "; ".join(f"{name}: {why}" for name, why in sorted(tools.failures.items()))


def _parts(call: Any, fallback_id: str) -> tuple[str, str, Any]:
    """A tool call's id, function name and raw arguments, whatever shape it came in."""
    if not isinstance(call, dict):
        return fallback_id, "", call
    function = call.get("function")
    function = function if isinstance(function, dict) else {}
    call_id = call.get("id")
    return (
        call_id if isinstance(call_id, str) and call_id else fallback_id,
        str(function.get("name") or ""),
        function.get("arguments"),
    )


def _connect(context: TurnContext, redactor: Redactor) -> McpTools:
    """The turn's granted MCP servers, connected through the sandbox as the agent user."""
    from pytest_harbor.harnesses.mcp.client import McpTools

    sandbox = context.sandbox
    if not isinstance(sandbox, OpensPipes):
        tools = McpTools(context.mcp, _no_pipes, redactor)
        tools.failures.update(
            {server.name: "this sandbox cannot relay connections" for server in context.mcp.granted}
        )
        return tools

    def open_pipe(command: Sequence[str]) -> Pipe:
        return sandbox.open_pipe(command, user=context.agent_user, workdir=context.workdir)

    tools = McpTools(context.mcp, open_pipe, redactor)
    tools.connect(min(_CONNECT_S, context.deadline.remaining()))
    return tools


def _no_pipes(command: Sequence[str]) -> Pipe:
    raise SandboxError("this sandbox cannot relay connections")


def _object_arguments(raw: Any) -> tuple[dict[str, Any], str | None]:
    """A tool call's arguments as a JSON object, or why they are not one."""
    if isinstance(raw, str):
        raw, error = load_json(raw) if raw.strip() else ({}, None)
        if error is not None:
            return {}, f"the arguments are not valid JSON (they {error})"
    if raw is None:
        return {}, None
    if not isinstance(raw, dict):
        return {}, "the arguments must be a JSON object"
    return raw, None


def _arguments(
    name: str, raw: Any, offered: Sequence[dict[str, Any]] = (BASH_TOOL,)
) -> tuple[dict[str, Any], str | None]:
    """The `bash` call's arguments, or why they cannot be used (told to the model)."""
    if name != "bash":
        if len(offered) == 1:
            return {}, f"there is no tool {name!r}; the only tool is `bash`"
        names = ", ".join(str(tool["function"]["name"]) for tool in offered)
        return {}, f"there is no tool {name!r}; the tools are {names}"
    if isinstance(raw, str):
        raw, error = load_json(raw) if raw.strip() else ({}, None)
        if error is not None:
            return (
                {},
                f"the arguments are not valid JSON (they {error}); "
                'send an object like {"command": "ls"}',
            )
    if not isinstance(raw, dict):
        return {}, "the arguments must be a JSON object with a `command` string"
    command = raw.get("command")
    if not isinstance(command, str) or not command.strip():
        return raw, "`command` is required and must be a non-empty string"
    timeout = raw.get("timeout_sec")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
    ):
        return raw, "`timeout_sec` must be a positive number of seconds"
    unknown = sorted(set(raw) - {"command", "timeout_sec"})
    if unknown:
        return (
            raw,
            f"unknown argument(s) {', '.join(unknown)}; `bash` takes command and timeout_sec",
        )
    return raw, None


def cut_output(data: bytes, cap: int) -> str:
    """`data` as text, at most `cap` bytes of it: its head and tail, the cut noted."""
    if len(data) <= cap:
        return data.decode("utf-8", errors="replace")
    half = cap // 2
    cut = len(data) - 2 * half
    return (
        data[:half].decode("utf-8", errors="replace")
        + f"\n[... {cut} bytes cut ...]\n"
        + data[-half:].decode("utf-8", errors="replace")
    )
