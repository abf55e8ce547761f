"""Commands with their input and output joined to this process on OpenSandbox (execd's
terminal API and FIFOs, sandboxes/opensandbox/terminal.py): what an agent's MCP servers
over stdio and its tools' connections run through, as on Docker."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence

import pytest

from pytest_harbor.harnesses.mcp.access import mcp_access
from pytest_harbor.harnesses.mcp.client import McpTools
from pytest_harbor.labels import RUN_LABEL
from pytest_harbor.redaction import Redactor
from pytest_harbor.sandboxes import SandboxSpec
from pytest_harbor.sandboxes.base import SandboxError
from pytest_harbor.sandboxes.opensandbox import OpenSandboxProvider
from pytest_harbor.sandboxes.opensandbox.sandbox import INPUT_FOLDER, OpenSandboxSandbox
from pytest_harbor.sandboxes.pipes import OpensPipes, Pipe
from pytest_harbor.tasks.config import MCPServerConfig
from tests.integration.test_mcp_relay import SERVER
from tests.integration.test_opensandbox import environ, provider, registry, server
from tests.unit.test_mcp_access import grants, task_with

pytestmark = pytest.mark.docker

__all__ = ["environ", "provider", "registry", "server"]  # the fixtures, shared


@pytest.fixture
def mcp_sandbox(provider: OpenSandboxProvider, mcp_image: str) -> Iterator[OpenSandboxSandbox]:
    started = provider.start(
        SandboxSpec(image=mcp_image, labels={RUN_LABEL: f"test-{uuid.uuid4().hex[:8]}"}, ttl_s=600)
    )
    try:
        started.exec(["useradd", "-m", "agent"], user="0:0", timeout=30)
        yield started
    finally:
        started.stop()


def read_all(pipe: Pipe, seconds: float = 20) -> bytes:
    """What the command writes, until it ends."""
    got = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        chunk = pipe.receive(timeout=max(0.1, deadline - time.monotonic()))
        if not chunk:
            return got
        got += chunk
    raise AssertionError(f"the pipe did not end: {got!r}")


def read_until(pipe: Pipe, wanted: bytes, seconds: float = 20) -> bytes:
    got = b""
    deadline = time.monotonic() + seconds
    while wanted not in got:
        chunk = pipe.receive(timeout=max(0.1, deadline - time.monotonic()))
        assert chunk, f"the pipe ended before {wanted!r}: {got!r}"
        got += chunk
    return got


def processes(sandbox: OpenSandboxSandbox, word: str) -> list[str]:
    """The users of the processes whose command line holds `word`."""
    script = (
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null | "
        f"grep -q '[{word[0]}]{word[1:]}' && stat -c %U $p; done; true"
    )
    return sandbox.exec(["sh", "-c", script], user="0:0", timeout=30).stdout.split()


def test_a_joined_command_gets_its_input_and_gives_its_output(
    mcp_sandbox: OpenSandboxSandbox,
) -> None:
    assert isinstance(mcp_sandbox, OpensPipes)
    every_byte = bytes(range(256)) * 4
    pipe = mcp_sandbox.open_pipe(["cat"], user="agent", workdir="/tmp")
    try:
        pipe.send(every_byte)
        assert read_until(pipe, every_byte[-64:]) == every_byte
    finally:
        pipe.close()
    probe = ["sh", "-c", "id -un; pwd; echo $ASKED; env | grep -c EXECD; echo oops >&2"]
    told = mcp_sandbox.open_pipe(probe, user="agent", workdir="/tmp", env={"ASKED": "a b"})
    try:
        # The command's end is the pipe's: its last output comes before it.
        assert read_all(told) == b"agent\n/tmp\na b\n0\n"
        assert "oops" in told.stderr_tail()
    finally:
        told.close()


def test_closing_ends_the_command_and_its_fifos_go(mcp_sandbox: OpenSandboxSandbox) -> None:
    pipe = mcp_sandbox.open_pipe(["sh", "-c", "echo up; exec sleep 3217"], user="agent")
    try:
        assert read_until(pipe, b"up\n") == b"up\n"
        # Its user's (with the wrappers that hold its command line, the fake's included).
        assert set(processes(mcp_sandbox, "sleep 3217")) == {"agent"}
    finally:
        pipe.close()
    pipe.close()  # twice is fine
    with pytest.raises(SandboxError, match="closed"):
        pipe.send(b"x")
    for _ in range(100):
        if not processes(mcp_sandbox, "sleep 3217"):
            break
        time.sleep(0.1)
    assert processes(mcp_sandbox, "sleep 3217") == []
    # The FIFOs' folder goes with the next command as root.
    mcp_sandbox.exec(["true"], user="0:0")
    assert mcp_sandbox.exec(["ls", "-A", INPUT_FOLDER], user="0:0").stdout == ""


def test_a_user_that_is_not_there_is_named(mcp_sandbox: OpenSandboxSandbox) -> None:
    with pytest.raises(SandboxError, match="no-such-user"):
        mcp_sandbox.open_pipe(["cat"], user="no-such-user")


def test_the_agent_cannot_turn_the_joiner_on_a_file_of_roots(
    mcp_sandbox: OpenSandboxSandbox,
) -> None:
    """The joined command is the agent's: it learns its FIFOs' folder from its own
    descriptors and tries to put links to root's files in their place, or beside them.
    Root's side opens only what it made, in a folder the agent cannot change."""
    mcp_sandbox.exec(["sh", "-c", "echo root-only-words > /root/secret"], user="0:0")
    attack = r"""
f=$(readlink /proc/$$/fd/0); d=${f%/in}
echo "folder=$d" >&2
for name in out err in; do
  rm -f "$d/$name" 2>/dev/null && echo "removed $name" >&2
  ln -sf /root/secret "$d/$name" 2>/dev/null && echo "linked $name" >&2
  mv "$d/$name" "$d/moved" 2>/dev/null && echo "moved $name" >&2
done
ln -s /root/secret "$d/extra" 2>/dev/null && echo "linked extra" >&2
echo done
"""
    pipe = mcp_sandbox.open_pipe(["sh", "-c", attack], user="agent")
    try:
        said = read_all(pipe)
        tail = pipe.stderr_tail()
    finally:
        pipe.close()
    assert said == b"done\n", tail
    assert f"folder={INPUT_FOLDER}/pipe-" in tail
    for verb in ("removed", "linked", "moved"):
        assert verb not in tail, tail
    assert b"root-only-words" not in said


def opener(sandbox: OpenSandboxSandbox, user: str | None = None):
    def open_pipe(command: Sequence[str]) -> Pipe:
        return sandbox.open_pipe(command, user=user)

    return open_pipe


def test_an_mcp_server_over_stdio_runs_as_the_agent_user(
    mcp_sandbox: OpenSandboxSandbox,
) -> None:
    local = MCPServerConfig(
        name="local", transport="stdio", command="python3", args=[SERVER, "stdio"]
    )
    access = mcp_access(task_with([local]), grants("required"), {})
    tools = McpTools(access, opener(mcp_sandbox, "agent"), Redactor())
    tools.connect(60)
    try:
        assert tools.failures == {}
        assert tools.call("mcp__local__add", {"a": 1, "b": 2}, 20).text == "3"
        assert set(processes(mcp_sandbox, f"{SERVER} stdio")) == {"agent"}
    finally:
        tools.close()
    for _ in range(100):
        if not processes(mcp_sandbox, f"{SERVER} stdio"):
            break
        time.sleep(0.1)
    assert processes(mcp_sandbox, f"{SERVER} stdio") == []


def test_an_mcp_server_on_the_sandboxes_loopback_is_reached_through_it(
    mcp_sandbox: OpenSandboxSandbox,
) -> None:
    mcp_sandbox.exec(
        ["sh", "-c", f"nohup python3 {SERVER} streamable-http 8000 >/tmp/8000.log 2>&1 &"],
        user="0:0",
        timeout=30,
    )
    probe = ["python3", "-c", "import socket; socket.create_connection(('127.0.0.1', 8000))"]
    for _ in range(100):
        if mcp_sandbox.exec(probe, timeout=30).exit_code == 0:
            break
        time.sleep(0.2)
    remote = MCPServerConfig(
        name="tools", transport="streamable-http", url="http://127.0.0.1:8000/mcp"
    )
    access = mcp_access(task_with([remote]), grants("required"), {})
    tools = McpTools(access, opener(mcp_sandbox, "agent"), Redactor())
    tools.connect(60)
    try:
        assert tools.failures == {}
        assert tools.call("mcp__tools__add", {"a": 2, "b": 40}, 20).text == "42"
    finally:
        tools.close()
