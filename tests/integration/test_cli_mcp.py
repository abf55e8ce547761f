"""MCP tools for the CLI agents: each shipped recipe (Claude Code, Codex, opencode) gets
the granted servers in its own configuration, and its agent, driven by a scripted model,
calls the tools of a real MCP server (the `mcp` SDK) on 127.0.0.1 from inside the sandbox
(on the host network), with the header credential the task names as `${VAR}`."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.anthropic_server import MODEL as CLAUDE_MODEL
from tests.anthropic_server import MessagesRequest, ScriptedMessages, bash, text, use
from tests.fixtures import BASE_IMAGE, MCP_SERVER, Dataset, run_harbor
from tests.model_server import ChatRequest, Reply, ScriptedModel, answer, tool_call
from tests.responses_server import MODEL as RESPONSES_MODEL
from tests.responses_server import (
    ResponsesRequest,
    ScriptedResponses,
    function_call,
    message,
    shell_call,
)

pytestmark = pytest.mark.docker

HOST_NETWORK = "--harbor-set=sandbox_provider_options.network=host"
TOKEN = "tok-5be0c2d94a17"
SECRET = re.compile(r"mcp-secret-[0-9a-f]{16}")
GRANTS = (
    "--harbor-set=task_mcp_grants=required",
    "--harbor-set=host_env=[TOOLS_TOKEN]",
    HOST_NETWORK,
)


class McpServer:
    """The tests' MCP server (tests/data/mcp_server) on 127.0.0.1, streamable HTTP."""

    def __init__(self) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.secret = f"mcp-secret-{time.monotonic_ns() % 16**16:016x}"
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(MCP_SERVER / "server.py"),
                "streamable-http",
                str(self.port),
                "127.0.0.1",
            ],
            env={"MCP_SECRET": self.secret, "PATH": "/usr/bin:/bin"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        self.process.kill()
        raise RuntimeError("the MCP server did not start")

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture
def mcp_server() -> Iterator[McpServer]:
    server = McpServer()
    yield server
    server.close()


def mcp_task(dataset: Dataset, server: McpServer) -> Path:
    """Write what the tools server's get_secret gives to /tmp/answer."""
    toml = (
        "[agent]\ntimeout_sec = 180\n[verifier]\ntimeout_sec = 60\n"
        f'[environment]\ndocker_image = "{BASE_IMAGE}"\n'
        "[[environment.mcp_servers]]\n"
        'name = "tools"\ntransport = "streamable-http"\n'
        f'url = "http://127.0.0.1:{server.port}/mcp"\n'
        'headers = {Authorization = "Bearer ${TOOLS_TOKEN}"}\n'
    )
    return dataset.task(
        "secret",
        toml=toml,
        test_sh=f'[ "$(cat /tmp/answer)" = "{server.secret}" ] && echo 1 > '
        "/logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n",
        instruction="Write the secret of the tools server to /tmp/answer.\n",
    )


def tool_named(names: list[str], tool: str) -> str:
    """The agent's name for the tools server's `tool` (each agent prefixes its own way)."""
    found = [name for name in names if name.endswith(tool) and "tools" in name]
    assert found, f"no {tool} among the tools offered: {names}"
    return found[0]


def plan(names: list[str], results: str) -> tuple[str, object]:
    """What the scripted model does next: call get_secret, then whoami, then write the
    secret the call returned (read from the results, so only a real call gives it)."""
    secret = SECRET.search(results)
    if secret is None:
        return "call", tool_named(names, "get_secret")
    if "Bearer" not in results:
        return "call", tool_named(names, "whoami")
    if "written" not in results:
        return "shell", f"echo {secret.group(0)} > /tmp/answer && echo written"
    return "done", None


def assert_credential_arrived(texts: list[str]) -> None:
    assert any(f"Bearer {TOKEN}" in text for text in texts), "whoami never saw the credential"


def run(
    pytester: pytest.Pytester, dataset: Dataset, monkeypatch: pytest.MonkeyPatch, *args: str
) -> None:
    monkeypatch.setenv("TOOLS_TOKEN", TOKEN)
    result = run_harbor(pytester, dataset, *args, *GRANTS)
    result.assert_outcomes(passed=1)
    folder = dataset.results_folder(pytester.path / "out", validation=False)
    for path in folder.rglob("*"):
        if path.is_file():
            assert TOKEN not in path.read_text(errors="replace"), path


def test_claude_code_calls_a_granted_mcp_tool(
    pytester: pytest.Pytester,
    harbor_dataset: Dataset,
    mcp_server: McpServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mcp_task(harbor_dataset, mcp_server)

    def script(request: MessagesRequest) -> tuple[list[dict[str, object]], str]:
        if "Bash" not in request.tools:
            return text("ok")
        step, what = plan(request.tools, json.dumps(request.tool_results))
        if step == "call":
            return use(str(what), {})
        if step == "shell":
            return bash(str(what))
        return text("The secret is written.")

    with ScriptedMessages(script) as server:
        monkeypatch.setenv("HARBOR_MODEL_API_KEY", server.api_key)
        run(
            pytester,
            harbor_dataset,
            monkeypatch,
            "--harbor-agent=claude-code",
            f"--harbor-model={CLAUDE_MODEL}",
            f"--harbor-model-url={server.url}",
        )
    assert_credential_arrived([json.dumps(r.tool_results) for r in server.requests])


def test_codex_calls_a_granted_mcp_tool(
    pytester: pytest.Pytester,
    harbor_dataset: Dataset,
    mcp_server: McpServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mcp_task(harbor_dataset, mcp_server)

    def script(request: ResponsesRequest) -> dict[str, object]:
        # Codex offers an MCP server's tools as a namespace of functions.
        namespaced = {
            f"{tool['name']}__{inner['name']}": (str(tool["name"]), str(inner["name"]))
            for tool in request.body.get("tools") or []
            if tool.get("type") == "namespace"
            for inner in tool.get("tools") or []
        }
        step, what = plan([*request.tools, *namespaced], json.dumps(request.outputs))
        if step == "call":
            namespace, name = namespaced[str(what)]
            return function_call(name, {}, namespace=namespace)
        if step == "shell":
            return shell_call(request, str(what))
        return message("The secret is written.")

    with ScriptedResponses(script) as server:
        monkeypatch.setenv("HARBOR_MODEL_API_KEY", server.api_key)
        run(
            pytester,
            harbor_dataset,
            monkeypatch,
            "--harbor-agent=codex",
            f"--harbor-model={RESPONSES_MODEL}",
            f"--harbor-model-url={server.url}",
        )
    assert_credential_arrived([json.dumps(r.outputs) for r in server.requests])


def test_opencode_calls_a_granted_mcp_tool(
    pytester: pytest.Pytester,
    harbor_dataset: Dataset,
    mcp_server: McpServer,
    monkeypatch: pytest.MonkeyPatch,
    model_server: Callable[..., ScriptedModel],
) -> None:
    mcp_task(harbor_dataset, mcp_server)

    def script(request: ChatRequest) -> Reply:
        tools = request.body.get("tools")
        if not tools:
            return answer("A title")
        names = [tool["function"]["name"] for tool in tools]
        step, what = plan(names, json.dumps(request.tool_results))
        if step == "call":
            return tool_call(
                calls=[
                    {
                        "id": f"call_{time.monotonic_ns()}",
                        "type": "function",
                        "function": {"name": str(what), "arguments": "{}"},
                    }
                ]
            )
        if step == "shell":
            return tool_call(str(what))
        return answer("The secret is written.")

    server = model_server(script)
    run(
        pytester,
        harbor_dataset,
        monkeypatch,
        "--harbor-agent=opencode",
        "--harbor-model=scripted-model",
        f"--harbor-model-url={server.url}",
    )
    assert_credential_arrived([json.dumps(r.tool_results) for r in server.requests])
