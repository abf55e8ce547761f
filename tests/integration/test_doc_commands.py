"""Every console block of the README and docs/ runs as written and prints what it shows.

The convention is in tests/doc_examples.py. Each block runs on its own, in a fresh folder
with a copy of example_datasets/ (so relative paths in the commands, and the results they
write, are the block's own), as a shell would run it: `pytest` is this checkout's pytest in
a process of its own, other commands go to bash. Only the model endpoint is rewritten: the
URL the docs name, http://localhost:8000/v1, becomes the scripted Chat Completions server's,
which lists the model the docs use, takes the key they export, and answers each quick-start
instruction with the task's own solution.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_harbor import load_task
from tests.doc_examples import MODEL_URL, Block, console_blocks, matches, pages, problems
from tests.fixtures import QUICKSTART, REPO_ROOT
from tests.model_server import ChatRequest, Reply, ScriptedModel, answer, tool_call

pytestmark = pytest.mark.docker

#: The model and key the docs' examples name.
MODEL = "Qwen/Qwen2.5-7B-Instruct"
API_KEY = "token-abc123"
#: Variables a block starts without, whatever the environment of the test run has.
CLEARED = ("HARBOR_MODEL_API_KEY", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")

BLOCKS = [block for page in pages() for block in console_blocks(page)]


def _solutions() -> dict[str, str]:
    """Each quick-start instruction, and the commands that solve it."""
    commands = {}
    for task_dir in sorted(path for path in QUICKSTART.iterdir() if (path / "task.toml").exists()):
        turn = load_task(task_dir).turns[0]
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in turn.solution_env.items())
        commands[turn.instruction] = exports + (task_dir / "solution" / "solve.sh").read_text()
    return commands


@pytest.fixture
def model_server() -> Iterator[ScriptedModel]:
    solutions = _solutions()

    def script(request: ChatRequest) -> Reply:
        if request.last["role"] == "user":
            return tool_call(solutions.get(request.last["content"], "echo 'no idea'"))
        return answer("Done.")

    with ScriptedModel(script, api_key=API_KEY, model=MODEL) as server:
        yield server


def _run(command: str, words: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    argv = [sys.executable, "-m", *words] if words[0] == "pytest" else ["bash", "-c", command]
    done = subprocess.run(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    return done.returncode, done.stdout


def _unmatched(expected: list[str], printed: str) -> list[str]:
    """The expected lines not found in order among the printed ones (`...` shows a gap)."""
    lines = printed.splitlines()
    position = 0
    for number, pattern in enumerate(expected):
        if pattern.strip() in ("", "..."):
            continue
        for index in range(position, len(lines)):
            if matches(pattern, lines[index]):
                position = index + 1
                break
        else:
            return expected[number:]
    return []


@pytest.mark.parametrize("block", BLOCKS, ids=lambda block: block.id)
def test_doc_command(block: Block, tmp_path: Path, model_server: ScriptedModel) -> None:
    assert problems(block) == []
    shutil.copytree(REPO_ROOT / "example_datasets", tmp_path / "example_datasets")
    env = {name: value for name, value in os.environ.items() if name not in CLEARED}
    status: int | None = None
    for number, step in enumerate(block.steps):
        command = step.command.replace(MODEL_URL, model_server.url)
        expected = [line.replace(MODEL_URL, model_server.url) for line in step.expected]
        if step.kind == "export":
            name, _, value = step.words[1].partition("=")
            env[name] = value
            continue
        if step.kind == "status":
            assert [line.strip() for line in expected if line.strip()] == [str(status)], (
                f"{block.id}: `{block.steps[number - 1].command}` exited {status}"
            )
            continue
        status, printed = _run(command, shlex.split(command, comments=True), tmp_path, env)
        following = block.steps[number + 1] if number + 1 < len(block.steps) else None
        if following is None or following.kind != "status":
            assert status == 0, f"{block.id}: `{step.command}` exited {status}:\n{printed}"
        missing = _unmatched(expected, printed)
        assert missing == [], (
            f"{block.id}: `{step.command}` did not print, in this order:\n"
            + "\n".join(missing)
            + f"\n---- it printed:\n{printed}"
        )
