"""What the model relay adds to one model call: the same calls to the test suite's scripted
Chat Completions server on 127.0.0.1, directly and through a relay in front of it, in
turns (one direct, one relayed), each over a kept connection as a harness's client makes
them; p50 and p99 of each, and of the difference, streamed and not.

    .venv/bin/python bench/relay_latency.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_harbor.relay import GrantRequest, RelayProcess
from tests.model_server import ChatRequest, Reply, ScriptedModel, answer

MODEL = "scripted-model"


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def shown(values: list[float]) -> str:
    return (
        f"p50 {statistics.median(values) * 1000:6.3f} ms   "
        f"p99 {quantile(values, 0.99) * 1000:6.3f} ms"
    )


def reply(request: ChatRequest) -> Reply:
    return answer("ok " * 40, usage=(500, 40))


def measure(calls: int, streamed: bool) -> None:
    with tempfile.TemporaryDirectory() as scratch, ScriptedModel(reply) as server:
        relay = RelayProcess.start(
            {"upstream": server.url, "api_key": server.api_key}, log=Path(scratch) / "log"
        )
        try:
            client = relay.client()
            token = client.grant(
                GrantRequest(episode="bench", models=(MODEL,), cassette="bench/bench")
            )
            client.open(token)
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": "hi " * 200}],
                "stream": streamed,
            }
            targets = {
                "direct": (server.url, server.api_key),
                "relayed": (client.host_url, token),
            }
            seconds: dict[str, list[float]] = {name: [] for name in targets}
            sessions = {name: httpx.Client(timeout=30) for name in targets}
            for round_ in range(calls + 50):
                for name, (base, key) in targets.items():
                    started = time.perf_counter()
                    answered = sessions[name].post(
                        f"{base}/chat/completions",
                        json=body,
                        headers={"Authorization": f"Bearer {key}"},
                    )
                    answered.read()
                    took = time.perf_counter() - started
                    assert answered.status_code == 200, answered.text
                    if round_ >= 50:  # the first 50 warm both paths up
                        seconds[name].append(took)
            counted = client.report(token).counts
            assert counted.requests == calls + 50, counted
        finally:
            relay.stop()
    added = [r - d for r, d in zip(seconds["relayed"], seconds["direct"], strict=True)]
    kind = "streamed" if streamed else "whole"
    print(f"{kind:>8} direct : {shown(seconds['direct'])}")
    print(f"{kind:>8} relayed: {shown(seconds['relayed'])}")
    print(f"{kind:>8} added  : {shown(added)}   ({calls} calls each)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    for streamed in (False, True):
        measure(args.calls, streamed)


if __name__ == "__main__":
    main()
