"""The model relay attacked at the wire by the agent it serves: raw requests from a process
that holds one episode's token and controls every byte it sends. Each test states a
guarantee of docs/threat-model.md ("The model's key and the agent's spend") or
docs/cost-and-replay.md, and tries to break it: a call served for another model, a call
not counted, a budget passed, the upstream connection desynchronised between episodes,
other episodes starved."""

from __future__ import annotations

import contextlib
import json
import re
import resource
import socket
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.local_server import LocalServer, QuietHandler
from tests.model_server import ChatRequest, Reply, ScriptedModel, answer
from tests.relay_fixture import KEY, MODEL, Start, another_call, grant

OTHER = "gpt-5-expensive"


def chat_body(model: str = MODEL, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


def raw(
    port: int,
    data: bytes,
    *,
    read_for: float = 5.0,
    until: bytes | None = None,
) -> bytes:
    """Send `data` on a new connection to the relay; what came back within `read_for`
    seconds (or once `until` was seen, or the relay closed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=read_for) as sock:
        sock.sendall(data)
        got = b""
        deadline = time.monotonic() + read_for
        while time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                piece = sock.recv(65536)
            except TimeoutError:
                break
            if not piece:
                break
            got += piece
            if until is not None and until in got:
                break
        return got


def request(
    method: str,
    target: str,
    token: str,
    body: bytes = b"",
    headers: tuple[str, ...] = (),
) -> bytes:
    lines = [
        f"{method} {target} HTTP/1.1",
        "Host: model.pytest-harbor.internal",
        f"Authorization: Bearer {token}",
        "Content-Type: application/json",
        *headers,
        f"Content-Length: {len(body)}",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


# ---------------------------------------------------------------------- an endpoint
# that routes as ASGI servers (uvicorn, Starlette: vLLM, most OpenAI-compatible servers)
# and front proxies do: the path percent-decoded, a fragment or a trailing slash ignored.


class RoutingModel(LocalServer):
    """Serves OpenAI's model paths (Chat Completions, legacy Completions, Embeddings,
    Batches) and Anthropic's Message Batches for any model, each answer with `usage`
    (600 prompt and 500 completion tokens); `calls` keeps (route, model) of each served."""

    ROUTES = (
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/batches",
        "/v1/messages/batches",
    )

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None]] = []
        #: (path, Authorization) of every GET.
        self.gets: list[tuple[str, str | None]] = []
        super().__init__()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                server.gets.append((self.path, self.headers.get("Authorization")))
                self.send_payload(200, b'{"status":"the host\'s admin page"}')

            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                route = urllib.parse.unquote(self.path.split("#")[0].split("?")[0])
                route = route.rstrip("/")
                if self.headers.get("Authorization") != f"Bearer {KEY}":
                    self.send_payload(401, b'{"error":{"type":"invalid_api_key"}}')
                    return
                if route not in RoutingModel.ROUTES:
                    self.send_payload(404, b'{"error":{"type":"not_found"}}')
                    return
                model = json.loads(data).get("model")
                server.calls.append((route, model))
                answer = {
                    "id": "x",
                    "object": "chat.completion",
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "served"},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 600, "completion_tokens": 500},
                }
                self.send_payload(200, json.dumps(answer).encode())

        return Handler


# ====================================================================== broken guarantees


def test_a_trailing_slash_does_not_take_a_call_past_the_model_check_and_the_books(
    relay: Start,
) -> None:
    """`/v1/chat/completions/` is a Chat Completions call to the endpoint (the scripted one
    routes it, as servers that ignore a trailing slash do), but not to the relay: another
    model, no count, no budget."""
    with ScriptedModel(lambda request: answer("served", usage=(600, 500)), api_key=KEY) as server:
        _, client = relay(server.url, max_tokens=1000)
        token = grant(client)
        spent = httpx.post(
            f"{client.host_url}/chat/completions",
            json=chat_body(),
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        assert spent.status_code == 200
        assert client.spend().budget_reached is not None
        reply = httpx.post(
            f"{client.host_url}/chat/completions/",
            json=chat_body(OTHER),
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        served = [request.body["model"] for request in server.requests]
    assert reply.status_code in (402, 403), reply.text
    assert served == [MODEL]


@pytest.mark.parametrize(
    "target",
    [
        "/v1/completions",  # OpenAI's (and vLLM's) legacy completions
        "/v1/embeddings",
        "/v1/messages/batches",  # Anthropic's Message Batches: thousands of calls at once
        "/v1/chat/%63ompletions",  # percent-encoded, decoded by ASGI servers
        "/v1/chat/completions#x",
    ],
)
def test_every_path_that_calls_a_model_is_held_to_the_token_s_model(
    relay: Start, target: str
) -> None:
    """The relay judges a call by the end of its raw path; the endpoint serves model calls
    at other paths, and routes the same path written otherwise. None of them may call
    another model with the run's key."""
    with RoutingModel() as server:
        _, client = relay(server.url.removesuffix("/v1") + "/v1")
        token = grant(client)
        body = json.dumps(chat_body(OTHER)).encode()
        got = raw(client.address.port, request("POST", target, token, body), until=b"}")
        report = client.report(token)
        calls = list(server.calls)
    assert calls == [], f"the endpoint served {calls} for {target}: {got[:200]!r}"
    assert got.startswith(b"HTTP/1.1 403"), got[:200]
    assert report.counts.requests >= 0


def test_a_request_nested_past_the_relay_s_json_depth_cannot_name_another_model(
    relay: Start,
) -> None:
    """A tool's JSON Schema may nest deep; past 100 levels the relay reads no model in the
    body (so it lets the call through) while the endpoint reads it whole."""
    deep: Any = {"type": "string"}
    for _ in range(120):
        deep = {"type": "object", "properties": {"x": deep}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": deep}}]
    with ScriptedModel(lambda request: answer("served"), api_key=KEY) as server:
        _, client = relay(server.url)
        token = grant(client)
        reply = httpx.post(
            f"{client.host_url}/chat/completions",
            json=chat_body(OTHER, tools=tools),
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        served = [request.body["model"] for request in server.requests]
    assert reply.status_code == 403, reply.text[:200]
    assert served == []


@pytest.mark.parametrize(
    "how",
    [
        {"stream": 1},  # lax servers (pydantic's default mode: vLLM) read it as true
        {"stream": "true"},
        {"stream": True, "tools": "deep"},  # too deep for the relay to add include_usage
    ],
    ids=["stream-1", "stream-string", "stream-deep-body"],
)
def test_a_streamed_chat_call_cannot_be_made_to_carry_no_usage(
    relay: Start, how: dict[str, Any]
) -> None:
    """The relay asks a streamed Chat Completions call for its usage only when it reads
    `"stream": true` in a body it can parse; an endpoint that streams anyway sends no
    counts, and the call is counted as 0 tokens."""
    extra = dict(how)
    if extra.get("tools") == "deep":
        deep: Any = {"type": "string"}
        for _ in range(120):
            deep = {"type": "object", "properties": {"x": deep}}
        extra["tools"] = [{"type": "function", "function": {"name": "f", "parameters": deep}}]
    with ScriptedModel(lambda request: answer("streamed", usage=(600, 500)), api_key=KEY) as server:
        _, client = relay(server.url, max_tokens=1000)
        token = grant(client)
        replies = [
            httpx.post(
                f"{client.host_url}/chat/completions",
                json=chat_body(**extra),
                headers={"Authorization": f"Bearer {token}"},
                timeout=30,
            )
            for _ in range(3)
        ]
        counts = client.report(token).counts
        served = len(server.requests)
    if replies[0].status_code == 400:
        # A `stream` that is not a boolean is refused before any endpoint reads it.
        assert "`stream` is true or false" in replies[0].text
        assert served == 0
        return
    assert "data: " in replies[0].text  # it was streamed
    assert counts.prompt_tokens + counts.completion_tokens >= 1100
    # The budget (1000 tokens) stops the second call.
    assert served == 1, f"{served} calls served past a 1000-token cap, counted {counts}"


def test_expect_100_continue_does_not_hand_one_episode_s_answer_to_another(
    relay: Start,
) -> None:
    """`Expect: 100-continue` is passed on; the endpoint's interim `100 Continue` is taken
    for the answer, and the real answer is left on the pooled connection: the agent's call
    is counted as nothing and the next call, another episode's, gets its answer."""

    def script(request: ChatRequest) -> Reply:
        return answer(f"answer to {request.last['content']}", usage=(600, 500))

    with ScriptedModel(script, api_key=KEY) as server:
        _, client = relay(server.url)
        agent, other = grant(client), grant(client, cassette="set/other__r0")
        body = json.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": "the agent"}]}
        ).encode()
        got = raw(
            client.address.port,
            request("POST", "/v1/chat/completions", agent, body, headers=("Expect: 100-continue",)),
            # Until the agent has its answer, however slow the machine: a read cut short
            # leaves the call half taken, which is not this attack.
            read_for=15.0,
            until=b"answer to the agent",
        )
        innocent = httpx.post(
            f"{client.host_url}/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "the other"}]},
            headers={"Authorization": f"Bearer {other}"},
            timeout=30,
        )
        agent_counts = client.report(agent).counts
    assert innocent.json()["choices"][0]["message"]["content"] == "answer to the other", (
        innocent.text
    )
    assert (agent_counts.prompt_tokens, agent_counts.completion_tokens) == (600, 500), (
        f"the agent's call counted {agent_counts}; it got {got[:120]!r}"
    )


def test_a_bare_lf_in_a_header_cannot_smuggle_a_second_request_with_the_key(
    relay: Start,
) -> None:
    """The relay splits header lines on CRLF only and passes a value's bare LF on; an
    endpoint that ends lines at LF (Python's http.server, h11, many others) then reads a
    second request, carrying the relay's key, whose line and body the agent wrote: a call
    of another model that the relay never checked nor counted, its answer left for the
    next call on that pooled connection."""
    with ScriptedModel(lambda request: answer("smuggled", usage=(600, 500)), api_key=KEY) as server:
        _, client = relay(server.url, max_tokens=1000)
        token = grant(client)
        smuggle = "X-Note: a\n\nPOST /v1/chat/completions HTTP/1.1\nX-Pad: b"
        body = json.dumps(chat_body(OTHER)).encode()
        first = raw(
            client.address.port,
            request("GET", "/v1/models", token, body, headers=(smuggle,)),
            until=b"}",
        )
        # The smuggled call's answer waits on the pooled connection: the agent's next
        # request, one the relay does not count, collects it.
        second = raw(client.address.port, request("GET", "/v1/models", token), until=b"}}")
        served = [request.body["model"] for request in server.requests]
        counts = client.report(token).counts
    assert served == [], (
        f"the endpoint served {served} (counted {counts}); the agent got "
        f"{first[:60]!r} then {second[:200]!r}"
    )


def test_one_agent_s_idle_connections_do_not_starve_other_episodes(relay: Start) -> None:
    """The relay has no read timeout and no cap on a client's connections: connections
    that send nothing are held for ever, each a file descriptor. With the common soft
    limit (1024 descriptors), one agent's idle sockets leave none for another episode's
    call or for the relay's own connection to the endpoint."""
    with ScriptedModel(lambda request: answer("ok"), api_key=KEY) as server:
        process, client = relay(server.url)
        resource.prlimit(process.process.pid, resource.RLIMIT_NOFILE, (1024, 1024))
        other = grant(client, cassette="set/other__r0")
        held: list[socket.socket] = []
        try:
            for _ in range(1100):
                try:
                    held.append(socket.create_connection(("127.0.0.1", client.address.port)))
                except OSError:
                    break
            time.sleep(0.5)
            status = another_call(client, other, 10)
        finally:
            for sock in held:
                sock.close()
    assert status == 200, f"another episode's call failed: {status}"


def test_concurrent_calls_do_not_take_the_run_far_past_its_budget(relay: Start) -> None:
    """The budget is checked when a call arrives, and a call is counted when its answer
    ends: an agent that sends many calls at once has every one served, whatever the cap."""

    def script(request: ChatRequest) -> Reply:
        return Reply(body=answer("x", usage=(600, 500)).body, delay_s=1.0)

    with ScriptedModel(script, api_key=KEY) as server:
        _, client = relay(server.url, max_tokens=1000)
        token = grant(client)

        def call() -> None:
            httpx.post(
                f"{client.host_url}/chat/completions",
                json=chat_body(),
                headers={"Authorization": f"Bearer {token}"},
                timeout=30,
            )

        threads = [threading.Thread(target=call) for _ in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        spent = client.spend().counts.tokens
    # One call past the cap is "a little past it"; twenty is the agent's choice.
    assert spent <= 2 * 1100, f"{spent} tokens spent under a 1000-token cap"


def test_a_call_still_running_when_its_token_ends_is_cut_or_counted_in_its_last_report(
    relay: Start,
) -> None:
    """The engine ends a token and takes its last report when the attempt ends; a call
    made before, still running, is served after the token died and charged to books no
    row reads: the row shows less than the agent spent."""

    def script(request: ChatRequest) -> Reply:
        return Reply(body=answer("late", usage=(600, 500)).body, delay_s=1.5)

    with ScriptedModel(script, api_key=KEY) as server:
        _, client = relay(server.url)
        token = grant(client)
        got: list[httpx.Response] = []

        def call() -> None:
            with contextlib.suppress(httpx.HTTPError):  # a call cut short ends so
                got.append(
                    httpx.post(
                        f"{client.host_url}/chat/completions",
                        json=chat_body(),
                        headers={"Authorization": f"Bearer {token}"},
                        timeout=30,
                    )
                )

        thread = threading.Thread(target=call)
        thread.start()
        time.sleep(0.5)
        last = client.end(token)
        thread.join()
        run = client.spend().counts
    served_after_end = bool(got) and got[0].status_code == 200
    # Ended with its token, the call is counted in the token's last report all the same.
    assert last.counts.requests == 1 == run.requests
    assert not served_after_end or last.counts.requests == 1, (
        f"served after the token ended; its last report counts {last.counts.requests} "
        f"calls, the run {run.requests}"
    )


def test_a_token_reaches_no_path_of_the_endpoint_s_host_outside_the_model_api(
    relay: Start,
) -> None:
    """A path outside the relay's base goes to the endpoint's root with the key: a no-network
    agent reaches every path of the endpoint's host (a local server's admin or metrics
    pages, for a model served on this machine), as the run's key holder."""
    with RoutingModel() as server:
        _, client = relay(server.url)
        token = grant(client)
        got = raw(client.address.port, request("GET", "/admin/status", token), until=b"}")
        gets = list(server.gets)
    assert gets == [], f"the endpoint's host served {gets}: {got[-60:]!r}"


def test_an_unauthenticated_body_is_not_held_in_the_relay_s_memory(relay: Start) -> None:
    """The relay reads a whole request body (up to 64 MiB) before it looks at the token,
    and any number of connections may do so at once: whoever reaches the relay can make
    it hold connections x 64 MiB, until it is killed for its memory with every episode's
    calls."""
    with ScriptedModel(lambda request: answer("ok"), api_key=KEY) as server:
        process, client = relay(server.url)
        pid = process.process.pid

        def peak_mib() -> int:
            status = Path(f"/proc/{pid}/status").read_text()
            return int(re.search(r"VmHWM:\s+(\d+) kB", status)[1]) // 1024  # type: ignore[index]

        before = peak_mib()
        size = 60 * 1024 * 1024
        head = request("POST", "/v1/chat/completions", "hbr-not-a-token")
        head = head.replace(b"Content-Length: 0", f"Content-Length: {size}".encode())
        block = b" " * (1024 * 1024)

        def send() -> None:
            with socket.create_connection(("127.0.0.1", client.address.port)) as sock:
                sock.sendall(head)
                with contextlib.suppress(OSError):
                    for _ in range(60):
                        sock.sendall(block)
                    sock.recv(100)

        threads = [threading.Thread(target=send) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        grown = peak_mib() - before
    assert grown < 64, f"the relay's memory grew by {grown} MiB for 4 requests with no token"


# ====================================================================== guarantees that held


def test_content_length_and_chunked_together_smuggle_nothing_upstream(relay: Start) -> None:
    """A request with both framings is read by its chunks and sent on re-framed by its
    length: the bytes the other reading would take for a second request are the body of
    the first, and never reach the endpoint as a request of their own."""
    with ScriptedModel(lambda request: answer("ok", usage=(10, 5)), api_key=KEY) as server:
        _, client = relay(server.url)
        token = grant(client)
        smuggled = request(
            "POST", "/v1/chat/completions", token, json.dumps(chat_body(OTHER)).encode()
        )
        body = json.dumps(chat_body()).encode()
        data = (
            request(
                "POST",
                "/v1/chat/completions",
                token,
                headers=("Transfer-Encoding: chunked",),
            ).replace(b"Content-Length: 0", f"Content-Length: {len(body) + 7}".encode())
            + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
            + smuggled
        )
        got = raw(client.address.port, data, until=b"HTTP/1.1 403")
        served = [request.body["model"] for request in server.requests]
    assert served == [MODEL]
    assert b"HTTP/1.1 403" in got  # the pipelined second request was checked on its own


def test_an_absolute_target_naming_another_host_goes_to_the_endpoint_alone(relay: Start) -> None:
    with (
        ScriptedModel(lambda request: answer("ok"), api_key=KEY) as server,
        RoutingModel() as other,
    ):
        _, client = relay(server.url)
        token = grant(client)
        host = other.url.removesuffix("/v1")
        body = json.dumps(chat_body()).encode()
        got = raw(
            client.address.port,
            request("POST", f"{host}/v1/chat/completions", token, body).replace(
                b"Host: model.pytest-harbor.internal", f"Host: {host[7:]}".encode()
            ),
            until=b"}}",
        )
        assert got.startswith(b"HTTP/1.1 200")
        assert len(server.requests) == 1
        assert other.calls == [] and other.gets == []


def test_an_agent_that_drops_a_stream_midway_is_counted_all_the_same(relay: Start) -> None:
    with ScriptedModel(
        lambda request: answer("x" * 200_000, usage=(600, 500)), api_key=KEY
    ) as server:
        _, client = relay(server.url)
        token = grant(client)
        body = json.dumps(chat_body(stream=True)).encode()
        with socket.create_connection(("127.0.0.1", client.address.port)) as sock:
            sock.sendall(request("POST", "/v1/chat/completions", token, body))
            sock.recv(10)
        deadline = time.monotonic() + 10
        while client.report(token).counts.requests == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        counts = client.report(token).counts
        assert len(server.requests) == 1
    assert (counts.prompt_tokens, counts.completion_tokens) == (600, 500)


def test_a_replay_never_calls_the_endpoint_whatever_the_request(
    relay: Start, tmp_path: Path
) -> None:
    """In a replay the tricks that take a call past the relay's books (a trailing slash,
    another path, Expect, a smuggled header) reach no endpoint: each is answered from the
    cassettes or missed."""
    with ScriptedModel(lambda request: answer("live"), api_key=KEY) as server:
        _, client = relay(server.url, replay=str(tmp_path / "none"))
        token = grant(client)
        body = json.dumps(chat_body(OTHER)).encode()
        for data in (
            request("POST", "/v1/chat/completions/", token, body),
            request("POST", "/v1/completions", token, body),
            request(
                "POST",
                "/v1/chat/completions",
                token,
                json.dumps(chat_body()).encode(),
                headers=("Expect: 100-continue",),
            ),
            request(
                "GET",
                "/v1/models",
                token,
                body,
                headers=("X-Note: a\n\nPOST /v1/chat/completions HTTP/1.1\nX-Pad: b",),
            ),
        ):
            got = raw(client.address.port, data, until=b"}}")
            # Missed (424), refused (403: not a path the relay serves), or the connection
            # closed (a head that is not HTTP): never answered by the endpoint.
            got = got.removeprefix(b"HTTP/1.1 100 Continue\r\n\r\n")
            assert got == b"" or got.startswith((b"HTTP/1.1 424", b"HTTP/1.1 403")), got[:100]
        assert server.requests == [] and server.model_list_requests == 0
