"""The pre-flight request: its body per API, and the message of a failure (the endpoint's
own words, the key masked, control characters escaped)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from pydantic import SecretStr

from pytest_harbor.harnesses.model import ModelConfig, ModelEndpointError
from pytest_harbor.harnesses.model_request import (
    PREFLIGHT_TOKENS,
    RequestShape,
    check_request,
    preflight_request,
)
from tests.local_server import LocalServer, QuietHandler

KEY = "sk-very-secret-key-0123456789"


class OneAnswer(LocalServer):
    """Answers every POST with `status` and `payload` (after `delay_s`), or as `answer`
    says for the request's body; keeps the bodies."""

    def __init__(
        self,
        status: int = 200,
        payload: bytes = b"{}",
        delay_s: float = 0.0,
        answer: Callable[[dict[str, Any]], tuple[int, bytes]] | None = None,
    ) -> None:
        self.status, self.payload, self.delay_s = status, payload, delay_s
        self.answer = answer
        self.bodies: list[dict[str, Any]] = []
        super().__init__()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                server.bodies.append(body)
                time.sleep(server.delay_s)
                status, payload = (
                    (server.status, server.payload)
                    if server.answer is None
                    else server.answer(body)
                )
                self.send_payload(status, payload)

        return Handler


def model(url: str = "http://127.0.0.1:9/v1", **params: object) -> ModelConfig:
    return ModelConfig(name="m", base_url=url, params=params, api_key=SecretStr(KEY))


def test_a_chat_request_carries_the_tool_the_choice_and_the_runs_parameters() -> None:
    shape = RequestShape("chat-completions", with_params=True)
    url, body = preflight_request(model(temperature=0.6, max_completion_tokens=900), shape)
    assert url.endswith("/v1/chat/completions")
    assert body["tool_choice"] == "auto"
    assert body["tools"][0]["function"]["name"] == "bash"
    assert body["temperature"] == 0.6
    assert body["max_completion_tokens"] == PREFLIGHT_TOKENS  # the run's own cap, lowered
    assert "max_tokens" not in body
    assert body["stream"] is False


def test_a_parameter_can_override_the_tool_choice_as_in_shell_agent() -> None:
    shape = RequestShape("chat-completions", with_params=True)
    _, body = preflight_request(model(tool_choice="required"), shape)
    assert body["tool_choice"] == "required"


def test_an_agent_without_tools_is_sent_none_and_no_parameters_unless_it_sends_them() -> None:
    _, body = preflight_request(model(temperature=1.5), RequestShape("chat-completions", ()))
    assert "tools" not in body and "tool_choice" not in body and "temperature" not in body
    assert body["max_tokens"] == PREFLIGHT_TOKENS


def test_anthropic_and_responses_requests_take_their_apis_shapes() -> None:
    url, body = preflight_request(model(), RequestShape("anthropic-messages"))
    assert url.endswith("/v1/messages")
    assert body["tools"][0]["name"] == "bash" and "input_schema" in body["tools"][0]
    assert body["tool_choice"] == {"type": "auto"} and body["max_tokens"] == PREFLIGHT_TOKENS
    url, body = preflight_request(model(), RequestShape("responses"))
    assert url.endswith("/v1/responses")
    assert body["tools"][0] == {"type": "function", **body["tools"][0]} and body["input"]
    assert body["tools"][0]["name"] == "bash" and body["max_output_tokens"] == PREFLIGHT_TOKENS


def test_a_refusal_is_quoted_with_the_key_masked_and_controls_escaped() -> None:
    said = f"bad key {KEY}\x1b[31m red\nsecond line " + "x" * 1000
    payload = json.dumps({"error": {"message": said, "type": "invalid_request_error"}})
    with OneAnswer(400, payload.encode()) as server, pytest.raises(ModelEndpointError) as caught:
        check_request(model(server.url), RequestShape("chat-completions"))
    message = str(caught.value)
    assert "answered 400 Bad Request: bad key ***\\x1b[31m red\\nsecond line xxx" in message
    assert KEY not in message and KEY[:12] not in message
    assert "\x1b" not in message and "\n" not in message
    assert len(message) < 600  # trimmed


def test_an_answer_that_is_not_a_completion_is_refused() -> None:
    with (
        OneAnswer(200, b'{"hello": "world"}') as server,
        pytest.raises(ModelEndpointError, match="expected a chat completion"),
    ):
        check_request(model(server.url), RequestShape("chat-completions"))
    with (
        OneAnswer(200, b"<html>proxy login</html>") as server,
        pytest.raises(ModelEndpointError, match="proxy login"),
    ):
        check_request(model(server.url), RequestShape("anthropic-messages"))


def test_no_answer_in_time_is_refused() -> None:
    with (
        OneAnswer(200, b"{}", delay_s=2.0) as server,
        pytest.raises(ModelEndpointError, match=r"had no answer in 0\.5 s"),
    ):
        check_request(model(server.url), RequestShape("responses"), timeout_s=0.5)


def test_a_length_cap_the_endpoint_does_not_take_is_swapped_once() -> None:
    """OpenAI's reasoning models refuse `max_tokens`; the agent sent none, so the check
    must not fail on it."""
    completion = {"choices": [{"message": {"role": "assistant", "content": ""}}]}

    def openai(body: dict[str, Any]) -> tuple[int, bytes]:
        if "max_tokens" in body:
            said = (
                "Unsupported parameter: 'max_tokens' is not supported with this model. "
                "Use 'max_completion_tokens' instead."
            )
            return 400, json.dumps({"error": {"message": said}}).encode()
        return 200, json.dumps(completion).encode()

    with OneAnswer(answer=openai) as server:
        check_request(model(server.url), RequestShape("chat-completions", with_params=True))
    assert [
        sorted(set(body) & {"max_tokens", "max_completion_tokens"}) for body in server.bodies
    ] == [
        ["max_tokens"],
        ["max_completion_tokens"],
    ]
    # The run's own cap is the agent's: refused, it is the endpoint's answer to the agent.
    with OneAnswer(answer=openai) as server, pytest.raises(ModelEndpointError, match="max_tokens"):
        check_request(
            model(server.url, max_tokens=100), RequestShape("chat-completions", with_params=True)
        )
    assert len(server.bodies) == 1
