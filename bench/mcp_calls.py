"""What an MCP tool call costs through the sandbox relay (harnesses/mcp): connecting to a
server (handshake and tool listing) and one call, for a streamable-HTTP server on the
sandbox's loopback and a stdio server in the sandbox, against the test server of
tests/data/mcp_server (its image must exist: the suite's `mcp_image` fixture builds it).

    .venv/bin/python bench/mcp_calls.py [--calls 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_harbor.harnesses.mcp.access import mcp_access
from pytest_harbor.harnesses.mcp.client import McpTools
from pytest_harbor.redaction import Redactor
from pytest_harbor.sandboxes.base import SandboxSpec
from pytest_harbor.sandboxes.docker import DockerProvider, DockerSandbox
from pytest_harbor.sandboxes.images import image_tag_for
from pytest_harbor.tasks.config import MCPServerConfig
from tests.fixtures import MCP_SERVER
from tests.unit.test_mcp_access import grants, task_with

SERVER = "/opt/mcp/server.py"


def measure(
    sandbox: DockerSandbox, server: MCPServerConfig, calls: int
) -> tuple[float, list[float]]:
    access = mcp_access(task_with([server]), grants("required"), {})
    started = time.monotonic()
    tools = McpTools(access, lambda command: sandbox.open_pipe(command), Redactor())
    tools.connect(60)
    connected = time.monotonic() - started
    assert not tools.failures, tools.failures
    seconds = []
    try:
        for number in range(calls):
            began = time.monotonic()
            answer = tools.call(f"mcp__{server.name}__add", {"a": number, "b": 1}, 30)
            seconds.append(time.monotonic() - began)
            assert answer.text == str(number + 1), answer
    finally:
        tools.close()
    return connected, seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=50)
    calls = parser.parse_args().calls
    labels = {"pytest-harbor.run": f"bench-{uuid.uuid4().hex[:8]}"}
    sandbox = DockerProvider().start(
        SandboxSpec(image=image_tag_for(MCP_SERVER), labels=labels, network=True)
    )
    try:
        sandbox.exec(["sh", "-c", f"nohup python3 {SERVER} streamable-http 8000 >/dev/null 2>&1 &"])
        time.sleep(3)
        for server in (
            MCPServerConfig(
                name="http", transport="streamable-http", url="http://127.0.0.1:8000/mcp"
            ),
            MCPServerConfig(
                name="stdio", transport="stdio", command="python3", args=[SERVER, "stdio"]
            ),
        ):
            connected, seconds = measure(sandbox, server, calls)
            print(
                f"{server.transport:16} connect {connected * 1000:7.1f} ms   call: "
                f"median {statistics.median(seconds) * 1000:6.1f} ms, "
                f"max {max(seconds) * 1000:6.1f} ms over {calls} calls"
            )
    finally:
        sandbox.stop()


if __name__ == "__main__":
    main()
