"""MCP connections through the sandbox (harnesses/mcp): a real MCP server (the `mcp`
SDK) reached over stdio, streamable HTTP and SSE from this process, every byte relayed by
a command in the sandbox, so that what the agent reaches is what its tools reach."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest

from pytest_harbor.harnesses.mcp.access import mcp_access
from pytest_harbor.harnesses.mcp.client import McpTools
from pytest_harbor.redaction import Redactor
from pytest_harbor.sandboxes.docker import DockerSandbox
from pytest_harbor.sandboxes.pipes import Pipe
from pytest_harbor.tasks.config import MCPServerConfig
from tests.fixtures import StartSandbox
from tests.unit.test_mcp_access import grants, task_with

pytestmark = pytest.mark.docker

SERVER = "/opt/mcp/server.py"


def opener(sandbox: DockerSandbox, user: str | None = None):
    def open_pipe(command: Sequence[str]) -> Pipe:
        return sandbox.open_pipe(command, user=user)

    return open_pipe


def serve(sandbox: DockerSandbox, transport: str, port: int) -> None:
    """The server on the sandbox's own loopback: nothing but the sandbox reaches it."""
    sandbox.exec(
        ["sh", "-c", f"nohup python3 {SERVER} {transport} {port} >/tmp/{port}.log 2>&1 &"],
        timeout=10,
    )
    for _ in range(100):
        probe = sandbox.exec(
            ["python3", "-c", f"import socket; socket.create_connection(('127.0.0.1', {port}))"],
            timeout=10,
        )
        if probe.exit_code == 0:
            return
        time.sleep(0.2)
    raise AssertionError(sandbox.exec(["cat", f"/tmp/{port}.log"], timeout=5).stdout)


def owners_of(sandbox: DockerSandbox, word: str) -> list[str]:
    """The users of the test server's processes whose command line holds `word`."""
    script = (
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null | "
        f"grep -q '[{SERVER[0]}]{SERVER[1:]} {word}' && stat -c %U $p; done; true"
    )
    return sandbox.exec(["sh", "-c", script], timeout=10).stdout.split()


def tools_for(
    sandbox: DockerSandbox, *servers: MCPServerConfig, env: dict[str, str] | None = None
) -> McpTools:
    access = mcp_access(
        task_with(list(servers)), grants("required", host_env=list(env or {})), env or {}
    )
    tools = McpTools(access, opener(sandbox), Redactor(access.secrets))
    tools.connect(30)
    return tools


@pytest.mark.parametrize(
    ("transport", "url"),
    [("streamable-http", "http://127.0.0.1:8000/mcp"), ("sse", "http://127.0.0.1:8000/sse")],
)
def test_a_server_on_the_sandboxes_loopback_is_reached_through_it(
    start: StartSandbox, mcp_image: str, transport: str, url: str
) -> None:
    sandbox = start(image=mcp_image, network=True)
    serve(sandbox, transport, 8000)
    tools = tools_for(
        sandbox,
        MCPServerConfig(
            name="tools",
            transport=transport,  # type: ignore[arg-type]
            url=url,
            headers={"Authorization": "Bearer ${TOOLS_TOKEN}"},
        ),
        env={"TOOLS_TOKEN": "t0ken-value"},
    )
    try:
        assert tools.failures == {}
        assert sorted(tools.tools) == [
            "mcp__tools__add",
            "mcp__tools__fail",
            "mcp__tools__get_secret",
            "mcp__tools__quiet",
            "mcp__tools__slow",
            "mcp__tools__whoami",
        ]
        assert tools.call("mcp__tools__add", {"a": 2, "b": 40}, 10).text == "42"
        assert tools.call("mcp__tools__get_secret", {}, 10).text.startswith("mcp-secret-")
        failed = tools.call("mcp__tools__fail", {}, 10)
        assert failed.is_error
        slow = tools.call("mcp__tools__slow", {"seconds": 30}, 1)
        assert slow.is_error and "did not answer within 1 s" in slow.text
        if transport == "streamable-http":
            assert tools.call("mcp__tools__whoami", {}, 10).text == "Bearer t0ken-value"
    finally:
        tools.close()


def test_a_stdio_server_runs_in_the_sandbox_as_the_agent_user(
    start: StartSandbox, mcp_image: str
) -> None:
    sandbox = start(image=mcp_image)
    sandbox.exec(["useradd", "-m", "agent"], timeout=10)
    access = mcp_access(
        task_with(
            [
                MCPServerConfig(
                    name="local", transport="stdio", command="python3", args=[SERVER, "stdio"]
                )
            ]
        ),
        grants("required"),
        {},
    )
    tools = McpTools(access, opener(sandbox, "agent"), Redactor())
    tools.connect(30)
    try:
        assert tools.failures == {}
        assert tools.call("mcp__local__add", {"a": 1, "b": 2}, 10).text == "3"
        assert owners_of(sandbox, "stdio") == ["agent"]
    finally:
        tools.close()
    # Closing ends the server: nothing of the connection is left running.
    for _ in range(50):
        if not owners_of(sandbox, "stdio"):
            break
        time.sleep(0.1)
    assert owners_of(sandbox, "stdio") == []


def test_a_server_that_floods_is_cut_off_not_held_in_memory(
    start: StartSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("pytest_harbor.harnesses.mcp.relay.MOST_ANSWER_BYTES", 1024 * 1024)
    sandbox = start()
    flood = MCPServerConfig(
        name="flood", transport="stdio", command="sh", args=["-c", "yes x | tr -d '\\n'"]
    )
    tools = McpTools(
        mcp_access(task_with([flood]), grants("required"), {}), opener(sandbox), Redactor()
    )
    tools.connect(20)
    try:
        assert set(tools.failures) == {"flood"}, tools.failures
        assert "no answer" not in tools.failures["flood"], tools.failures
    finally:
        tools.close()


def test_a_server_that_does_not_answer_is_named_with_why(start: StartSandbox) -> None:
    sandbox = start(network=True)
    tools = tools_for(
        sandbox,
        MCPServerConfig(name="nobody", transport="streamable-http", url="http://127.0.0.1:9/mcp"),
        MCPServerConfig(name="nothing", transport="stdio", command="/no/such/server"),
    )
    try:
        assert set(tools.failures) == {"nobody", "nothing"}
        assert tools.tools == {}
    finally:
        tools.close()
