"""MCP servers granted to agents (`task_mcp_grants`): which servers an agent gets and with
what credentials (access.py), the relay their connections take through the sandbox
(relay.py), and the client host-side harnesses offer their tools with (client.py)."""
