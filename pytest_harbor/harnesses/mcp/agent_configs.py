"""The granted MCP servers written as an in-sandbox CLI agent's own configuration.

A recipe's `[mcp] format` names the form its agent reads:

- `claude-json`: Claude Code's `--mcp-config` file (`{"mcpServers": {...}}`, types `http`,
  `sse` and `stdio`; a header is `${VARIABLE}`, which the agent fills from its
  environment);
- `codex-overrides`: Codex's `-c mcp_servers.<name>.<key>=<value>` overrides (a URL with
  `env_http_headers` naming the variables, or a command with its arguments); Codex speaks
  streamable HTTP and stdio, not SSE;
- `opencode-json`: an opencode configuration file named by `OPENCODE_CONFIG` (`"mcp"`
  entries of type `remote` or `local`; a header is `{env:VARIABLE}`), merged by opencode
  with the rest of its configuration.

A header's filled value reaches the agent only as a variable of its process's environment
(McpAccess.env), never in a file; the configuration names the variable.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Literal

from pytest_harbor.harnesses.mcp.access import GrantedServer, McpAccess

__all__ = ["AgentMcpConfig", "McpFormat", "agent_mcp_config"]

McpFormat = Literal["claude-json", "codex-overrides", "opencode-json"]

#: A server name Codex can take as one part of a dotted `-c` key.
_CODEX_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


@dataclass(frozen=True)
class AgentMcpConfig:
    """What a turn adds for its agent to find the granted servers."""

    #: File name (in the agent's logs folder) -> content.
    files: dict[str, bytes] = field(default_factory=dict)
    #: Words added to the end of the run command.
    args: list[str] = field(default_factory=list)
    #: Variables added to the run command's environment.
    env: dict[str, str] = field(default_factory=dict)
    #: Servers this agent cannot take, each with why.
    left_out: list[str] = field(default_factory=list)


def agent_mcp_config(access: McpAccess, form: McpFormat, folder: str) -> AgentMcpConfig:
    """The granted servers of `access` in the form `form`, its files to be written to
    `folder`; nothing at all when no server is granted."""
    if not access.granted:
        return AgentMcpConfig()
    if form == "claude-json":
        return _claude(access, folder)
    if form == "codex-overrides":
        return _codex(access)
    return _opencode(access, folder)


def _claude(access: McpAccess, folder: str) -> AgentMcpConfig:
    servers: dict[str, object] = {}
    for server in access.granted:
        config = server.config
        if config.transport == "stdio":
            servers[server.name] = {
                "type": "stdio",
                "command": config.command,
                "args": list(config.args),
            }
        else:
            servers[server.name] = {
                "type": "http" if config.transport == "streamable-http" else "sse",
                "url": config.url,
                "headers": _named(server, "${{{}}}"),
            }
    path = f"{folder}/mcp.json"
    return AgentMcpConfig(
        files={"mcp.json": _json({"mcpServers": servers})},
        args=["--mcp-config", path],
        env=access.env,
    )


def _codex(access: McpAccess) -> AgentMcpConfig:
    args: list[str] = []
    left_out: list[str] = []
    for server in access.granted:
        config = server.config
        if not _CODEX_NAME.match(server.name):
            left_out.append(f"{server.name}: Codex takes server names of letters, digits, - and _")
            continue
        key = f"mcp_servers.{server.name}"
        if config.transport == "stdio":
            settings = {"command": _toml(config.command), "args": _toml(list(config.args))}
        elif config.transport == "sse":
            left_out.append(f"{server.name}: Codex does not speak the sse transport")
            continue
        else:
            settings = {"url": _toml(config.url)}
            if server.variables:
                settings["env_http_headers"] = _toml_table(dict(server.variables))
        for name, value in settings.items():
            args += ["-c", f"{key}.{name}={value}"]
    return AgentMcpConfig(args=args, env=access.env if args else {}, left_out=left_out)


def _opencode(access: McpAccess, folder: str) -> AgentMcpConfig:
    servers: dict[str, object] = {}
    for server in access.granted:
        config = server.config
        if config.transport == "stdio":
            command = [config.command or "", *config.args]
            servers[server.name] = {"type": "local", "command": command, "enabled": True}
        else:
            servers[server.name] = {
                "type": "remote",
                "url": config.url,
                "headers": _named(server, "{{env:{}}}"),
                "enabled": True,
            }
    path = f"{folder}/opencode-mcp.json"
    return AgentMcpConfig(
        files={"opencode-mcp.json": _json({"mcp": servers})},
        env={**access.env, "OPENCODE_CONFIG": path},
    )


def _named(server: GrantedServer, template: str) -> dict[str, str]:
    """Each header as the agent's own reference to the variable holding its value."""
    return {header: template.format(server.variables[header]) for header in server.headers}


def _json(data: object) -> bytes:
    return json.dumps(data, indent=2).encode()


def _toml(value: object) -> str:
    """A TOML value: a JSON string or array of strings is one (TOML's basic strings
    escape as JSON does, for the characters JSON escapes)."""
    return json.dumps(value, ensure_ascii=True)


def _toml_table(values: dict[str, str]) -> str:
    return "{" + ", ".join(f"{_toml(key)} = {_toml(value)}" for key, value in values.items()) + "}"
