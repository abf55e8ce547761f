"""Record, then replay: a 10-episode shell-agent run and a CLI-agent run, each recorded
against the test suite's scripted model server with `--harbor-record`, then run again
with `--harbor-replay` and no key set (the server still up, so that any call it got would
show). Prints, for each: the rewards of both runs, whether every transcript
(trajectory.json, timestamps aside) and every row's usage are the same, and the calls the
endpoint got during the replay.

    .venv/bin/python bench/replay.py [--episodes 10]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fixtures import BASE_IMAGE, write_task
from tests.integration.test_model_relay import relay_recipe
from tests.model_server import ChatRequest, Reply, ScriptedModel, answer, tool_call

TEST_SH = (
    "cat /tmp/answer > /logs/verifier/reward.txt 2>/dev/null "
    "|| echo 0 > /logs/verifier/reward.txt\n"
)
TOML = f'[agent]\ntimeout_sec = 120\n[environment]\ndocker_image = "{BASE_IMAGE}"\n'


def shell_agent_script(request: ChatRequest) -> Reply:
    """Odd tasks are solved, even ones are not: the rewards differ between tasks."""
    found = re.search(r"for task (\d+)", " ".join(request.instructions))
    assert found is not None, request.instructions
    number = int(found.group(1))
    if not request.tool_results:
        return tool_call(f"echo {number % 2} > /tmp/answer")
    return answer(f"wrote {number % 2}")


def cli_script(request: ChatRequest) -> Reply:
    said = request.messages[0]["content"]
    return answer("echo 1 > /tmp/answer" if said == "solve" else "echo 0 > /tmp/answer")


def without_times(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_times(v) for k, v in value.items() if k != "timestamp"}
    if isinstance(value, list):
        return [without_times(item) for item in value]
    return value


def outcome(results: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    rows = {}
    for path in results.rglob("rollouts.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            rows[f"{row['task_id']}/{row['repeat']}"] = row
    rewards = {key: row["reward"] for key, row in sorted(rows.items())}
    usage = {key: row["usage"] for key, row in sorted(rows.items())}
    transcripts = {
        str(path.relative_to(results)): without_times(json.loads(path.read_text()))
        for path in sorted(results.rglob("trajectory.json"))
    }
    return rewards, usage, transcripts


def run(folder: Path, dataset: Path, server_url: str, key: str | None, *args: str) -> Path:
    results = folder / f"results-{time.monotonic_ns()}"
    env = {k: v for k, v in os.environ.items() if k != "HARBOR_MODEL_API_KEY"}
    if key is not None:
        env["HARBOR_MODEL_API_KEY"] = key
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        "-n",
        "2",
        f"--harbor-dataset={dataset}",
        f"--harbor-results-dir={results}",
        "--harbor-model=scripted-model",
        f"--harbor-model-url={server_url}",
        *args,
    ]
    subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, check=False)
    return results


def record_and_replay(
    name: str,
    dataset: Path,
    script: Callable[[ChatRequest], Reply],
    agent: str,
    folder: Path,
) -> None:
    cassettes = folder / f"cassettes-{name}"
    with ScriptedModel(script) as server:
        url, key = server.url, server.api_key
        recorded = run(folder, dataset, url, key, agent, f"--harbor-record={cassettes}")
        calls = len(server.requests)
        # The endpoint stays up, answering, so that any call the replay made would show;
        # the replay has no key.
        replayed = run(folder, dataset, url, None, agent, f"--harbor-replay={cassettes}")
        replay_calls = len(server.requests) - calls
    before, after = outcome(recorded), outcome(replayed)
    print(f"{name}: {len(before[0])} episodes, {calls} model calls recorded")
    print(f"  rewards recorded: {list(before[0].values())}")
    print(f"  rewards replayed: {list(after[0].values())}")
    print(f"  same rewards: {before[0] == after[0]}, same usage: {before[1] == after[1]}")
    print(f"  same transcripts: {before[2] == after[2]} ({len(after[2])} transcripts)")
    print(f"  calls to the endpoint during the replay: {replay_calls}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        shell_tasks = folder / "shell"
        for number in range(args.episodes):
            write_task(
                shell_tasks,
                f"task-{number}",
                toml=TOML,
                test_sh=TEST_SH,
                instruction=f"Write the answer for task {number}\n",
            )
        record_and_replay(
            "shell-agent", shell_tasks, shell_agent_script, "--harbor-agent=shell-agent", folder
        )
        cli_tasks = folder / "cli"
        for number in range(4):
            word = "solve" if number % 2 else "fail"
            write_task(cli_tasks, f"cli-{number}", toml=TOML, test_sh=TEST_SH, instruction=word)
        recipe = relay_recipe(folder)
        record_and_replay("CLI agent", cli_tasks, cli_script, f"--harbor-agent={recipe}", folder)


if __name__ == "__main__":
    main()
