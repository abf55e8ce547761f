"""The pre-flight request: before any episode, one small request of the kind the run's
agent will send (its API, its tools, the run's parameters), so that an endpoint that
refuses such requests stops the run before it pays for a sandbox."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from pytest_harbor.harnesses.model import ModelConfig, ModelEndpointError, endpoint_words
from pytest_harbor.untrusted import load_json

__all__ = [
    "PREFLIGHT_HEADER",
    "PREFLIGHT_TOKENS",
    "ModelApi",
    "RequestShape",
    "SendsModelRequests",
    "check_request",
    "preflight_request",
]

#: The APIs an agent can speak to its model.
ModelApi = Literal["chat-completions", "responses", "anthropic-messages"]

#: Marks the pre-flight request, so that an endpoint's logs (and the tests' fake servers)
#: can tell it from an agent's.
PREFLIGHT_HEADER = "X-Harbor-Preflight"
#: The answer's length at most: enough for any API (the Responses API takes no fewer than
#: 16), little enough to cost next to nothing.
PREFLIGHT_TOKENS = 16
#: The request's parameters that cap the answer's length; the run's own cap is lowered.
_LENGTH_CAPS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
_PROMPT = "Reply with the word OK."
#: A cold model may take a while for its first answer.
_TIMEOUT_S = 60.0

#: A tool like the ones agents offer, for an agent whose own tools are not known here.
SHELL_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command and return its output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}


@dataclass(frozen=True)
class RequestShape:
    """What a harness's model requests look like: the API, the tools they offer (as Chat
    Completions function tools; none for an agent that offers none), and whether the
    run's model parameters (`--harbor-model-param`) go with them."""

    api: ModelApi
    tools: tuple[dict[str, Any], ...] = (SHELL_TOOL,)
    with_params: bool = False


@runtime_checkable
class SendsModelRequests(Protocol):
    """A harness that says what its model requests look like: the run's pre-flight sends
    one such request (None: they are not known, and only `GET /models` is asked)."""

    @property
    def model_request(self) -> RequestShape | None: ...


def preflight_request(
    model: ModelConfig, shape: RequestShape, *, cap: str | None = None
) -> tuple[str, dict[str, Any]]:
    """The URL and JSON body of the pre-flight request of `shape` to `model`; the answer's
    length capped by the run's own cap parameter, else by `cap` (else the API's usual)."""
    params = dict(model.params) if shape.with_params else {}
    caps = [name for name in _LENGTH_CAPS if name in params] or [cap or _default_cap(shape.api)]
    message = {"role": "user", "content": _PROMPT}
    if shape.api == "anthropic-messages":
        body: dict[str, Any] = {**params, "messages": [message]}
        if shape.tools:
            body["tools"] = [_anthropic_tool(tool) for tool in shape.tools]
            body.setdefault("tool_choice", {"type": "auto"})
        url = f"{model.base_url}/messages"
    elif shape.api == "responses":
        body = {**params, "input": _PROMPT}
        if shape.tools:
            body["tools"] = [_responses_tool(tool) for tool in shape.tools]
            body.setdefault("tool_choice", "auto")
        url = f"{model.base_url}/responses"
    else:
        # As shell-agent builds its own: tool_choice first, the run's parameters over it.
        body = {"tool_choice": "auto", **params} if shape.tools else dict(params)
        body["messages"] = [message]
        if shape.tools:
            body["tools"] = list(shape.tools)
        url = model.chat_url
    body.update({cap: PREFLIGHT_TOKENS for cap in caps}, model=model.name, stream=False)
    return url, body


def check_request(
    model: ModelConfig, shape: RequestShape, *, timeout_s: float = _TIMEOUT_S
) -> None:
    """Send the pre-flight request of `shape`; ModelEndpointError quotes the endpoint's own
    words when it fails (an HTTP error, an answer that is not of the API, no answer in
    `timeout_s`).

    The cap on the answer's length is the one parameter the agent may not send: when the
    run gives none and the endpoint refuses the one added (OpenAI's reasoning models take
    `max_completion_tokens`, not `max_tokens`), the request is sent once more with the
    other."""
    url, body = preflight_request(model, shape)
    try:
        answer = _post(model, shape, url, body, timeout_s)
    except _Refused as refused:
        added = next((cap for cap in _LENGTH_CAPS if cap in body), "")
        chosen = shape.with_params and any(cap in model.params for cap in _LENGTH_CAPS)
        if shape.api != "chat-completions" or chosen or added not in refused.words:
            raise
        other = "max_completion_tokens" if added == "max_tokens" else "max_tokens"
        url, body = preflight_request(model, shape, cap=other)
        answer = _post(model, shape, url, body, timeout_s)
    problem = _not_an_answer(shape.api, answer)
    if problem is not None:
        raise ModelEndpointError(
            f"{_what(url, shape)} was not answered as the API answers ({problem}): "
            f"{endpoint_words(answer, model, error_only=False)}"
        )


class _Refused(ModelEndpointError):
    """The endpoint answered the request with an HTTP error."""

    def __init__(self, message: str, words: str) -> None:
        super().__init__(message)
        self.words = words


def _post(
    model: ModelConfig, shape: RequestShape, url: str, body: dict[str, Any], timeout_s: float
) -> bytes:
    """The answer's body; _Refused for an HTTP error, ModelEndpointError for no answer."""
    import urllib.error  # only a run whose harness talks to a model asks
    import urllib.request

    headers = {**model.headers(shape.api), PREFLIGHT_HEADER: "1"}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    what = _what(url, shape)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return bytes(response.read())
    except urllib.error.HTTPError as error:
        words = endpoint_words(error.read(), model)
        phrase = endpoint_words(str(error.reason), model, error_only=False)
        said = f"{what} answered {error.code} {phrase}" + (f": {words}" if words else "")
        raise _Refused(said, words) from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        if isinstance(reason, TimeoutError):
            raise ModelEndpointError(f"{what} had no answer in {timeout_s:g} s") from None
        raise ModelEndpointError(f"{what} failed: {endpoint_words(str(reason), model)}") from None


def _what(url: str, shape: RequestShape) -> str:
    return f"POST {url} (the pre-flight request, {_described(shape)})"


def _default_cap(api: str) -> str:
    return {"anthropic-messages": "max_tokens", "responses": "max_output_tokens"}.get(
        api, "max_tokens"
    )


def _described(shape: RequestShape) -> str:
    tools = ", ".join(str(tool.get("function", {}).get("name")) for tool in shape.tools)
    return f"{shape.api}, " + (f"with the tool {tools}" if tools else "without tools")


def _anthropic_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool.get("function", {})
    return {
        "name": function.get("name"),
        "description": function.get("description", ""),
        "input_schema": function.get("parameters", {"type": "object"}),
    }


def _responses_tool(tool: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", **tool.get("function", {})}


def _not_an_answer(api: str, answer: bytes) -> str | None:
    """What is wrong with `answer` as the API's answer, or None."""
    data, problem = load_json(answer)
    if problem is not None:
        return f"the body {problem}"
    if not isinstance(data, dict):
        return "not a JSON object"
    if api == "anthropic-messages":
        ok = isinstance(data.get("content"), list)
        expected = "a message with its content"
    elif api == "responses":
        ok = isinstance(data.get("output"), list)
        expected = "a response with its output"
    else:
        choices = data.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        ok = isinstance(first, dict) and isinstance(first.get("message"), dict)
        expected = "a chat completion with a choice's message"
    return None if ok else f"expected {expected}"
