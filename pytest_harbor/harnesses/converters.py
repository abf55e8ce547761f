"""Converters from a CLI agent's own log to an ATIF v1.7 trajectory.

A converter is a function `(ConverterInput) -> Trajectory | None`. A recipe names one in
`[logs].trajectory`: a built-in name (`openai-messages`, `mini-swe-agent`, `claude-code`,
`codex`, `opencode`) or `package.module:function`. A converter that fails or returns
something that is not a valid trajectory leaves the turn without one (the engine then
writes its two-step transcript) and a note says why; the turn itself is not failed for it.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pytest_harbor.harnesses.atif import AgentInfo, FinalMetrics, Step, Trajectory
from pytest_harbor.strict_json import as_float
from pytest_harbor.untrusted import load_json

__all__ = ["BUILT_IN_CONVERTERS", "Converter", "ConverterInput", "StepsBuilder", "convert"]


@dataclass(frozen=True)
class ConverterInput:
    """What a converter reads: the kept files (path below /logs/agent -> content), the
    run's stdout, and what is known about the run."""

    files: Mapping[str, bytes]
    stdout: str
    agent: str
    version: str
    model: str
    session_id: str
    instruction: str


Converter = Callable[[ConverterInput], Trajectory | None]


class StepsBuilder:
    """Collects steps in order, numbering them and pairing tool results with the agent
    step that made the call."""

    def __init__(self, source: ConverterInput) -> None:
        self.source = source
        self.steps: list[dict[str, Any]] = []
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.cost_usd: float | None = None
        self._calls: dict[str, dict[str, Any]] = {}

    def add(self, source: str, message: str, **fields: Any) -> dict[str, Any]:
        step: dict[str, Any] = {
            "step_id": len(self.steps) + 1,
            "source": source,
            "message": message,
            **{key: value for key, value in fields.items() if value is not None},
        }
        self.steps.append(step)
        return step

    def agent(
        self,
        message: str,
        calls: list[tuple[str, str, dict[str, Any]]] = (),  # type: ignore[assignment]
        *,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        cached_tokens: int | None = None,
        reasoning: str | None = None,
    ) -> dict[str, Any]:
        """An agent step with tool calls `(id, name, arguments)` and its token counts."""
        metrics = None
        if prompt_tokens is not None or completion_tokens is not None:
            self.prompt_tokens += prompt_tokens or 0
            self.completion_tokens += completion_tokens or 0
            self.cached_tokens += cached_tokens or 0
            metrics = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "cached_tokens": cached_tokens,
            }
        step = self.add(
            "agent",
            message,
            model_name=self.source.model,
            reasoning_content=reasoning or None,
            tool_calls=[
                {"tool_call_id": call_id, "function_name": name, "arguments": arguments}
                for call_id, name, arguments in calls
            ]
            or None,
            metrics={k: v for k, v in metrics.items() if v is not None} if metrics else None,
        )
        for call_id, _, _ in calls:
            self._calls[call_id] = step
        return step

    def extend(
        self, step: dict[str, Any], texts: list[str], calls: list[tuple[str, str, dict[str, Any]]]
    ) -> None:
        """More of an agent step: text joins its message, tool calls join its calls."""
        if texts:
            step["message"] = "\n".join([step["message"], *texts]).strip()
        if calls:
            step.setdefault("tool_calls", [])
            step["tool_calls"] += [
                {"tool_call_id": call_id, "function_name": name, "arguments": arguments}
                for call_id, name, arguments in calls
            ]
            for call_id, _, _ in calls:
                self._calls[call_id] = step

    def result(self, call_id: str | None, content: str) -> None:
        """A tool's output, on the step that called it (else on the latest agent step)."""
        step = self._calls.get(call_id or "")
        if step is None:
            step = next((s for s in reversed(self.steps) if s["source"] == "agent"), None)
            if step is None:
                return
            call_id = None
        observation = step.setdefault("observation", {"results": []})
        observation["results"].append({"source_call_id": call_id, "content": content})

    def trajectory(self, notes: str | None = None) -> Trajectory | None:
        if not self.steps:
            return None
        source = self.source
        return Trajectory(
            session_id=source.session_id,
            agent=AgentInfo(name=source.agent, version=source.version, model_name=source.model),
            steps=[Step.model_validate(step) for step in self.steps],
            notes=notes,
            final_metrics=FinalMetrics(
                total_prompt_tokens=self.prompt_tokens,
                total_completion_tokens=self.completion_tokens,
                total_cached_tokens=self.cached_tokens or None,
                total_cost_usd=self.cost_usd,
                total_steps=len(self.steps),
            ),
        )


def _text(content: Any) -> str:
    """Message content as text: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    parts.append(text)
                elif "content" in part:
                    parts.append(_text(part["content"]))
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    return "" if content is None else json.dumps(content)


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        parsed, error = load_json(raw)
        if error is not None:
            return {"input": raw}
        return parsed if isinstance(parsed, dict) else {"input": parsed}
    return {"input": raw}


def _json_lines(text: str) -> Iterator[dict[str, Any]]:
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        value, _ = load_json(line)
        if isinstance(value, dict):
            yield value


def openai_messages(
    source: ConverterInput, messages: list[dict[str, Any]], builder: StepsBuilder | None = None
) -> StepsBuilder:
    """Chat Completions messages (system, user, assistant with tool_calls, tool) as
    steps; token counts from a message's `usage` or `extra.response.usage` when present."""
    builder = builder or StepsBuilder(source)
    for message in messages:
        role = message.get("role")
        content = _text(message.get("content"))
        if role in ("system", "user"):
            builder.add(role, content)
        elif role == "assistant":
            calls: list[tuple[str, str, dict[str, Any]]] = []
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                calls.append(
                    (
                        str(call.get("id") or f"call_{len(builder.steps)}_{len(calls)}"),
                        str(function.get("name") or "tool"),
                        _arguments(function.get("arguments")),
                    )
                )
            usage = message.get("usage") or (
                ((message.get("extra") or {}).get("response") or {}).get("usage")
            )
            usage = usage if isinstance(usage, dict) else {}
            details = usage.get("prompt_tokens_details") or {}
            builder.agent(
                content,
                calls,
                prompt_tokens=usage.get("prompt_tokens"),
                completion_tokens=usage.get("completion_tokens"),
                cached_tokens=details.get("cached_tokens") if isinstance(details, dict) else None,
            )
        elif role == "tool":
            builder.result(message.get("tool_call_id"), content)
    return builder


def _from_openai_messages(source: ConverterInput) -> Trajectory | None:
    """A kept JSON file holding `messages` (or a list of them), or JSON lines of messages."""
    for data in source.files.values():
        value, error = load_json(data)
        if error is not None:
            value = list(_json_lines(data.decode("utf-8", errors="replace")))
        messages = value.get("messages") if isinstance(value, dict) else value
        if isinstance(messages, list) and messages:
            return openai_messages(source, messages).trajectory()
    return None


def _from_mini_swe_agent(source: ConverterInput) -> Trajectory | None:
    """mini-swe-agent's trajectory file (`-o`): `messages` in Chat Completions form and
    `info.model_stats` (its cost and call count)."""
    for name, data in source.files.items():
        if not name.endswith(".json"):
            continue
        document, error = load_json(data)
        if error is not None:
            raise ValueError(f"{name} {error}")
        messages = document.get("messages") if isinstance(document, dict) else None
        if not isinstance(messages, list):
            continue
        builder = openai_messages(source, messages)
        stats = (document.get("info") or {}).get("model_stats") or {}
        cost = stats.get("instance_cost")
        if isinstance(cost, (int, float)) and cost > 0:
            builder.cost_usd = as_float(cost)
        exit_status = (document.get("info") or {}).get("exit_status")
        return builder.trajectory(notes=f"exit status: {exit_status}" if exit_status else None)
    return None


def _from_claude_code(source: ConverterInput) -> Trajectory | None:
    """Claude Code's `--output-format stream-json` lines on stdout: assistant messages
    (text, thinking, tool_use; one line per block, merged by message id), user lines with
    tool results, and the final `result` line with the totals and cost."""
    builder = StepsBuilder(source)
    builder.add("user", source.instruction)
    step: dict[str, Any] | None = None
    last_id: str | None = None
    totals: dict[str, Any] | None = None
    for line in _json_lines(source.stdout):
        kind = line.get("type")
        message = line.get("message") or {}
        if kind == "assistant" and isinstance(message, dict):
            if step is not None and message.get("id") and message.get("id") == last_id:
                texts, _, calls = _claude_blocks(message)
                builder.extend(step, texts, calls)
            else:
                step = _claude_step(builder, message)
                last_id = message.get("id")
        elif kind == "user" and isinstance(message, dict):
            for block in message.get("content") or []:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    builder.result(block.get("tool_use_id"), _text(block.get("content")))
        elif kind == "result":
            totals = line
    if len(builder.steps) == 1:
        return None
    if totals is None:
        return builder.trajectory(notes=None)
    usage = totals.get("usage") or {}
    builder.prompt_tokens = _claude_prompt_tokens(usage)
    builder.completion_tokens = _int(usage.get("output_tokens"))
    builder.cached_tokens = _int(usage.get("cache_read_input_tokens"))
    cost = totals.get("total_cost_usd")
    builder.cost_usd = as_float(cost)
    return builder.trajectory(
        notes=f"ended: {totals.get('terminal_reason') or totals.get('subtype')}"
    )


def _claude_blocks(
    message: dict[str, Any],
) -> tuple[list[str], list[str], list[tuple[str, str, dict[str, Any]]]]:
    """An assistant message's texts, thinking and tool calls (id, name, arguments)."""
    blocks = message.get("content") or []
    texts = [b.get("text", "") for b in blocks if b.get("type") == "text"]
    thinking = [b.get("thinking", "") for b in blocks if b.get("type") == "thinking"]
    calls = [
        (str(b.get("id")), str(b.get("name")), _arguments(b.get("input")))
        for b in blocks
        if b.get("type") == "tool_use"
    ]
    return texts, thinking, calls


def _claude_step(builder: StepsBuilder, message: dict[str, Any]) -> dict[str, Any]:
    """A new agent step of an assistant message, with its usage."""
    texts, thinking, calls = _claude_blocks(message)
    usage = message.get("usage") or {}
    return builder.agent(
        "\n".join(texts),
        calls,
        prompt_tokens=_claude_prompt_tokens(usage),
        completion_tokens=_int(usage.get("output_tokens")),
        cached_tokens=_int(usage.get("cache_read_input_tokens")) or None,
        reasoning="\n".join(thinking),
    )


def _claude_prompt_tokens(usage: dict[str, Any]) -> int:
    """Input tokens, those read from and written to the prompt cache included."""
    return (
        _int(usage.get("input_tokens"))
        + _int(usage.get("cache_read_input_tokens"))
        + _int(usage.get("cache_creation_input_tokens"))
    )


def _from_codex(source: ConverterInput) -> Trajectory | None:
    """Codex's `exec --json` events on stdout: completed items (agent messages, reasoning,
    command runs with their output, other tools) and each turn's token usage."""
    builder = StepsBuilder(source)
    builder.add("user", source.instruction)
    # Reasoning items precede the message or call they led to, which carries them.
    reasoning: list[str] = []
    errors: list[str] = []
    for line in _json_lines(source.stdout):
        kind, item = line.get("type"), line.get("item")
        if kind == "turn.completed":
            _add_codex_usage(builder, line.get("usage") or {})
            continue
        if kind != "item.completed" or not isinstance(item, dict):
            continue
        item_type = item.get("type")
        if item_type == "reasoning":
            reasoning.append(str(item.get("text") or ""))
        elif item_type == "error":
            errors.append(str(item.get("message") or ""))
        else:
            _codex_step(builder, item, "\n".join(reasoning))
            reasoning = []
    if len(builder.steps) == 1:
        return None
    return builder.trajectory(notes="; ".join(errors) or None)


def _add_codex_usage(builder: StepsBuilder, usage: dict[str, Any]) -> None:
    """One turn's tokens, added to the trajectory's totals."""
    builder.prompt_tokens += _int(usage.get("input_tokens"))
    builder.completion_tokens += _int(usage.get("output_tokens"))
    builder.cached_tokens += _int(usage.get("cached_input_tokens"))


def _codex_step(builder: StepsBuilder, item: dict[str, Any], reasoning: str) -> None:
    """The agent step of a completed item: a message, or a tool's call with its output."""
    if item.get("type") == "agent_message":
        builder.agent(str(item.get("text") or ""), reasoning=reasoning)
        return
    call_id = str(item.get("id") or f"item_{len(builder.steps)}")
    name, arguments, output = _codex_call(item)
    builder.agent("", [(call_id, name, arguments)], reasoning=reasoning)
    builder.result(call_id, output)


def _codex_call(item: dict[str, Any]) -> tuple[str, dict[str, Any], str]:
    """A tool item's name, arguments and output: a command run's command, exit code and
    output; any other tool's own fields and status."""
    item_type = item.get("type")
    if item_type == "command_execution":
        output = f"exit code {item.get('exit_code')}\n{item.get('aggregated_output') or ''}"
        return "exec_command", {"command": item.get("command")}, output
    arguments = {k: v for k, v in item.items() if k not in ("id", "type")}
    return str(item_type or "tool"), arguments, str(item.get("status") or "")


def _from_opencode(source: ConverterInput) -> Trajectory | None:
    """opencode's `run --format json` lines on stdout: text parts, tool parts with their
    input and output, and each step's tokens and cost (`step_finish`)."""
    builder = StepsBuilder(source)
    builder.add("user", source.instruction)
    cost = 0.0
    for line in _json_lines(source.stdout):
        found = line.get("part")
        part: dict[str, Any] = found if isinstance(found, dict) else {}
        kind = line.get("type")
        if kind == "text":
            builder.agent(str(part.get("text") or ""))
        elif kind == "reasoning":
            builder.agent("", reasoning=str(part.get("text") or ""))
        elif kind == "tool_use":
            state = part.get("state") or {}
            call_id = str(part.get("callID") or part.get("id") or f"call_{len(builder.steps)}")
            builder.agent(
                "", [(call_id, str(part.get("tool") or "tool"), _arguments(state.get("input")))]
            )
            builder.result(call_id, str(state.get("output") or state.get("error") or ""))
        elif kind == "step_finish":
            tokens = part.get("tokens") or {}
            cache = tokens.get("cache") or {}
            builder.prompt_tokens += _int(tokens.get("input")) + _int(cache.get("read"))
            builder.completion_tokens += _int(tokens.get("output"))
            builder.cached_tokens += _int(cache.get("read"))
            cost += as_float(part.get("cost")) or 0.0
    if len(builder.steps) == 1:
        return None
    builder.cost_usd = cost or None
    return builder.trajectory()


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0


BUILT_IN_CONVERTERS: dict[str, Converter] = {
    "openai-messages": _from_openai_messages,
    "mini-swe-agent": _from_mini_swe_agent,
    "claude-code": _from_claude_code,
    "codex": _from_codex,
    "opencode": _from_opencode,
}


def _load(name: str) -> Converter:
    if name in BUILT_IN_CONVERTERS:
        return BUILT_IN_CONVERTERS[name]
    module, _, function = name.partition(":")
    if not module or not function:
        raise LookupError(
            f"no converter {name!r}: built in are {', '.join(sorted(BUILT_IN_CONVERTERS))}, "
            "else name one as package.module:function"
        )
    found = getattr(importlib.import_module(module), function)
    if not callable(found):
        raise LookupError(f"{name} is not a function")
    return found  # type: ignore[no-any-return]


def convert(name: str, source: ConverterInput) -> tuple[Trajectory | None, str | None]:
    """The trajectory `name` makes of `source`, and a note when it made none."""
    try:
        trajectory: object = _load(name)(source)
    except Exception as error:  # it reads what an agent wrote, however malformed
        first = str(error).splitlines()[0] if str(error).strip() else ""
        said = type(error).__name__ + (f": {first}" if first else "")
        return None, f"the {name} converter failed: {said}"[:500]
    if trajectory is None:
        return None, f"the {name} converter found no log to convert"
    if not isinstance(trajectory, Trajectory):
        return None, f"the {name} converter returned {type(trajectory).__name__}"
    return trajectory, None
