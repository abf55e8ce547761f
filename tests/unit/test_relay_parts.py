"""The relay's parts without its process: the budget, the books, the cassettes' keys and
order, and the HTTP it reads (a proxy's absolute target, chunks, what is not HTTP)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from pytest_harbor.relay.admission import Call, Refusal, read_call, route_of
from pytest_harbor.relay.cassettes import Cassette, Recorded, cassette_path, request_key
from pytest_harbor.relay.ledger import TOKEN_PREFIX, Budget, Ledger
from pytest_harbor.relay.reports import Counts, GrantRequest
from pytest_harbor.relay.upstream import Upstream
from pytest_harbor.relay.wire import WireError, read_body, read_head


def test_the_budget_is_reached_by_cost_or_by_tokens() -> None:
    assert Budget().reached(Counts(cost_usd=1e9, prompt_tokens=10**12)) is None
    dollars = Budget(max_cost_usd=2.0)
    assert dollars.reached(Counts(cost_usd=1.99)) is None
    assert "--harbor-max-cost=2 USD reached" in str(dollars.reached(Counts(cost_usd=2.0)))
    tokens = Budget(max_tokens=100)
    assert tokens.reached(Counts(prompt_tokens=60, completion_tokens=39)) is None
    assert tokens.reached(Counts(prompt_tokens=60, completion_tokens=40)) is not None


def test_the_books_count_every_grant_and_forget_a_token_once_it_ended() -> None:
    ledger = Ledger(Budget())
    request = GrantRequest(episode="t__r0", models=("m",), cassette="ts/t__r0")
    first, second = ledger.grant(request), ledger.grant(request)
    assert first.token != second.token and first.token.startswith(TOKEN_PREFIX)
    assert len(first.token) > 40
    ledger.charge(first, Counts(requests=1, prompt_tokens=5))
    ledger.charge(second, Counts(requests=2, cost_usd=0.5))
    assert ledger.end(first.token) is first
    assert ledger.find(first.token) is None and ledger.find(None) is None
    # What an ended grant spent still counts for the run.
    assert ledger.state().counts == Counts(requests=3, prompt_tokens=5, cost_usd=0.5)
    assert ledger.state().grants == 2


def test_a_requests_key_leaves_out_what_clients_set_anew_each_run() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with_ids = {**body, "metadata": {"user_id": "session-1"}, "prompt_cache_key": "abc"}
    plain = request_key("POST", "/v1/chat/completions", json.dumps(body).encode())
    assert request_key("POST", "/v1/chat/completions", json.dumps(with_ids).encode()) == plain
    reordered = json.dumps(dict(reversed(list(body.items())))).encode()
    assert request_key("POST", "/v1/chat/completions?x=1", reordered) == plain
    changed = {**body, "messages": [{"role": "user", "content": "hello"}]}
    assert request_key("POST", "/v1/chat/completions", json.dumps(changed).encode()) != plain
    assert request_key("POST", "/v1/responses", json.dumps(body).encode()) != plain
    assert request_key("POST", "/v1/x", b"not json") != request_key("POST", "/v1/x", b"other")


def test_a_cassette_answers_each_call_of_a_key_in_order_then_the_last(tmp_path: Path) -> None:
    path = cassette_path(tmp_path, "ts/../../t__r0")
    assert path == tmp_path / "ts" / "t__r0.jsonl"
    kept = Cassette(path)
    for text in (b"one", b"two"):
        kept.keep("k", "POST", "/v1/chat/completions", Recorded(200, "application/json", text))
    path.write_bytes(path.read_bytes() + b"a torn line\n{}\n")
    again = Cassette.read(path)
    assert [again.answer("k").body for _ in range(3)] == [b"one", b"two", b"two"]  # type: ignore[union-attr]
    assert again.answer("never") is None
    assert Cassette.read(tmp_path / "none.jsonl").answer("k") is None


def _read(data: bytes) -> tuple[str, str, bytes]:
    async def run() -> tuple[str, str, bytes]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        head = await read_head(reader, answer=False)
        assert head is not None
        return head.method, head.target, await read_body(reader, head)

    return asyncio.run(run())


def test_a_proxys_absolute_target_and_a_chunked_body_read_as_plain_ones() -> None:
    chunked = (
        b"POST http://model.pytest-harbor.internal/v1/chat/completions HTTP/1.1\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\n\r\n"
    )
    assert _read(chunked) == ("POST", "/v1/chat/completions", b"abcde")


@pytest.mark.parametrize(
    "data",
    [
        b"GET relative HTTP/1.1\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nab",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"POST / HTTP/1.1\r\nBad Header\r\n\r\n",
        b"\x16\x03\x01 a TLS hello\r\n\r\n",
    ],
)
def test_what_is_not_http_ends_its_connection_with_a_wire_error(data: bytes) -> None:
    with pytest.raises(WireError):
        _read(data)


def test_a_relayed_path_goes_below_the_endpoints_base_or_its_root() -> None:
    openai = Upstream("https://api.openai.com/v1", "sk")
    assert openai.target("/v1/chat/completions") == "/v1/chat/completions"
    assert openai.target("/v1/messages") == "/v1/messages"
    routed = Upstream("https://router.example/api/v1", None)
    assert routed.target("/v1/chat/completions?x=1") == "/api/v1/chat/completions?x=1"
    assert routed.target("/other") == "/api/other"
    assert routed.auth("authorization") == []
    assert openai.auth("x-api-key") == [("x-api-key", "sk")]
    assert openai.auth(None) == [("authorization", "Bearer sk")]
    assert (openai.host, openai.port, openai.authority) == ("api.openai.com", 443, "api.openai.com")


def test_a_call_is_served_only_when_its_body_is_read_as_the_endpoint_reads_it() -> None:
    models = ("m",)
    fine = read_call("call", "chat-completions", b'{"model": "m", "stream": true}', models)
    assert isinstance(fine, Call) and fine.stream
    assert json.loads(fine.body)["stream_options"] == {"include_usage": True}
    asked = b'{"model": "m", "stream": true, "stream_options": {"include_usage": false}}'
    again = read_call("call", "chat-completions", asked, models)
    assert isinstance(again, Call)
    assert json.loads(again.body)["stream_options"] == {"include_usage": True}
    # A body goes on as it came (a key inside given twice is the endpoint's to read).
    nested = b' { "model" : "m" , "messages": [{"a": 1, "a": 2}] } '
    assert read_call("call", "chat-completions", nested, models) == Call(
        "call", "chat-completions", "m", False, nested
    )
    for body, status in (
        (b'{"model": "other"}', 403),
        (b'{"model": "other", "model": "m"}', 400),
        (b'{"model": "m", "stream": true, "stream": false}', 400),
        (b'{"model": "m"} trailing', 400),
        (b'{"model": "m",}', 400),
        (b'{"model": "m" "x": 1}', 400),
        (b'{"model": "m", "deep": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400),
        (b'{"model": "\xff"}', 400),
        (b'{"model": ["m"]}', 400),
        (b'{"model": "m", "stream": 1}', 400),
        (b'["m"]', 400),
        (b"not json", 400),
    ):
        refused = read_call("call", "chat-completions", body, models)
        assert isinstance(refused, Refusal) and refused.status == status, body
    assert isinstance(read_call("models", None, b"", models), Call)
    assert isinstance(read_call("models", None, b"{}", models), Refusal)


@pytest.mark.parametrize(
    ("method", "target", "served"),
    [
        ("POST", "/v1/chat/completions", True),
        ("POST", "/v1/messages?beta=true", True),
        ("POST", "/v1/messages/count_tokens", True),
        ("GET", "/v1/models", True),
        ("GET", "/v1/models/claude-sonnet-4-5", True),
        ("POST", "/v1/chat/completions/", False),
        ("POST", "/v1/chat/%63ompletions", False),
        ("POST", "/v1/chat/completions#x", False),
        ("POST", "/v1/completions", False),
        ("POST", "/v1/embeddings", False),
        ("POST", "/v1/messages/batches", False),
        ("GET", "/v1/models/../admin", False),
        ("GET", "/admin/status", False),
        ("DELETE", "/v1/models", False),
        ("GET", "/v1/chat/completions", False),
    ],
)
def test_the_relay_serves_the_model_api_alone(method: str, target: str, served: bool) -> None:
    assert (not isinstance(route_of(method, target), Refusal)) == served
