"""The Chat Completions client against a real HTTP server on 127.0.0.1: retries, waits,
classification, deadlines and the cap on requests in flight."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from pydantic import SecretStr

from pytest_harbor.engine.harness_calls import InProcessGate
from pytest_harbor.harnesses.base import Deadline
from pytest_harbor.harnesses.chat import ChatClient, ChatError, OutOfTime, RetryPolicy, UsageMeter
from pytest_harbor.harnesses.model import ModelConfig
from pytest_harbor.redaction import Redactor
from tests.model_server import MODEL, ChatRequest, Reply, Script, ScriptedModel, answer, error


def client_for(url: str, key: str, attempts: int = 3) -> ChatClient:
    model = ModelConfig(name=MODEL, base_url=url, api_key=SecretStr(key))
    return ChatClient(
        model,
        retry=RetryPolicy(attempts=attempts, base_s=0.05, max_s=0.1),
        request_timeout_s=30,
        redactor=Redactor([key]),
    )


def ask(
    client: ChatClient, seconds: float = 30, meter: UsageMeter | None = None, gate: object = None
) -> object:
    return client.complete(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        deadline=Deadline.after(seconds),
        cancel=threading.Event(),
        gate=gate or InProcessGate(4),  # type: ignore[arg-type]
        meter=meter or UsageMeter(),
    )


def test_retry_after_is_honoured_and_every_request_counted(
    serve: Callable[[Script], ScriptedModel],
) -> None:
    server = serve(
        lambda r: error(429, "slow down", retry_after="1") if r.number == 0 else answer("hi")
    )
    meter = UsageMeter()
    reply = ask(client_for(server.url, server.api_key), meter=meter)
    assert reply.message["content"] == "hi"  # type: ignore[attr-defined]
    assert server.requests[1].at - server.requests[0].at >= 1.0
    assert (meter.usage.requests, meter.usage.prompt_tokens, meter.usage.completion_tokens) == (
        2,
        120,
        10,
    )


def test_retry_after_as_an_http_date(serve: Callable[[Script], ScriptedModel]) -> None:
    # The date has whole seconds: three ahead is still two or more once truncated.
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=3), usegmt=True)
    server = serve(
        lambda r: error(503, "busy", retry_after=when) if r.number == 0 else answer("hi")
    )
    ask(client_for(server.url, server.api_key))
    assert server.requests[1].at - server.requests[0].at >= 0.9


@pytest.mark.parametrize(
    ("reply", "cause", "requests"),
    [
        (error(429, "rate limit"), "rate_limited", 3),
        (error(500, "boom", kind="server_error"), "api_error", 3),
        (Reply(raw=b"<html>bad gateway</html>"), "api_error", 3),
        (error(401, "bad key"), "api_error", 1),
        (
            error(400, "This model's maximum context length is 4096 tokens."),
            "context_length_exceeded",
            1,
        ),
        (
            error(
                400,
                "The input (9000 tokens) is longer than the model's context length (8192 tokens).",
            ),
            "context_length_exceeded",
            1,
        ),
        (error(400, "too long", code="context_length_exceeded"), "context_length_exceeded", 1),
        (error(400, "temperature must be below 2"), "api_error", 1),
    ],
)
def test_failures_are_classified_and_only_passing_ones_retried(
    serve: Callable[[Script], ScriptedModel], reply: Reply, cause: str, requests: int
) -> None:
    server = serve(lambda r: reply)
    with pytest.raises(ChatError) as raised:
        ask(client_for(server.url, server.api_key))
    assert raised.value.cause == cause
    assert len(server.requests) == requests


def test_an_unreachable_endpoint_is_an_api_error() -> None:
    # A port held by a socket that does not listen: refused, and no other test can take it.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        with pytest.raises(ChatError) as raised:
            ask(client_for(f"http://127.0.0.1:{port}/v1", "k", attempts=2))
    assert raised.value.cause == "api_error"
    assert "cannot reach" in raised.value.message


def test_a_wait_past_the_deadline_gives_up_at_once(
    serve: Callable[[Script], ScriptedModel],
) -> None:
    server = serve(lambda r: error(429, "later", retry_after="60"))
    started = time.monotonic()
    with pytest.raises(ChatError, match="would pass the deadline"):
        ask(client_for(server.url, server.api_key), seconds=5)
    assert time.monotonic() - started < 4


def test_a_hanging_endpoint_ends_at_the_deadline(serve: Callable[[Script], ScriptedModel]) -> None:
    server = serve(lambda r: Reply(delay_s=30, body=answer("late").body))
    started = time.monotonic()
    with pytest.raises(OutOfTime):
        ask(client_for(server.url, server.api_key), seconds=1)
    assert time.monotonic() - started < 5


def test_the_key_is_masked_in_error_messages(serve: Callable[[Script], ScriptedModel]) -> None:
    server = serve(lambda r: error(403, f"key {r.headers['Authorization']} is not allowed"))
    with pytest.raises(ChatError) as raised:
        ask(client_for(server.url, server.api_key))
    assert server.api_key not in raised.value.message
    assert "key Bearer *** is not allowed" in raised.value.message


def test_cost_is_read_when_the_endpoint_gives_it(serve: Callable[[Script], ScriptedModel]) -> None:
    def script(request: ChatRequest) -> Reply:
        reply = answer("hi")
        reply.body["usage"]["cost"] = 0.25
        return reply

    server = serve(script)
    meter = UsageMeter()
    ask(client_for(server.url, server.api_key), meter=meter)
    assert meter.usage.cost_usd == 0.25


def test_requests_in_flight_never_pass_the_gate(serve: Callable[[Script], ScriptedModel]) -> None:
    in_flight = 0
    most = 0
    lock = threading.Lock()

    def script(request: ChatRequest) -> Reply:
        nonlocal in_flight, most
        with lock:
            in_flight += 1
            most = max(most, in_flight)
        time.sleep(0.1)
        with lock:
            in_flight -= 1
        return answer("hi")

    server = serve(script)
    client = client_for(server.url, server.api_key)
    gate = InProcessGate(2)
    threads = [
        threading.Thread(target=ask, args=(client,), kwargs={"gate": gate}) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(server.requests) == 8
    assert most == 2
