"""MCP tools granted to agents (`task_mcp_grants`), end to end: shell-agent, driven by a
scripted model on 127.0.0.1, calls the tools of real MCP servers (the `mcp` SDK) in a
task's Compose sidecars (streamable HTTP and SSE) and in its own sandbox (stdio), and a
verifier checks what only a real call could know."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest

from pytest_harbor.harnesses.atif import Trajectory
from pytest_harbor.harnesses.shell_agent import EMPTY_ANSWER
from tests.fixtures import BASE_IMAGE, MCP_SERVER, Dataset, Server, multi_step, run_harbor
from tests.model_server import ChatRequest, Reply, answer, tool_call

pytestmark = pytest.mark.docker

TOKEN = "tok-3c1f9a7e55d2"

_READY = "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])))"
COMPOSE = f"""\
services:
  main:
    depends_on:
      tools: {{condition: service_healthy}}
      events: {{condition: service_healthy}}
  tools:
    build: {{context: .}}
    command: ["python3", "/opt/mcp/server.py", "streamable-http", "8000"]
    healthcheck:
      test: ["CMD", "python3", "-c", "{_READY}", "8000"]
      interval: 1s
      retries: 60
  events:
    build: {{context: .}}
    command: ["python3", "/opt/mcp/server.py", "sse", "8001"]
    healthcheck:
      test: ["CMD", "python3", "-c", "{_READY}", "8001"]
      interval: 1s
      retries: 60
"""

SERVERS = """
[[environment.mcp_servers]]
name = "tools"
transport = "streamable-http"
url = "http://tools:8000/mcp"
headers = {Authorization = "Bearer ${TOOLS_TOKEN}"}

[[environment.mcp_servers]]
name = "events"
transport = "sse"
url = "http://events:8001/sse"

[[environment.mcp_servers]]
name = "local"
transport = "stdio"
command = "python3"
args = ["/opt/mcp/server.py", "stdio"]
"""

#: The verifier asks the sidecar for its secret itself: only an agent that called the
#: tool can have written it.
VERIFIER = """\
python3 - <<'EOF'
import asyncio, os
from mcp import Client
async def main():
    async with Client("http://tools:8000/mcp", mode="legacy") as client:
        result = await client.call_tool("get_secret", {})
    path = "/app/secret.txt"
    wrote = open(path).read().strip() if os.path.exists(path) else ""
    reward = "1" if wrote == result.content[0].text else "0"
    open("/logs/verifier/reward.txt", "w").write(reward)
asyncio.run(main())
EOF
"""


def mcp_task(dataset: Dataset, name: str = "secret", servers: str = SERVERS) -> Path:
    task = dataset.task(
        name,
        toml=f"[agent]\ntimeout_sec = 120\n[verifier]\ntimeout_sec = 60\n{servers}",
        test_sh=VERIFIER,
        instruction="Write the secret of the tools server to /app/secret.txt.\n",
    )
    environment = task / "environment"
    shutil.copytree(MCP_SERVER, environment)
    (environment / "Dockerfile").write_text(
        (MCP_SERVER / "Dockerfile").read_text() + "RUN mkdir -p /app\nWORKDIR /app\n"
    )
    (environment / "docker-compose.yaml").write_text(COMPOSE)
    return task


def calls(*named: tuple[str, dict[str, object]]) -> Reply:
    return tool_call(
        calls=[
            {
                "id": f"call_{number}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
            for number, (name, arguments) in enumerate(named)
        ]
    )


def using_the_tools(request: ChatRequest) -> Reply:
    """Calls a tool of each server, writes the secret the first one gave, then stops."""
    last = request.last
    if last["role"] == "user":
        return calls(
            ("mcp__tools__get_secret", {}),
            ("mcp__tools__whoami", {}),
            ("mcp__events__add", {"a": 20, "b": 22}),
            ("mcp__local__add", {"a": 1, "b": 2}),
            ("bash", {"command": "cat /tmp/.pytest-harbor/task.json"}),
        )
    if last["role"] == "tool" and last["tool_call_id"] == "call_4":
        secret = next(m["content"] for m in request.messages if m.get("tool_call_id") == "call_0")
        return tool_call(f"printf %s {shlex.quote(secret)} > /app/secret.txt")
    return answer("Done.")


def test_shell_agent_calls_the_tools_of_every_granted_server(
    pytester: pytest.Pytester,
    dataset: Dataset,
    model_server: Server,
    mcp_image: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mcp_task(dataset)
    monkeypatch.setenv("TOOLS_TOKEN", TOKEN)
    server = model_server(using_the_tools)
    # The task's ${TOOLS_TOKEN} reads the host's variable only because host_env names it.
    grants = ("--harbor-set=task_mcp_grants=required", "--harbor-set=host_env=[TOOLS_TOKEN]")
    result = run_harbor(pytester, dataset, *server.options(*grants))
    result.assert_outcomes(passed=1)
    (row,) = dataset.rows(pytester.path / "out", validation=False)
    assert row["reward"] == 1.0
    assert row["usage"]["tool_calls"] == 4  # type: ignore[index]
    offered = [tool["function"]["name"] for tool in server.requests[0].body["tools"]]
    assert offered[0] == "bash"
    assert {"mcp__tools__get_secret", "mcp__events__add", "mcp__local__add"} <= set(offered)
    answers = {m.get("tool_call_id"): m["content"] for m in server.requests[1].messages}
    assert answers["call_0"].startswith("mcp-secret-")
    assert answers["call_2"] == "42" and answers["call_3"] == "3"
    # The credential reached the server, filled in from the environment...
    assert answers["call_1"] == f"Bearer {TOKEN}"
    described = json.loads(answers["call_4"].split("\n", 1)[1])
    assert described["task_mcp_grants"] == "required"
    assert {s["name"]: s["granted"] for s in described["mcp_servers"]} == {
        "tools": True,
        "events": True,
        "local": True,
    }
    # ...and is masked in everything the run wrote.
    written = Path(str(row["verifier_logs_dir"])) / "trajectory.json"
    trajectory = Trajectory.model_validate_json(written.read_text())
    recorded = [call.function_name for step in trajectory.steps for call in step.tool_calls or []]
    assert recorded[:4] == [
        "mcp__tools__get_secret",
        "mcp__tools__whoami",
        "mcp__events__add",
        "mcp__local__add",
    ]
    for path in (pytester.path / "out").rglob("*"):
        if path.is_file():
            assert TOKEN not in path.read_text(errors="replace"), path


def quiet_then_done(request: ChatRequest) -> Reply:
    if request.last["role"] == "user":
        return calls(("mcp__local__quiet", {"command": "touch /app/ran"}))
    return answer("Done.")


def test_an_mcp_tools_empty_answer_never_runs_its_arguments_as_a_command(
    pytester: pytest.Pytester, dataset: Dataset, model_server: Server, mcp_image: str
) -> None:
    """A tool with a `command` argument that answers with no text: the answer is sent
    as such, and nothing of the call runs in the sandbox."""
    task = mcp_task(dataset)
    (task / "tests" / "test.sh").write_text(
        "[ -e /app/ran ] && echo 0 > /logs/verifier/reward.txt "
        "|| echo 1 > /logs/verifier/reward.txt\n"
    )
    server = model_server(quiet_then_done)
    result = run_harbor(
        pytester,
        dataset,
        *server.options(
            "--harbor-set=task_mcp_grants=optional", "--harbor-set=secrets.TOOLS_TOKEN=x"
        ),
    )
    result.assert_outcomes(passed=1)
    answers = {m.get("tool_call_id"): m["content"] for m in server.requests[1].messages}
    assert answers["call_0"] == EMPTY_ANSWER


def only_bash(request: ChatRequest) -> Reply:
    if request.last["role"] == "user":
        return tool_call("cat /tmp/.pytest-harbor/task.json")
    return answer("Done.")


def test_ungranted_servers_reach_the_agent_only_in_the_task_file(
    pytester: pytest.Pytester, dataset: Dataset, model_server: Server
) -> None:
    dataset.task(
        "plain",
        toml=f'[environment]\ndocker_image = "{BASE_IMAGE}"\n{SERVERS}',
        test_sh="echo 0 > /logs/verifier/reward.txt\n",
    )
    server = model_server(only_bash)
    run_harbor(pytester, dataset, *server.options()).assert_outcomes(failed=1)
    offered = [tool["function"]["name"] for tool in server.requests[0].body["tools"]]
    assert offered == ["bash"]
    described = json.loads(server.requests[1].last["content"].split("\n", 1)[1])
    assert described["task_mcp_grants"] == "off"
    assert [s["granted"] for s in described["mcp_servers"]] == [False, False, False]
    # Headers as written: the variable's name, never a value.
    assert described["mcp_servers"][0]["headers"] == {"Authorization": "Bearer ${TOOLS_TOKEN}"}


GONE = '[[environment.mcp_servers]]\nname = "gone"\ntransport = "streamable-http"\n'
KEYED = '[[environment.mcp_servers]]\nname = "keyed"\ntransport = "sse"\n'


@pytest.mark.parametrize(
    ("servers", "why"),
    [
        (
            GONE + 'url = "http://127.0.0.1:9/mcp"\n',
            "*required MCP servers cannot be used: gone:*",
        ),
        (
            KEYED + 'url = "http://127.0.0.1:9/sse"\n'
            'headers = {Authorization = "Bearer ${NOT_SET_ANYWHERE}"}\n',
            "*mcp_servers[[]0[]] (keyed): header Authorization names ${NOT_SET_ANYWHERE}*",
        ),
    ],
)
def test_a_required_server_that_cannot_be_used_leaves_the_episode_without_a_result(
    pytester: pytest.Pytester, dataset: Dataset, model_server: Server, servers: str, why: str
) -> None:
    dataset.task("needs-tools", toml=f'[environment]\ndocker_image = "{BASE_IMAGE}"\n{servers}')
    server = model_server(only_bash)
    result = run_harbor(pytester, dataset, *server.options("--harbor-set=task_mcp_grants=required"))
    result.assert_outcomes(errors=1)  # no result: the episode is not the agent's to score
    result.stdout.fnmatch_lines([why])
    assert server.requests == []  # the agent never started
    (failure,) = dataset.failures(pytester.path / "out", validation=False)
    assert failure["failure_kind"] == "agent_tools_unavailable"


#: Step one's agent (nobody) plants links where the engine writes the task description
#: file before step two: at the file and at the file it writes first, or in place of the
#: folder (to a folder only root may write in).
PLANTERS = {
    "files": """\
set -e
cd /tmp/.pytest-harbor
rm -f task.json task.json.new
ln -s /etc/motd task.json.new
ln -s /etc/issue task.json
""",
    "folder": "set -e\ncd /tmp && mv .pytest-harbor planted && ln -s /root .pytest-harbor\n",
}

#: Root's files the links name are as they were.
UNTOUCHED = """\
if grep -q task_mcp_grants /etc/motd /etc/issue /root/task.json* 2>/dev/null; then
  echo 0 > /logs/verifier/reward.txt
else
  echo 1 > /logs/verifier/reward.txt
fi
"""


def test_a_link_planted_where_the_task_file_goes_leads_only_where_the_agent_could_write(
    pytester: pytest.Pytester, harbor_dataset: Dataset
) -> None:
    for name, planter in PLANTERS.items():
        multi_step(
            harbor_dataset,
            name,
            {"one": (planter, None), "two": ("echo two > /tmp/two\n", None)},
            toml='[agent]\ntimeout_sec = 60\nuser = "nobody"\n'
            '[[environment.mcp_servers]]\nname = "local"\ntransport = "stdio"\ncommand = "true"\n',
            shared_test=UNTOUCHED,
        )
    result = run_harbor(pytester, harbor_dataset)
    assert result.ret == 0, result.stdout.str()[-3000:]
    rows = harbor_dataset.rows(pytester.path / "out")
    assert sorted((row["task_id"].split("/")[-1], row["reward"]) for row in rows) == [
        ("files", 1.0),
        ("folder", 1.0),
    ], rows
