"""Time to a CLI agent's first command, with a cold and with a warm install cache.

For each recipe, runs one-turn episodes of a trivial task in a real sandbox (on the host
network) against the suite's scripted model server on 127.0.0.1, whose first answer is a
command and whose second ends the turn. It records, from the start of the episode
(`prepare`, where the install image is made or found), when the agent's first model request
arrived and when its second arrived (the first command has run by then). Cold: the install
image is made again (`rebuild=true`, the same work as a machine that never ran the recipe);
warm: it is found in the cache. Prints the install time and both moments for each.

    .venv/bin/python bench/agent_install.py [--recipes mini-swe-agent,claude-code] [--warm 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import SecretStr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_harbor import Episode, load_task, make_harness, make_provider
from pytest_harbor.harnesses import ModelConfig
from tests.anthropic_server import MODEL as CLAUDE_MODEL
from tests.anthropic_server import MessagesRequest, ScriptedMessages, bash, text
from tests.model_server import MODEL, ChatRequest, Reply, ScriptedModel, answer, tool_call

IMAGE = "debian:bookworm-slim"


class Arrivals:
    """When the model requests came (time.monotonic())."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def note(self) -> int:
        self.times.append(time.monotonic())
        return len(self.times)


def mini_script(arrivals: Arrivals) -> Callable[[ChatRequest], Reply]:
    def script(request: ChatRequest) -> Reply:
        count = arrivals.note()
        if count == 1:
            return tool_call("echo 1 > /tmp/answer")
        if count == 2:
            return tool_call("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
        return answer("done")

    return script


def claude_script(arrivals: Arrivals) -> Callable[[MessagesRequest], Any]:
    def script(request: MessagesRequest) -> Any:
        if "Bash" not in request.tools:
            return text("ok")
        arrivals.note()
        return text("done") if request.tool_results else bash("echo 1 > /tmp/answer")

    return script


def make_task(root: Path) -> Path:
    task = root / "first-command"
    (task / "tests").mkdir(parents=True)
    (task / "task.toml").write_text(
        f'[agent]\ntimeout_sec = 600\n[environment]\ndocker_image = "{IMAGE}"\n'
    )
    (task / "instruction.md").write_text("Write 1 to /tmp/answer.\n")
    (task / "tests" / "test.sh").write_text("cat /tmp/answer > /logs/verifier/reward.txt\n")
    return task


def episode_times(
    recipe: str, task: Path, model: ModelConfig, arrivals: Arrivals, *, cold: bool
) -> tuple[float, float, float]:
    """(install s, first request s, after the first command s), from the episode's start."""
    arrivals.times.clear()
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    episode = Episode(
        load_task(task),
        taskset="bench",
        repeat=0,
        harness=make_harness(recipe, {"rebuild": cold}),
        provider=make_provider("docker", {"network": "host"}),
        labels={"pytest-harbor.run": run_id},
        model=model,
    )
    started = time.monotonic()
    try:
        episode.prepare()
        installed = time.monotonic() - started
        episode.seed()
        output = episode.run_turn(episode.task.turns[0])
    finally:
        episode.cleanup()
    assert output.result.reward == 1.0, output.result
    assert len(arrivals.times) >= 2, arrivals.times
    return installed, arrivals.times[0] - started, arrivals.times[1] - started


def bench(recipe: str, warm_rounds: int) -> None:
    arrivals = Arrivals()
    with tempfile.TemporaryDirectory() as scratch:
        task = make_task(Path(scratch))
        if recipe == "claude-code":
            server: Any = ScriptedMessages(claude_script(arrivals))
            name = CLAUDE_MODEL
        else:
            server = ScriptedModel(mini_script(arrivals))
            name = MODEL
        with server:
            model = ModelConfig(name=name, base_url=server.url, api_key=SecretStr(server.api_key))
            cold = episode_times(recipe, task, model, arrivals, cold=True)
            warm = [
                episode_times(recipe, task, model, arrivals, cold=False) for _ in range(warm_rounds)
            ]
    medians = [statistics.median(values) for values in zip(*warm, strict=True)]
    print(f"{recipe} (seconds from the episode's start; warm: median of {warm_rounds})")
    print("         install  first request  first command done")
    print(f"  cold  {cold[0]:7.1f}  {cold[1]:13.1f}  {cold[2]:18.1f}")
    print(f"  warm  {medians[0]:7.2f}  {medians[1]:13.2f}  {medians[2]:18.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", default="mini-swe-agent,claude-code")
    parser.add_argument("--warm", type=int, default=3)
    args = parser.parse_args()
    for recipe in args.recipes.split(","):
        bench(recipe, args.warm)


if __name__ == "__main__":
    main()
