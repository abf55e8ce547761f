"""Harbor's terminus-2 on one trivial task, under `harbor run` and under pytest-harbor.

The task's image (Debian with tmux) is made once by each before the rounds; a scripted
Chat Completions server on 127.0.0.1 answers at once (type one command, then say done
twice, as terminus-2 asks). Each round runs the one episode through `harbor run -a
terminus-2` (Harbor's own docker environment) and through `pytest
--harbor-agent=harbor:terminus-2` (this adapter, on pytest-harbor's sandbox), in turns so
the machine's drift falls on both, and prints the median, min and max wall time of each,
start to exit. Needs .venv-harbor (made by .ci/setup).

    .venv/bin/python bench/harbor_agents.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.harbor_agents import HARBOR_PYTHON, TMUX_DOCKERFILE, terminus  # noqa: E402
from tests.model_server import ChatRequest, Reply, ScriptedModel, answer  # noqa: E402


def script(request: ChatRequest) -> Reply:
    turns = sum(1 for message in request.messages if message.get("role") == "assistant")
    if turns == 0:
        return answer(terminus("echo 1 > /tmp/answer\n"))
    return answer(terminus(complete=True))


def make_task(root: Path) -> Path:
    task = root / "tasks" / "hello"
    (task / "tests").mkdir(parents=True)
    (task / "environment").mkdir()
    (task / "task.toml").write_text("[agent]\ntimeout_sec = 120\n[verifier]\ntimeout_sec = 30\n")
    (task / "instruction.md").write_text("Write 1 to /tmp/answer.\n")
    (task / "tests" / "test.sh").write_text("cat /tmp/answer > /logs/verifier/reward.txt\n")
    (task / "environment" / "Dockerfile").write_text(TMUX_DOCKERFILE)
    return task


def harbor_run(task: Path, server: ScriptedModel, jobs: Path, env: dict[str, str]) -> float:
    harbor = HARBOR_PYTHON.parent / "harbor"
    command = [
        str(harbor), "run", "-p", str(task), "-a", "terminus-2",
        "-m", f"openai/{server.model}", "--ak", f"api_base={server.url}",
        "--ak", "record_terminal_session=false",
        "--ae", f"OPENAI_API_KEY={server.api_key}", "-o", str(jobs), "-n", "1",
    ]  # fmt: skip
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True)
    return time.perf_counter() - started


def pytest_harbor(task: Path, server: ScriptedModel, results: Path, env: dict[str, str]) -> float:
    command = [
        str(HARBOR_PYTHON), "-m", "pytest", "-p", "no:cacheprovider", "-q",
        f"--harbor-dataset={task.parent}", "--harbor-agent=harbor:terminus-2",
        f"--harbor-model={server.model}", f"--harbor-model-url={server.url}",
        "--harbor-agent-option=record_terminal_session=false",
        f"--harbor-results-dir={results}", "--harbor-report=none",
    ]  # fmt: skip
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True, cwd=results.parent)
    return time.perf_counter() - started


def show(name: str, times: list[float]) -> None:
    print(
        f"  {name:<34} median {statistics.median(times):6.2f} s"
        f"  (min {min(times):.2f}, max {max(times):.2f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if not HARBOR_PYTHON.exists():
        sys.exit(".venv-harbor is missing: run .ci/setup on a machine with Python 3.12")
    with tempfile.TemporaryDirectory() as scratch, ScriptedModel(script) as server:
        root = Path(scratch)
        task = make_task(root)
        env = {
            **os.environ,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "HARBOR_MODEL_API_KEY": server.api_key,
        }
        # Each makes its image once, outside the rounds.
        harbor_run(task, server, root / "jobs-warm", env)
        pytest_harbor(task, server, root / "results-warm", env)
        times: dict[str, list[float]] = {"harbor run": [], "pytest-harbor": []}
        for round_ in range(args.rounds):
            times["harbor run"].append(harbor_run(task, server, root / f"jobs-{round_}", env))
            times["pytest-harbor"].append(
                pytest_harbor(task, server, root / f"results-{round_}", env)
            )
        shutil.rmtree(root / "tasks", ignore_errors=True)
        print(f"terminus-2, one trivial task, scripted model, {args.rounds} rounds (wall time):")
        for name, values in times.items():
            show(name, values)
        ratio = statistics.median(times["harbor run"]) / statistics.median(times["pytest-harbor"])
        print(f"  harbor run / pytest-harbor: {ratio:.2f}x")


if __name__ == "__main__":
    main()
