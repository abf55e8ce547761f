"""Harbor's own agents on pytest-harbor's sandboxes: terminus-2 against a scripted
Chat Completions server on 127.0.0.1 that answers in terminus-2's format, run by pytest
from the Python 3.12 environment that has Harbor."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.anthropic_server import MessagesRequest, ScriptedMessages, bash, text
from tests.fixtures import Dataset, Server, multi_step, write_task
from tests.harbor_agents import (
    HARBOR_PYTHON,
    TMUX_DOCKERFILE,
    harbor_pytest,
    needs_harbor,
    terminus,
)
from tests.model_server import ChatRequest, Reply, answer

pytestmark = [pytest.mark.docker, needs_harbor()]


@pytest.fixture(scope="module", autouse=True)
def tmux_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The tasks' image (tmux on Debian) is built once for the module, then removed."""
    yield
    import docker
    import docker.errors

    from pytest_harbor.sandboxes.images import image_tag_for

    context = tmp_path_factory.mktemp("tmux") / "environment"
    context.mkdir()
    (context / "Dockerfile").write_text(TMUX_DOCKERFILE)
    with contextlib.suppress(docker.errors.ImageNotFound):
        docker.from_env().images.remove(image_tag_for(context), force=True)


def _toml(agent_s: float = 60) -> str:
    return f"[agent]\ntimeout_sec = {agent_s}\n[verifier]\ntimeout_sec = 30\n"


def _rows(folder: Path) -> dict[str, dict[str, Any]]:
    lines = (folder / "rollouts.jsonl").read_text().splitlines()
    return {row["task_id"]: row for row in map(json.loads, lines)}


def _assistant_turns(request: ChatRequest) -> int:
    return sum(1 for message in request.messages if message.get("role") == "assistant")


def test_terminus_2_solves_and_fails_tasks_on_our_sandboxes(
    tmp_path: Path, dataset: Dataset, model_server: Server
) -> None:
    write_task(
        dataset.path,
        "solve",
        toml=_toml(),
        dockerfile=TMUX_DOCKERFILE,
        instruction="Write 1 to /tmp/answer.\n",
    )
    write_task(
        dataset.path,
        "give-up",
        toml=_toml(),
        dockerfile=TMUX_DOCKERFILE,
        instruction="Give up at once.\n",
    )

    def script(request: ChatRequest) -> Reply:
        turns = _assistant_turns(request)
        if "Give up at once." in str(request.messages):
            return answer(terminus(complete=True))
        if turns == 0:
            return answer(terminus("echo 1 > /tmp/answer\n"))
        # terminus-2 asks again before it ends: the second `task_complete` confirms.
        return answer(terminus(complete=True))

    server = model_server(script)
    done = harbor_pytest(
        tmp_path, server, f"--harbor-dataset={dataset.path}", "--harbor-agent=harbor:terminus-2"
    )
    assert "1 passed" in done.stdout and "1 failed" in done.stdout, done.stdout[-3000:]
    rows = _rows(tmp_path / "out" / "harbor" / dataset.name / "latest")
    assert (rows["solve"]["reward"], rows["give-up"]["reward"]) == (1.0, 0.0)
    assert rows["solve"]["agent"] == "harbor:terminus-2"
    assert rows["solve"]["usage"]["prompt_tokens"] > 0
    assert rows["solve"]["usage"]["requests"] >= 2
    # terminus-2's own ATIF trajectory reached the verifier and the results.
    trajectory = json.loads(
        (tmp_path / "out/harbor" / dataset.name / "verifier/solve__r0/trajectory.json").read_text()
    )
    assert trajectory["agent"]["name"] == "terminus-2"
    assert any("echo 1 > /tmp/answer" in json.dumps(step) for step in trajectory["steps"])
    assert (tmp_path / "out/harbor" / dataset.name / "agent/solve__r0/trajectory.json").is_file()
    assert server.api_key not in done.stdout


def test_terminus_2_that_never_stops_is_cut_off_and_verified(
    tmp_path: Path, dataset: Dataset, model_server: Server
) -> None:
    write_task(dataset.path, "busy", toml=_toml(agent_s=8), dockerfile=TMUX_DOCKERFILE)
    server = model_server(lambda request: answer(terminus("echo 1 > /tmp/answer; sleep 0.5\n")))
    done = harbor_pytest(
        tmp_path, server, f"--harbor-dataset={dataset.path}", "--harbor-agent=harbor:terminus-2"
    )
    assert "1 passed" in done.stdout, done.stdout[-3000:]
    (row,) = _rows(tmp_path / "out" / "harbor" / dataset.name / "latest").values()
    assert (row["reward"], row["failure_kind"], row["failure_cause"]) == (
        1.0,
        "agent_timeout",
        "timeout",
    )
    assert row["timings"]["agent_s"] < 30


PROBES = str(Path(__file__).resolve().parent.parent / "data")


def _probe_run(tmp_path: Path, dataset: Dataset, server: Any, agent: str) -> dict[str, Any]:
    done = harbor_pytest(
        tmp_path,
        server,
        f"--harbor-dataset={dataset.path}",
        f"--harbor-agent=harbor:harbor_probe_agents:{agent}",
        extra_path=PROBES,
    )
    folder = tmp_path / "out" / "harbor" / dataset.name / "latest"
    assert (folder / "rollouts.jsonl").is_file(), done.stdout[-3000:] + done.stderr[-2000:]
    (row,) = _rows(folder).values()
    return row


def test_a_harbor_agent_that_raises_is_an_agent_crash_and_verified(
    tmp_path: Path, dataset: Dataset, model_server: Server
) -> None:
    dataset.task("hello", toml=_toml() + '[environment]\ndocker_image = "debian:bookworm-slim"\n')
    row = _probe_run(tmp_path, dataset, model_server(lambda r: answer("")), "Raises")
    assert (row["reward"], row["failure_cause"]) == (1.0, "agent_crashed")
    assert "the probe agent broke down" in row["failure_reason"]
    # The agent's context claims 7 prompt tokens; it made no call, and the row holds what
    # the model relay counted, not the claim.
    assert (row["usage"]["prompt_tokens"], row["usage"]["requests"]) == (0, 0)


def test_a_harbor_agent_that_hangs_is_cut_off_at_its_deadline(
    tmp_path: Path, dataset: Dataset, model_server: Server
) -> None:
    dataset.task(
        "hello", toml=_toml(agent_s=4) + '[environment]\ndocker_image = "debian:bookworm-slim"\n'
    )
    row = _probe_run(tmp_path, dataset, model_server(lambda r: answer("")), "Hangs")
    assert (row["reward"], row["failure_kind"], row["failure_cause"]) == (
        1.0,
        "agent_timeout",
        "timeout",
    )
    assert row["timings"]["agent_s"] < 20


def test_what_a_harbor_agent_leaves_running_is_ended_before_the_verifier(
    tmp_path: Path, dataset: Dataset, model_server: Server
) -> None:
    """A non-root agent's processes end with its turn, as any harness's: the one it left
    to spoil the answer three seconds later never gets to."""
    dataset.task(
        "hello",
        toml='[agent]\ntimeout_sec = 60\nuser = "nobody"\n[verifier]\ntimeout_sec = 30\n'
        '[environment]\ndocker_image = "debian:bookworm-slim"\n',
        test_sh="sleep 5; cat /tmp/answer > /logs/verifier/reward.txt\n",
    )
    row = _probe_run(tmp_path, dataset, model_server(lambda r: answer("")), "LeavesProcesses")
    assert row["reward"] == 1.0


def test_files_move_through_the_environment_calls(
    tmp_path: Path, dataset: Dataset, model_server: Server
) -> None:
    dataset.task("hello", toml=_toml() + '[environment]\ndocker_image = "debian:bookworm-slim"\n')
    row = _probe_run(tmp_path, dataset, model_server(lambda r: answer("")), "Uploads")
    assert row["reward"] == 1.0
    agent = tmp_path / "out" / "harbor" / dataset.name / "latest" / "agent" / "hello__r0"
    assert (agent / "answer-copy.txt").read_text() == "1\n"
    assert (agent / "round-trip" / "deep" / "b.txt").read_text() == "1\n"
    assert (agent / "round-trip" / "a.txt").read_text() == "from the host\n"


def _screens(requests: list[ChatRequest]) -> list[str]:
    """What terminus-2 showed the model each time (its terminal), the sandbox's host name
    and the timing notes written alike."""
    screens = []
    for request in requests:
        text = str(request.messages[-1].get("content"))
        text = re.sub(r"root@[0-9a-z-]+:", "root@HOST:", text)
        screens.append(re.sub(r"\d+(\.\d+)? ?s(econds)?\b", "N s", text))
    return screens


def test_side_by_side_with_harbor_run(
    tmp_path: Path, dataset: Dataset, model_server: Server
) -> None:
    """One task, one scripted model: `harbor run -a terminus-2` (Harbor's own runner and
    docker environment) and pytest-harbor send the same commands to the sandbox, show the
    model the same terminal, and score the same."""
    write_task(dataset.path, "hello", toml=_toml(), dockerfile=TMUX_DOCKERFILE)

    def script(request: ChatRequest) -> Reply:
        if _assistant_turns(request) == 0:
            return answer(terminus("echo 1 > /tmp/answer\n", "cat /tmp/answer\n"))
        return answer(terminus(complete=True))

    theirs, ours = model_server(script), model_server(script)
    started = time.monotonic()
    harbor = subprocess.run(
        [
            str(HARBOR_PYTHON.parent / "harbor"),
            "run",
            "-p",
            str(dataset.path / "hello"),
            "-a",
            "terminus-2",
            "-m",
            f"openai/{theirs.model}",
            "--ak",
            f"api_base={theirs.url}",
            "--ak",
            "record_terminal_session=false",
            "--ae",
            f"OPENAI_API_KEY={theirs.api_key}",
            "-o",
            str(tmp_path / "jobs"),
            "-n",
            "1",
        ],
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    harbor_s = time.monotonic() - started
    assert harbor.returncode == 0, harbor.stdout[-2000:] + harbor.stderr[-2000:]
    (result,) = (tmp_path / "jobs").glob("*/hello__*/result.json")
    harbor_reward = json.loads(result.read_text())["verifier_result"]["rewards"]["reward"]
    started = time.monotonic()
    done = harbor_pytest(
        tmp_path, ours, f"--harbor-dataset={dataset.path}", "--harbor-agent=harbor:terminus-2"
    )
    ours_s = time.monotonic() - started
    (row,) = _rows(tmp_path / "out" / "harbor" / dataset.name / "latest").values()
    assert (row["reward"], harbor_reward) == (1.0, 1.0), done.stdout[-2000:]
    assert _screens(ours.requests) == _screens(theirs.requests)
    assert "echo 1 > /tmp/answer" in _screens(ours.requests)[1]
    print(f"wall time: harbor run {harbor_s:.1f} s, pytest-harbor {ours_s:.1f} s")


def test_harbors_claude_code_installed_once_for_two_episodes(
    tmp_path: Path, dataset: Dataset
) -> None:
    """Harbor's installed claude-code, against a scripted Messages API server: the agent
    is installed by the claude-code recipe's cached layer (once per image and version;
    Harbor's own install, from the vendor's site, is skipped), and solves two tasks."""
    image = 'docker_image = "debian:bookworm-slim"\n'
    for name in ("one", "two"):
        write_task(
            dataset.path,
            name,
            toml=_toml(agent_s=120) + "[environment]\n" + image,
            test_sh="cat /tmp/answer > /logs/verifier/reward.txt\n",
        )

    def script(request: MessagesRequest) -> tuple[list[dict[str, object]], str]:
        if "Bash" not in request.tools:
            return text("ok")
        if not request.tool_results:
            return bash("echo 1 > /tmp/answer")
        return text("The answer is written.")

    with ScriptedMessages(script) as server:
        done = harbor_pytest(
            tmp_path,
            server,
            f"--harbor-dataset={dataset.path}",
            "--harbor-agent=harbor:claude-code",
            "--harbor-set=sandbox_provider_options.network=host",
            agent_options=False,
        )
    assert "2 passed" in done.stdout, done.stdout[-4000:] + done.stderr[-2000:]
    rows = _rows(tmp_path / "out" / "harbor" / dataset.name / "latest")
    assert {row["reward"] for row in rows.values()} == {1.0}
    assert all(row["agent"] == "harbor:claude-code" for row in rows.values())
    # One install image for both episodes: the recipe's layer, labelled with the agent.
    import docker

    found = docker.from_env().images.list(filters={"label": "pytest-harbor.agent"})
    assert any(
        image.labels.get("pytest-harbor.agent", "").startswith("claude-code@") for image in found
    )
    # Harbor's own installer (a download from the vendor's site) never ran: each episode's
    # set-up found the agent in the image.
    assert done.stdout.count("Skipping install, using the agent in the image") == 2


@pytest.mark.parametrize(
    ("sessions", "expected"),
    [
        ("continue", "setup,run Do first.,run Do second."),
        ("fresh", "setup,run Do first.,setup,run Do second."),
    ],
)
def test_a_multi_step_task_keeps_one_harbor_agent_when_sessions_continue(
    tmp_path: Path, dataset: Dataset, model_server: Server, sessions: str, expected: str
) -> None:
    """As `harbor run` does: set up once, `run()` per step (turn_sessions = continue); with
    fresh sessions, a new agent set up for every step."""
    check = """[ "$(paste -sd, /tmp/calls)" = "{calls}" ] && echo 1 > /logs/verifier/reward.txt \
|| { paste -sd, /tmp/calls; echo 0 > /logs/verifier/reward.txt; }
"""
    first, full = "setup,run Do first.", expected
    multi_step(
        dataset,
        "steps",
        {
            "first": ("true\n", check.replace("{calls}", first)),
            "second": ("true\n", check.replace("{calls}", full)),
        },
        toml="[agent]\ntimeout_sec = 60\n",
    )
    done = harbor_pytest(
        tmp_path,
        model_server(lambda r: answer("")),
        f"--harbor-dataset={dataset.path}",
        "--harbor-agent=harbor:harbor_probe_agents:CountsSessions",
        f"--harbor-set=turn_sessions={sessions}",
        extra_path=PROBES,
    )
    assert "2 passed" in done.stdout, done.stdout[-3000:]


def test_a_harbor_agent_cannot_forge_its_reward_leak_the_key_or_end_the_sandbox(
    tmp_path: Path, dataset: Dataset, model_server: Server
) -> None:
    dataset.task("hello", toml=_toml() + '[environment]\ndocker_image = "debian:bookworm-slim"\n')
    server = model_server(lambda r: answer(""))
    row = _probe_run(tmp_path, dataset, server, "LeaksAndForges")
    # The verifier ran in the sandbox the agent asked to remove, and its own reward counts.
    assert row["reward"] == 0.0
    verifier = Path(row["verifier_logs_dir"])
    assert "checking" in (verifier / "test-stdout.txt").read_text()
    results = tmp_path / "out"
    files = [path for path in results.rglob("*") if path.is_file()]
    assert any(path.name == "leak.txt" for path in files)
    for path in files:
        assert server.api_key.encode() not in path.read_bytes(), path


def test_a_harbor_agent_gets_the_granted_mcp_servers_harbors_way(
    tmp_path: Path, dataset: Dataset, model_server: Server
) -> None:
    servers = (
        '[[environment.mcp_servers]]\nname = "tools"\ntransport = "streamable-http"\n'
        'url = "http://tools.example:8000/mcp"\n'
        '[[environment.mcp_servers]]\nname = "local"\ntransport = "stdio"\n'
        'command = "tool-server"\nargs = ["--stdio"]\n'
    )
    write_task(dataset.path, "tools", toml=_toml() + servers, dockerfile=TMUX_DOCKERFILE)
    server = model_server(lambda request: answer(terminus(complete=True)))
    done = harbor_pytest(
        tmp_path,
        server,
        f"--harbor-dataset={dataset.path}",
        "--harbor-agent=harbor:terminus-2",
        "--harbor-set=task_mcp_grants=optional",
    )
    assert "1 failed" in done.stdout, done.stdout[-3000:]
    # terminus-2 hands its MCP servers to the model in its first prompt, as under Harbor.
    first = json.dumps(server.requests[0].messages)
    assert "tools: streamable-http transport, url: http://tools.example:8000/mcp" in first
    assert "local: stdio transport, command: tool-server --stdio" in first
