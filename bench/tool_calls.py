"""One trivial command (`echo ok`), its p50 and p99: by plain exec, through a command
channel, and end to end as a shell-agent tool call against the scripted Chat Completions
server of the test suite (127.0.0.1, answering at once), directly and through the model
relay (as a run makes every call).

A tool call end to end is the time from one model request of the turn to the next: the
request, the command, and the agent's own work between them.

    .venv/bin/python bench/tool_calls.py [--commands 500] [--calls 300]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_overhead import IMAGE, agent_turn, make_task

from pytest_harbor.relay import RelayProcess
from pytest_harbor.sandboxes import SandboxSpec
from pytest_harbor.sandboxes.docker import DockerProvider
from tests.model_server import ChatRequest, Reply, ScriptedModel, answer, tool_call


def percentiles(seconds: list[float]) -> str:
    ordered = sorted(seconds)
    p50 = statistics.median(ordered) * 1000
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))] * 1000
    return f"p50 {p50:7.2f} ms   p99 {p99:7.2f} ms   ({len(ordered)} commands)"


def timed(run: Callable[[], object], count: int) -> list[float]:
    seconds = []
    for _ in range(count):
        started = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - started)
    return seconds


def direct(commands: int) -> None:
    provider = DockerProvider()
    sandbox = provider.start(
        SandboxSpec(image=IMAGE, labels={"pytest-harbor.run": "bench-tool-calls"})
    )
    try:
        agent = sandbox.for_agent()
        command = ["echo", "ok"]
        for name, target in (("plain exec", sandbox), ("channel", agent)):
            target.exec(command, timeout=30)  # warm-up (the channel opens here)
            assert target.exec(command, timeout=30).stdout == "ok\n"
            count = commands if target is agent else max(commands // 10, 30)
            run = lambda target=target: target.exec(command, timeout=30)  # noqa: E731
            print(f"{name:>26}: {percentiles(timed(run, count))}")
    finally:
        sandbox.stop()


def script_for(calls: int) -> Callable[[ChatRequest], Reply]:
    def script(request: ChatRequest) -> Reply:
        if len(request.tool_results) < calls:
            return tool_call("echo ok")
        return answer("done")

    return script


def through_shell_agent(calls: int, relayed: bool) -> None:
    """The gaps between the turn's successive model requests (through a model relay, as
    a run makes them, with `relayed`)."""
    starts: list[float] = []
    original = httpx.Client.post

    def post(self: httpx.Client, *args: object, **kwargs: object) -> object:
        if threading.current_thread().name.startswith("harbor-turn"):
            starts.append(time.perf_counter())
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    with tempfile.TemporaryDirectory() as scratch, ScriptedModel(script_for(calls)) as server:
        task = make_task(Path(scratch))
        relay = None
        if relayed:
            relay = RelayProcess.start(
                {"upstream": server.url, "api_key": server.api_key}, log=Path(scratch) / "log"
            )
        client = None if relay is None else relay.client()
        try:
            agent_turn(task, server, 5, client)  # warm-up: imports, connections, image
            httpx.Client.post = post  # type: ignore[method-assign]
            try:
                agent_turn(task, server, calls, client)
            finally:
                httpx.Client.post = original  # type: ignore[method-assign]
        finally:
            if relay is not None:
                relay.stop()
    gaps = [after - before for before, after in itertools.pairwise(starts)]
    # The first gap holds the channel's opening (one exec); the rest are tool calls.
    what = "shell-agent, relayed" if relayed else "shell-agent, direct"
    print(f"{what:>26}: {percentiles(gaps[1:])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=500)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    print(f"one trivial command (echo ok) in {IMAGE}")
    direct(args.commands)
    through_shell_agent(args.calls, relayed=False)
    through_shell_agent(args.calls, relayed=True)


if __name__ == "__main__":
    main()
