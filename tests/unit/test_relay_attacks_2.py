"""The model relay attacked again at the wire by the agent it serves (the harness is
test_relay_attacks.py's): a request begun while its token served and finished after, the
budget's expectation driven down before a burst, members a Go or ASP.NET endpoint reads in
another case, background responses, a reader that stops reading, connections held inside
a body, bodies that cost the relay many times their size, an endpoint error the relay
records for a call it never sent."""

from __future__ import annotations

import json
import re
import resource
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.local_server import LocalServer, QuietHandler
from tests.model_server import ChatRequest, Reply, ScriptedModel, answer
from tests.relay_fixture import another_call
from tests.unit.test_relay_attacks import (
    KEY,
    MODEL,
    OTHER,
    Start,
    chat_body,
    grant,
    raw,
    request,
)


def _post(url: str, token: str, body: dict[str, Any], timeout: float = 30) -> httpx.Response:
    return httpx.post(
        f"{url}/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
        timeout=timeout,
    )


class FoldingModel(LocalServer):
    """A Chat Completions endpoint that reads a request's members as Go's encoding/json
    (Ollama, LocalAI and other Go servers) and ASP.NET Core's web defaults do: a member
    name matches its field whatever its case, the last one given wins. Each call is
    answered with `usage` (600 prompt and 500 completion tokens), streamed when asked, the
    usage chunk only when `stream_options.include_usage` asks; `calls` keeps (model,
    stream) of each served."""

    FIELDS = ("model", "stream", "stream_options", "include_usage", "messages")

    def __init__(self) -> None:
        self.calls: list[tuple[Any, Any]] = []
        super().__init__()

    @classmethod
    def fold(cls, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        read: dict[str, Any] = {}
        for name, value in pairs:
            field = next((f for f in cls.FIELDS if f == name.lower()), name)
            read[field] = value
        return read

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Authorization") != f"Bearer {KEY}":
                    self.send_payload(401, b'{"error":{"type":"invalid_api_key"}}')
                    return
                body = json.loads(data, object_pairs_hook=FoldingModel.fold)
                model, stream = body.get("model"), body.get("stream")
                server.calls.append((model, stream))
                usage = {"prompt_tokens": 600, "completion_tokens": 500, "total_tokens": 1100}
                base = {"id": "c", "created": 0, "model": model}
                if stream is True:
                    chunk = {**base, "object": "chat.completion.chunk"}
                    events = [{**chunk, "choices": [{"index": 0, "delta": {"content": "served"}}]}]
                    if (body.get("stream_options") or {}).get("include_usage") is True:
                        events.append({**chunk, "choices": [], "usage": usage})
                    payload = b"".join(b"data: %s\n\n" % json.dumps(e).encode() for e in events)
                    self.send_payload(200, payload + b"data: [DONE]\n\n", "text/event-stream")
                    return
                message = {"role": "assistant", "content": "served"}
                choice = {"index": 0, "message": message, "finish_reason": "stop"}
                reply = {**base, "object": "chat.completion", "choices": [choice], "usage": usage}
                self.send_payload(200, json.dumps(reply).encode())

        return Handler


class BackgroundResponses(LocalServer):
    """OpenAI's Responses API as it serves `background: true`: the call is answered at once
    (`status: queued`, no usage yet) and the model works on at the endpoint, billed when it
    ends (a later call's `previous_response_id` reads its output). Every response takes
    600 input and 500 output tokens; `billed` sums what the endpoint charged the key."""

    def __init__(self) -> None:
        self.billed = 0
        super().__init__()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Authorization") != f"Bearer {KEY}":
                    self.send_payload(401, b'{"error":{"type":"invalid_api_key"}}')
                    return
                body = json.loads(data)
                server.billed += 1100
                usage = {"input_tokens": 600, "output_tokens": 500, "total_tokens": 1100}
                reply: dict[str, Any] = {
                    "id": f"resp_{server.billed}",
                    "object": "response",
                    "model": body.get("model"),
                }
                if body.get("background") is True:
                    reply |= {"status": "queued", "background": True, "output": [], "usage": None}
                else:
                    reply |= {"status": "completed", "output": [], "usage": usage}
                self.send_payload(200, json.dumps(reply).encode())

        return Handler


# ====================================================================== broken guarantees


def test_a_request_whose_body_comes_after_its_token_closed_is_not_served(relay: Start) -> None:
    """The token is checked on a request's head; a body that arrives after the engine
    closed the token (the agent's turn over, the verifier at work) or ended it (the
    attempt over) is read and the call served all the same."""
    with ScriptedModel(lambda request: answer("late", usage=(600, 500)), api_key=KEY) as server:
        _, client = relay(server.url)
        token = grant(client)
        body = json.dumps(chat_body()).encode()
        with socket.create_connection(("127.0.0.1", client.address.port), timeout=5) as sock:
            sock.sendall(request("POST", "/v1/chat/completions", token, body)[:-1])
            time.sleep(0.3)
            last = client.end(token)
            sock.sendall(body[-1:])
            got = b""
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline and b"}}" not in got:
                try:
                    piece = sock.recv(65536)
                except TimeoutError:
                    break
                if not piece:
                    break
                got += piece
        served = len(server.requests)
        run = client.spend().counts
    assert served == 0, (
        f"served after its token ended ({got[:12]!r}); its last report counts "
        f"{last.counts.requests} calls, the run {run.requests}"
    )


def test_cheap_calls_first_do_not_let_a_burst_pass_the_budget(relay: Start) -> None:
    """A call is admitted while the spend and the calls under way, each expected to take
    the mean of the run's calls so far, stay under the cap. The agent sets that mean: a
    run of tiny calls (a one-token answer to a one-word prompt) brings it near zero, and
    then every call of a burst of large ones is expected to take nothing, and is admitted
    at once."""

    def script(request: ChatRequest) -> Reply:
        if request.last["content"] == "tiny":
            return answer("k", usage=(1, 1))
        return Reply(body=answer("x", usage=(600, 500)).body, delay_s=1.0)

    with ScriptedModel(script, api_key=KEY) as server:
        _, client = relay(server.url, max_tokens=5000)
        token = grant(client)
        tiny = {"model": MODEL, "messages": [{"role": "user", "content": "tiny"}]}
        with httpx.Client(timeout=30) as http:
            for _ in range(100):
                http.post(
                    f"{client.host_url}/chat/completions",
                    json=tiny,
                    headers={"Authorization": f"Bearer {token}"},
                )
        before = client.spend().counts.tokens

        def call() -> None:
            _post(client.host_url, token, chat_body())

        threads = [threading.Thread(target=call) for _ in range(30)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        spent = client.spend().counts.tokens
    # One large call past the cap is "about one call's worth"; thirty is the agent's.
    assert spent <= 5000 + 2 * 1100, (
        f"{spent} tokens spent under a 5000-token cap ({before} by the tiny calls)"
    )


def test_a_member_named_in_another_case_does_not_call_another_model(relay: Start) -> None:
    """The relay reads `model` by its exact name; Go's encoding/json (Ollama, LocalAI) and
    ASP.NET Core match `Model` or `MODEL` to the same field, the last one winning: the
    relay checks one model and the endpoint serves another, with the run's key."""
    with FoldingModel() as server:
        _, client = relay(server.url)
        token = grant(client)
        body = b'{"model":"%s","messages":[{"role":"user","content":"hi"}],"Model":"%s"}' % (
            MODEL.encode(),
            OTHER.encode(),
        )
        got = raw(
            client.address.port, request("POST", "/v1/chat/completions", token, body), until=b"}}"
        )
        calls = list(server.calls)
    assert all(model == MODEL for model, _ in calls), f"the endpoint served {calls}: {got[:12]!r}"


def test_a_stream_named_in_another_case_still_carries_usage(relay: Start) -> None:
    """`"stream": false, "Stream": true` is a call the relay takes for unstreamed (so it
    asks no usage of it) and a Go endpoint streams without counts: served, and counted as
    an estimate from its bytes, flagged as the endpoint's missing counts."""
    with FoldingModel() as server:
        _, client = relay(server.url)
        token = grant(client)
        body = b'{"model":"%s","messages":[{"role":"user","content":"hi"}],' % MODEL.encode()
        body += b'"stream":false,"STREAM":true}'
        got = raw(
            client.address.port,
            request("POST", "/v1/chat/completions", token, body),
            until=b"[DONE]\n\n",
        )
        counts = client.report(token).counts
        calls = list(server.calls)
    if got.startswith(b"HTTP/1.1 400"):
        # Names equal but for their case are refused before any endpoint reads them.
        assert calls == [] and b"a member twice" in got
        return
    assert b"data: " not in got or counts.estimated == 0, (
        f"streamed ({calls}) with no usage asked: counted {counts}"
    )
    assert (counts.prompt_tokens, counts.completion_tokens) == (600, 500), counts


def test_an_agent_that_stops_reading_its_answer_does_not_stall_other_episodes(
    relay: Start,
) -> None:
    """The relay passes an answer on at the pace its harness reads it, with no time limit,
    and counts the call only once it passed whole. An agent that asks a long answer and
    reads none of it holds its call under way for as long as it likes; under a budget,
    before any call was counted, calls go one at a time: every other episode's call waits
    for it."""
    big = "x" * 8_000_000

    def script(request: ChatRequest) -> Reply:
        text = big if request.last["content"] == "long" else "short"
        return answer(text, usage=(600, 500))

    with ScriptedModel(script, api_key=KEY) as server:
        _, client = relay(server.url, max_tokens=1_000_000)
        agent, other = grant(client), grant(client, cassette="set/other__r0")
        body = json.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": "long"}]}
        ).encode()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", client.address.port))
        try:
            sock.sendall(request("POST", "/v1/chat/completions", agent, body))
            time.sleep(1.0)
            started = time.monotonic()
            status = another_call(client, other, 5)
            took = time.monotonic() - started
        finally:
            sock.close()
    assert status == 200, f"another episode's call: {status} after {took:.1f} s"


def test_connections_held_inside_a_body_do_not_starve_other_episodes(relay: Start) -> None:
    """The relay closes the longest-idle connections when it nears its file limit, and
    caps a token's calls at once, but a connection whose head was read and whose body is
    still coming is neither idle nor a call: one agent holds as many as it likes (each
    for up to two minutes, and again), and another episode finds no file left."""
    with ScriptedModel(lambda request: answer("ok"), api_key=KEY) as server:
        process, client = relay(server.url)
        resource.prlimit(process.process.pid, resource.RLIMIT_NOFILE, (1024, 1024))
        agent, other = grant(client), grant(client, cassette="set/other__r0")
        head = request("POST", "/v1/chat/completions", agent).replace(
            b"Content-Length: 0", b"Content-Length: 100"
        )
        held: list[socket.socket] = []
        try:
            for _ in range(1200):
                try:
                    sock = socket.create_connection(("127.0.0.1", client.address.port), 1)
                    sock.sendall(head + b"{")
                    held.append(sock)
                except OSError:
                    break
                time.sleep(0.002)  # its head read before the next comes
            status = another_call(client, other, 5)
        finally:
            for sock in held:
                sock.close()
    assert status == 200, f"another episode's call failed: {status}"


def test_a_background_response_is_not_a_call_the_budget_never_sees(relay: Start) -> None:
    """`background: true` has the Responses API answer at once with no usage and bill the
    work when it ends, at the endpoint: the relay counts each such call from the few
    bytes of its answer, and an agent runs as many as it likes past the cap."""
    with BackgroundResponses() as server:
        _, client = relay(server.url, max_tokens=5000)
        token = grant(client)
        body = {"model": MODEL, "input": "write a long essay", "background": True}
        with httpx.Client(timeout=30) as http:
            statuses = [
                http.post(
                    f"{client.host_url}/responses",
                    json=body,
                    headers={"Authorization": f"Bearer {token}"},
                ).status_code
                for _ in range(20)
            ]
        counted = client.spend().counts
        billed = server.billed
    assert billed <= 5000 + 1100, (
        f"the endpoint billed {billed} tokens under a 5000-token cap; the relay counted "
        f"{counted.tokens} ({counted.estimated} estimated calls); answers {set(statuses)}"
    )


def _many_objects(size: int) -> bytes:
    """A call's body of `size` bytes, most of them a list of empty objects."""
    start = b'{"model":"%s","messages":[{"role":"user","content":"hi"}],"x":[' % MODEL.encode()
    return start + b"{}," * ((size - len(start)) // 3) + b"{}]}"


def _one_byte_chunks(size: int) -> bytes:
    """A call's body of about `size` bytes sent in chunks of one byte."""
    body = json.dumps(chat_body(x=" " * size)).encode()
    return b"".join(b"1\r\n%c\r\n" % byte for byte in body) + b"0\r\n\r\n"


@pytest.mark.parametrize(
    ("size", "framing"),
    [(16 << 20, "length"), (512 << 10, "chunks")],
    ids=["json-of-empty-objects", "one-byte-chunks"],
)
def test_a_body_costs_the_relay_about_its_size_in_memory(
    relay: Start, size: int, framing: str
) -> None:
    """The relay caps a body at 64 MiB, but what it holds for one is not its size: every
    chunk of a chunked body is kept as an object of its own (a byte of body costs some 80
    in the relay), and a body is parsed whole into Python objects to find its members (an
    empty object, three bytes, costs some 70). One agent's request takes the relay's
    memory by gigabytes, the memory every episode's calls share."""
    with ScriptedModel(lambda request: answer("ok"), api_key=KEY) as server:
        process, client = relay(server.url)
        token = grant(client)
        pid = process.process.pid

        def peak_mib() -> int:
            status = Path(f"/proc/{pid}/status").read_text()
            return int(re.search(r"VmHWM:\s+(\d+) kB", status)[1]) // 1024  # type: ignore[index]

        before = peak_mib()
        if framing == "length":
            data = request("POST", "/v1/chat/completions", token, _many_objects(size))
        else:
            data = request(
                "POST", "/v1/chat/completions", token, headers=("Transfer-Encoding: chunked",)
            ).replace(b"Content-Length: 0\r\n", b"") + _one_byte_chunks(size)
        got = raw(client.address.port, data, read_for=8.0, until=b"}}")
        grown = peak_mib() - before
    # Served, or refused for holding more objects and arrays than a call may (before
    # the relay parsed it); either way the relay held about the body's size.
    assert got.startswith((b"HTTP/1.1 200", b"HTTP/1.1 413")), got[:100]
    assert grown <= 4 * size / 2**20 + 16, f"the relay grew by {grown} MiB for {size >> 10} KiB"


def test_an_agent_cannot_make_the_relay_record_an_endpoint_error(relay: Start) -> None:
    """A call the relay could not send on is recorded as `api_error`, the endpoint's
    failure (an episode the engine retries, not the agent's crash). The agent makes the
    relay unable to: connections held inside a body take the relay's files, and its own
    call, begun first, then finds none for the endpoint's connection."""
    with ScriptedModel(lambda request: answer("ok"), api_key=KEY) as server:
        process, client = relay(server.url)
        resource.prlimit(process.process.pid, resource.RLIMIT_NOFILE, (1024, 1024))
        token = grant(client)
        body = json.dumps(chat_body()).encode()
        call = socket.create_connection(("127.0.0.1", client.address.port))
        call.sendall(request("POST", "/v1/chat/completions", token, body)[:-1])
        head = request("POST", "/v1/chat/completions", token).replace(
            b"Content-Length: 0", b"Content-Length: 100"
        )
        held: list[socket.socket] = [call]
        try:
            for _ in range(1200):
                try:
                    sock = socket.create_connection(("127.0.0.1", client.address.port), 1)
                    sock.sendall(head + b"{")
                    held.append(sock)
                except OSError:
                    break
                time.sleep(0.002)
            call.settimeout(5)
            call.sendall(body[-1:])
            got = call.recv(65536)
        finally:
            for sock in held:
                sock.close()
        report = client.report(token)
        served = len(server.requests)
    assert report.causes == (), (
        f"recorded {report.causes} with the endpoint asked {served} times: {got[:12]!r}"
    )


# ====================================================================== guarantees that held


def test_calls_pipelined_on_one_connection_are_each_checked_and_counted(relay: Start) -> None:
    """Several requests in one write, framed by length and by chunks, a HEAD among them:
    each call is read on its own, the other model's refused, the rest counted."""
    with ScriptedModel(lambda request: answer("ok", usage=(600, 500)), api_key=KEY) as server:
        _, client = relay(server.url)
        token = grant(client)
        body = json.dumps(chat_body()).encode()
        chunked = request(
            "POST", "/v1/chat/completions", token, headers=("Transfer-Encoding: chunked",)
        ).replace(b"Content-Length: 0\r\n", b"")
        data = (
            request("POST", "/v1/chat/completions", token, body)
            + chunked
            + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
            + request("POST", "/v1/chat/completions", token, json.dumps(chat_body(OTHER)).encode())
            + request("HEAD", "/v1/chat/completions", token, body)
        )
        got = raw(client.address.port, data, read_for=5.0)
        counts = client.report(token).counts
        served = [request.body["model"] for request in server.requests]
    assert served == [MODEL, MODEL]
    assert (counts.requests, counts.tokens) == (2, 2200), counts
    statuses = re.findall(rb"HTTP/1.1 (\d+)", got)
    assert statuses == [b"200", b"200", b"403", b"403"], statuses
