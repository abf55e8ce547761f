"""The model relay's process, against the scripted model servers on 127.0.0.1: a call
needs a token the run granted, goes upstream with the real key, is counted and priced by
the relay from the answer, shows its cause, stops at the budget, and is recorded and
replayed without the endpoint."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from pytest_harbor.relay import RelayClient
from pytest_harbor.relay.control import _sweep_stale_folders
from tests.anthropic_server import MessagesRequest, ScriptedMessages, text
from tests.model_server import ChatRequest, Reply, ScriptedModel, answer, error
from tests.relay_fixture import KEY, MODEL, Start, grant
from tests.responses_server import ResponsesRequest, ScriptedResponses, message


def chat(client: RelayClient, token: str, **body: Any) -> httpx.Response:
    payload = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **body}
    return httpx.post(
        f"{client.host_url}/chat/completions",
        json=payload,
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )


def chat_server(script: Callable[[ChatRequest], Reply]) -> ScriptedModel:
    return ScriptedModel(script, api_key=KEY)


def test_a_call_goes_upstream_with_the_real_key_and_is_counted_by_the_relay(
    relay: Start,
) -> None:
    with chat_server(lambda request: answer("done", usage=(120, 10))) as server:
        _, client = relay(server.url)
        token = grant(client)
        reply = chat(client, token)
        assert reply.status_code == 200
        assert reply.json()["choices"][0]["message"]["content"] == "done"
        # The endpoint saw the key, never the token.
        headers = {name.lower(): value for name, value in server.requests[0].headers.items()}
        assert headers["authorization"] == f"Bearer {KEY}"
        assert token not in json.dumps(server.requests[0].headers)
        report = client.report(token)
    assert report.counts.requests == 1
    assert (report.counts.prompt_tokens, report.counts.completion_tokens) == (120, 10)
    assert client.spend().counts.requests == 1


def test_a_call_without_a_granted_token_is_refused_and_never_reaches_the_endpoint(
    relay: Start,
) -> None:
    with chat_server(lambda request: answer("done")) as server:
        _, client = relay(server.url)
        token = grant(client)
        assert chat(client, "not-a-token").status_code == 401
        assert chat(client, KEY).status_code == 401
        client.end(token)
        assert chat(client, token).status_code == 401  # dead once its episode ended
        assert server.requests == []


def test_a_token_calls_its_own_model_only(relay: Start) -> None:
    with chat_server(lambda request: answer("done")) as server:
        _, client = relay(server.url)
        token = grant(client)
        refused = chat(client, token, model="gpt-5-expensive")
        assert refused.status_code == 403
        assert server.requests == []
        assert client.report(token).refused == (
            "this token calls 'scripted-model' only, not 'gpt-5-expensive'",
        )


def test_a_streamed_chat_answer_is_counted_the_relay_asking_for_its_usage(relay: Start) -> None:
    with chat_server(lambda request: answer("streamed", usage=(300, 40))) as server:
        _, client = relay(server.url)
        token = grant(client)
        reply = chat(client, token, stream=True)
        assert reply.status_code == 200
        assert "streamed" in reply.text
        assert server.requests[0].body["stream_options"] == {"include_usage": True}
        counts = client.report(token).counts
    assert (counts.prompt_tokens, counts.completion_tokens, counts.requests) == (300, 40, 1)


def test_an_anthropic_stream_is_counted_with_the_key_in_its_own_header(relay: Start) -> None:
    def script(request: MessagesRequest) -> Any:
        return text("hello from messages")

    with ScriptedMessages(script, api_key=KEY) as server:
        _, client = relay(server.url, prices=None)
        token = grant(client, model="claude-sonnet-4-5")
        reply = httpx.post(
            f"{client.host_url}/messages",
            json={
                "model": "claude-sonnet-4-5",
                "max_tokens": 100,
                "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
            },
            headers={"x-api-key": token, "anthropic-version": "2023-06-01"},
            timeout=30,
        )
        assert reply.status_code == 200, reply.text
        assert "hello from messages" in reply.text
        counts = client.report(token).counts
    assert counts.requests == 1
    assert counts.prompt_tokens > 0 and counts.completion_tokens > 0
    # Priced by the shipped table (claude-sonnet-4-5 is in it).
    assert counts.cost_usd > 0 and counts.unpriced == 0


def test_a_responses_call_is_counted(relay: Start) -> None:
    def script(request: ResponsesRequest) -> Any:
        return message("from responses")

    with ScriptedResponses(script, api_key=KEY) as server:
        _, client = relay(server.url)
        token = grant(client, model="gpt-5")
        reply = httpx.post(
            f"{client.host_url}/responses",
            json={"model": "gpt-5", "input": "hi", "stream": True},
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        assert reply.status_code == 200, reply.text
        counts = client.report(token).counts
    assert counts.requests == 1 and counts.prompt_tokens > 0


@pytest.mark.parametrize(
    ("reply", "cause"),
    [
        (error(429, "slow down", kind="rate_limit_error"), "rate_limited"),
        (error(503, "overloaded", kind="server_error"), "api_error"),
        (
            error(
                400,
                "This model's maximum context length is 8192 tokens",
                code="context_length_exceeded",
            ),
            "context_length_exceeded",
        ),
    ],
)
def test_the_cause_of_a_failed_call_is_what_the_relay_saw(
    relay: Start, reply: Reply, cause: str
) -> None:
    with chat_server(lambda request: reply) as server:
        _, client = relay(server.url)
        token = grant(client)
        assert chat(client, token).status_code == reply.status
        report = client.report(token)
    assert [seen for seen, _ in report.causes] == [cause]
    # What the endpoint said, kept so that the run can show it as it happens.
    assert report.errors == ((reply.status, reply.body["error"]["message"]),)


def test_an_endpoint_that_does_not_answer_is_an_api_error(relay: Start) -> None:
    _, client = relay("http://127.0.0.1:9/v1")
    token = grant(client)
    reply = chat(client, token)
    assert reply.status_code == 502
    assert KEY not in reply.text
    report = client.report(token)
    assert [seen for seen, _ in report.causes] == ["api_error"]
    [(status, words)] = report.errors
    assert status is None and words.startswith("the endpoint did not answer") and KEY not in words


def test_the_budget_stops_every_further_call(relay: Start) -> None:
    with chat_server(lambda request: answer("done", usage=(600, 500))) as server:
        _, client = relay(server.url, max_tokens=1000)
        first, second = grant(client), grant(client, cassette="set/other__r0")
        assert chat(client, first).status_code == 200
        assert client.spend().budget_reached is not None
        refused = chat(client, second)
        assert refused.status_code == 402
        assert "budget" in refused.json()["error"]["message"]
        assert len(server.requests) == 1
        assert client.report(second).refused_for_budget == 1


def test_a_recorded_run_is_replayed_without_the_endpoint_or_the_key(
    relay: Start, tmp_path: Path
) -> None:
    cassettes = tmp_path / "cassettes"
    replies = iter([answer("first"), answer("second")])
    with chat_server(lambda request: next(replies)) as server:
        recording, client = relay(server.url, record=str(cassettes))
        token = grant(client)
        said = [chat(client, token).json(), chat(client, token, stream=True).text]
        recording.stop()
    files = list(cassettes.rglob("*.jsonl"))
    assert [path.relative_to(cassettes).as_posix() for path in files] == ["set/task__r0.jsonl"]
    assert KEY not in files[0].read_text()
    # The endpoint is gone, and the replay has no key.
    _, replay = relay("http://127.0.0.1:9/v1", api_key=None, replay=str(cassettes))
    token = grant(replay)
    again = [chat(replay, token).json(), chat(replay, token, stream=True).text]
    assert again == said
    assert replay.report(token).counts.requests == 2
    missed = chat(replay, token, messages=[{"role": "user", "content": "never asked"}])
    assert missed.status_code == 424
    misses = replay.report(token).replay_misses
    assert len(misses) == 1 and misses[0].startswith("POST /v1/chat/completions")


def test_a_recording_keeps_no_secret_an_answer_carries(relay: Start, tmp_path: Path) -> None:
    secret = "hunter2-the-run-secret"
    with chat_server(lambda request: answer(f"the key is {KEY} and {secret}")) as server:
        recording, client = relay(server.url, record=str(tmp_path), masked=(secret,))
        chat(client, grant(client))
        recording.stop()
    kept = b"".join(path.read_bytes() for path in tmp_path.rglob("*.jsonl"))
    import base64

    bodies = b"".join(
        base64.b64decode(json.loads(line)["body"]) for line in kept.splitlines() if line
    )
    assert b"***" in bodies
    assert KEY.encode() not in bodies and secret.encode() not in bodies


def test_the_relay_ends_with_the_process_that_started_it(tmp_path: Path) -> None:
    """A run killed at any moment leaves no relay behind: its input closes, and it
    removes its control socket and the folder the run made for it."""
    log = str(tmp_path / "r.log")
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from pytest_harbor.relay import RelayProcess\n"
        "p = RelayProcess.start({'upstream': 'http://127.0.0.1:9/v1'}, "
        f"log=Path({log!r}))\n"
        "print(p.process.pid, p.address.control_socket, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, env={**os.environ}
    )
    assert parent.stdout is not None
    said, control = parent.stdout.readline().split()
    pid, folder = int(said), Path(control.decode()).parent
    assert folder.name.startswith("pytest-harbor-relay-") and folder.is_dir()
    os.kill(pid, 0)  # it runs
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the relay outlived the process that started it")
    assert not folder.exists(), "the relay left its control socket's folder"


def test_a_relay_start_sweeps_the_folders_of_relays_killed_outright() -> None:
    """A relay killed with SIGKILL cannot remove its folder: the next run's start does,
    when it is old enough and its socket answers no one; nothing else is touched."""
    old = time.time() - 600
    # Short: a socket's path has at most 107 bytes.
    tmp_path = Path(tempfile.mkdtemp(prefix="relays-"))

    def relay_folder(name: str, *, listening: bool = False, age: float = old) -> Path:
        folder = tmp_path / f"pytest-harbor-relay-{name}"
        folder.mkdir()
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(folder / "control.sock"))
        if listening:
            server.listen(1)
            held.append(server)
        else:
            server.close()
        os.utime(folder, (age, age))
        return folder

    held: list[socket.socket] = []
    try:
        dead = relay_folder("dead")
        young = relay_folder("young", age=time.time())
        live = relay_folder("live", listening=True)
        crowded = relay_folder("crowded")
        (crowded / "other").write_text("not the relay's")
        os.utime(crowded, (old, old))
        empty = tmp_path / "pytest-harbor-relay-empty"
        empty.mkdir()
        os.utime(empty, (old, old))
        unrelated = tmp_path / "something-else"
        unrelated.mkdir()
        os.utime(unrelated, (old, old))
        _sweep_stale_folders(tmp_path)
        assert not dead.exists() and not empty.exists()
        assert young.exists() and live.exists() and crowded.exists() and unrelated.exists()
    finally:
        for server in held:
            server.close()
        shutil.rmtree(tmp_path)
