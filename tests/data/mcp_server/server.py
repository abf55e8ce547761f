"""An MCP server for the tests, on the `mcp` SDK: `python3 server.py TRANSPORT [PORT [HOST]]`
(HOST 0.0.0.0 unless given; the secret is MCP_SECRET when that is set).

Its tools: `get_secret` (a value made at start, so only a real call can know it),
`add` (two integers), `quiet` (a `command` argument, no text back), `whoami` (the
headers the call came with, by name, so a test can see a credential arrive), `fail` (an
error result) and `slow` (answers after `seconds`).
"""

import os
import secrets
import sys
import time

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.transport_security import TransportSecuritySettings

SECRET = os.environ.get("MCP_SECRET") or "mcp-secret-" + secrets.token_hex(8)

server = MCPServer("harbor-test-tools")


@server.tool()
def get_secret() -> str:
    """Returns the server's secret value."""
    return SECRET


@server.tool()
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


@server.tool()
def whoami(ctx: Context) -> str:
    """Returns the Authorization header the call came with (or 'none')."""
    request = ctx.request_context.request
    headers = getattr(request, "headers", None) or {}
    return headers.get("authorization", "none")


@server.tool()
def quiet(command: str) -> str:
    """Takes a `command` argument and answers with no text."""
    return ""


@server.tool()
def fail() -> str:
    """Always fails."""
    raise ValueError("the tool failed on purpose")


@server.tool()
def slow(seconds: float) -> str:
    """Answers after `seconds`."""
    time.sleep(seconds)
    return "done"


if __name__ == "__main__":
    transport = sys.argv[1] if len(sys.argv) > 1 else "streamable-http"
    if transport == "stdio":
        server.run("stdio")
    else:
        open_to_all = TransportSecuritySettings(enable_dns_rebinding_protection=False)
        port = int(sys.argv[2]) if len(sys.argv) > 2 else 8000
        host = sys.argv[3] if len(sys.argv) > 3 else "0.0.0.0"
        server.run(transport, host=host, port=port, transport_security=open_to_all)
