"""shell-agent's own cost per tool call, on top of the command's exec.

Runs shell-agent turns of N tool calls (`true`) in a real sandbox against the scripted
Chat Completions server of the test suite (127.0.0.1, answering at once). Inside the
turn it records how long each exec into the sandbox and each HTTP request took. Prints
per call: the turn's time, the exec, and the agent's overhead (the turn less the execs;
goal under 50 ms), with the HTTP round trip to the local server (part of the overhead)
beside it.

    .venv/bin/python bench/agent_overhead.py [--calls 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from pydantic import SecretStr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_harbor import Episode, load_task, make_harness, make_provider
from pytest_harbor.harnesses import ModelConfig
from pytest_harbor.relay import RelayClient
from pytest_harbor.sandboxes.docker import DockerSandbox
from tests.model_server import MODEL, ChatRequest, Reply, ScriptedModel, answer, tool_call

IMAGE = "debian:bookworm-slim"


def script_for(calls: int) -> Callable[[ChatRequest], Reply]:
    def script(request: ChatRequest) -> Reply:
        if len(request.tool_results) < calls:
            return tool_call("true")
        return answer("done")

    return script


def make_task(root: Path) -> Path:
    task = root / "calls"
    (task / "tests").mkdir(parents=True)
    (task / "task.toml").write_text(
        f'[agent]\ntimeout_sec = 3600\n[environment]\ndocker_image = "{IMAGE}"\n'
    )
    (task / "instruction.md").write_text("Run `true` many times.\n")
    (task / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    return task


def agent_turn(
    task: Path, server: ScriptedModel, calls: int, relay: RelayClient | None = None
) -> float:
    """Seconds of one turn of `calls` tool calls (the harness's own clock); through
    `relay` when given, as a run makes every call."""
    model = ModelConfig(name=MODEL, base_url=server.url, api_key=SecretStr(server.api_key))
    episode = Episode(
        load_task(task),
        taskset="bench",
        repeat=0,
        harness=make_harness("shell-agent", {"max_steps": calls + 1}),
        provider=make_provider("docker"),
        labels={"pytest-harbor.run": "bench-agent-overhead"},
        model=model,
        relay=relay,
    )
    try:
        episode.seed()
        output = episode.run_turn(episode.task.turns[0])
    finally:
        episode.cleanup()
    usage = output.result.usage
    assert usage is not None and usage.requests == calls + 1, usage
    assert output.result.timings.agent_s is not None
    return output.result.timings.agent_s


class Stopwatch:
    """Adds up the time spent in one function, called from the agent's turn (a thread
    named harbor-turn-...), while it is installed."""

    def __init__(self, owner: type, name: str) -> None:
        self.owner, self.name = owner, name
        self.original = getattr(owner, name)
        self.seconds = 0.0
        self.calls = 0

    def __enter__(self) -> Stopwatch:
        original = self.original

        def timed(*args: object, **kwargs: object) -> object:
            if not threading.current_thread().name.startswith("harbor-turn"):
                return original(*args, **kwargs)
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started
                self.calls += 1

        setattr(self.owner, self.name, timed)
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(self.owner, self.name, self.original)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    calls = args.calls
    turns, execs, posts = [], [], []
    with tempfile.TemporaryDirectory() as scratch, ScriptedModel(script_for(calls)) as server:
        task = make_task(Path(scratch))
        agent_turn(task, server, 5)  # warm-up: imports, connection pool, image inspect
        for _ in range(args.rounds):
            with (
                Stopwatch(DockerSandbox, "exec") as execs_watch,
                Stopwatch(httpx.Client, "post") as posts_watch,
            ):
                turn_s = agent_turn(task, server, calls)
            assert execs_watch.calls == calls, execs_watch.calls
            turns.append(turn_s / calls)
            execs.append(execs_watch.seconds / calls)
            posts.append(posts_watch.seconds / calls)
    turn, exe, post = (statistics.median(values) * 1000 for values in (turns, execs, posts))
    print(f"{calls} tool calls per turn, {args.rounds} rounds (medians, ms per tool call)")
    print(f"  turn (request + exec + agent): {turn:6.1f}")
    print(f"  exec into the sandbox:         {exe:6.1f}")
    print(f"  agent overhead (turn - exec):  {turn - exe:6.1f}   goal < 50")
    print(f"    of which the HTTP request:   {post:6.1f}")


if __name__ == "__main__":
    main()
