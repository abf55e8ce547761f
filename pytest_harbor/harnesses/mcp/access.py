"""Which of a task's MCP servers its agent gets (`task_mcp_grants`), their `${VAR}` header
credentials filled in, and the task description file every harness finds in the sandbox.

`off` grants nothing; `optional` and `required` grant every server of the task and of the
job's `compose_overlay` (the overlay's entry wins by name). A header value's `${VAR}` is
filled from the run's `secrets`, else from a host variable `host_env` names (a task is
a stranger's code: no other host variable may reach its servers); the value is a secret
(masked wherever the run writes). A server whose header names a variable set nowhere is
not granted, and the reason is kept (`problems`): under `required` the turn fails.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from pytest_harbor.settings import HarborSettings
from pytest_harbor.tasks import Task, Turn
from pytest_harbor.tasks.config import MCPServerConfig
from pytest_harbor.templates import fill_inside, lookup, names_inside

__all__ = [
    "NO_MCP",
    "TASK_FILE",
    "GrantMode",
    "GrantedServer",
    "McpAccess",
    "exposed_tool_name",
    "mcp_access",
]

GrantMode = Literal["off", "optional", "required"]

#: Where every harness finds the task described (its instruction, its MCP servers, which
#: of them are granted), written before each turn as the turn's agent user.
TASK_FILE = "/tmp/.pytest-harbor/task.json"

_TOOL_NAME = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True)
class GrantedServer:
    """A server the agent gets, its headers filled in."""

    config: MCPServerConfig
    #: Header name -> value with every `${VAR}` filled (a secret where it named one).
    headers: Mapping[str, str]
    #: Header name -> the environment variable an in-sandbox agent's configuration names
    #: for it; the agent's process gets the filled value under that name (McpAccess.env).
    variables: Mapping[str, str]

    @property
    def name(self) -> str:
        return self.config.name


@dataclass(frozen=True)
class McpAccess:
    """One episode's MCP servers: granted, not granted, and why any was left out."""

    mode: GrantMode
    granted: tuple[GrantedServer, ...] = ()
    ungranted: tuple[MCPServerConfig, ...] = ()
    #: Why a server the mode grants was left out (a header's variable is set nowhere).
    problems: tuple[str, ...] = ()
    #: The values filled into headers from variables: masked wherever the run writes.
    secrets: tuple[str, ...] = ()
    #: The variables the granted servers' headers name, with their values (for an agent
    #: that fills `${VAR}` itself, as Harbor's do).
    values: Mapping[str, str] = field(default_factory=dict)

    @property
    def required(self) -> bool:
        return self.mode == "required"

    @property
    def env(self) -> dict[str, str]:
        """The variables an in-sandbox agent's process gets, for its configuration's
        headers (never written into a file)."""
        return {
            variable: server.headers[header]
            for server in self.granted
            for header, variable in server.variables.items()
        }

    def as_written(self) -> list[dict[str, object]]:
        """The granted servers as the task writes them (headers with `${VAR}` unfilled),
        for an agent that takes Harbor's MCP server entries."""
        return [server.config.model_dump(mode="json") for server in self.granted]

    def task_file(self, task: Task, turn: Turn) -> bytes:
        """The task description file's content: the turn's instruction and every MCP
        server as the task writes it (headers unfilled), each marked granted or not."""
        granted = {server.name for server in self.granted}
        every = [*(server.config for server in self.granted), *self.ungranted]
        servers = [
            {**config.model_dump(mode="json"), "granted": config.name in granted}
            for config in every
        ]
        data = {
            "task": task.id,
            "step": turn.name,
            "instruction": turn.instruction,
            "task_mcp_grants": self.mode,
            "mcp_servers": servers,
        }
        return json.dumps(data, indent=2).encode()


NO_MCP = McpAccess(mode="off")


def mcp_access(task: Task, settings: HarborSettings, environ: Mapping[str, str]) -> McpAccess:
    """The MCP servers of `task` (the overlay's already merged in) as the settings'
    `task_mcp_grants` grants them; `${VAR}` filled from `secrets`, else from the variables
    of `environ` that `host_env` names (only those)."""
    mode: GrantMode = settings.task_mcp_grants
    servers = task.config.environment.mcp_servers
    if mode == "off":
        return McpAccess(mode=mode, ungranted=tuple(servers))
    sources = (settings.revealed_secrets(), settings.host_variables(environ))
    granted: list[GrantedServer] = []
    ungranted: list[MCPServerConfig] = []
    problems: list[str] = []
    filled: list[str] = []
    values: dict[str, str] = {}
    for number, server in enumerate(servers):
        named = [
            (header, name, lookup(name, *sources))
            for header, written in server.headers.items()
            for name in names_inside(written)
        ]
        filled += [value for _, _, value in named if value]
        missing = [f"{header} names ${{{name}}}" for header, name, value in named if value is None]
        if missing:
            ungranted.append(server)
            problems.append(
                f"{task.path / 'task.toml'}: environment.mcp_servers[{number}] "
                f"({server.name}): header {'; '.join(missing)}, which is neither a secret "
                "of the run nor a host variable host_env names and the environment sets"
            )
            continue
        granted.append(_granted(server, number, *sources))
        values.update({name: value or "" for _, name, value in named})
    return McpAccess(
        mode=mode,
        granted=tuple(granted),
        ungranted=tuple(ungranted),
        problems=tuple(problems),
        secrets=tuple(filled),
        values=values,
    )


def _granted(server: MCPServerConfig, number: int, *sources: Mapping[str, str]) -> GrantedServer:
    """`server` with its headers filled from `sources`, each under the variable an
    in-sandbox agent reads it from."""
    return GrantedServer(
        config=server,
        headers={
            header: fill_inside(written, *sources) for header, written in server.headers.items()
        },
        variables={
            header: f"HARBOR_MCP_AUTH_{number}_{index}"
            for index, header in enumerate(server.headers)
        },
    )


def exposed_tool_name(server: str, tool: str, taken: set[str]) -> str:
    """The name a tool is offered to a model under: `mcp__<server>__<tool>`, within the
    characters and the 64 a function name may have, and unlike every name in `taken`."""
    base = _TOOL_NAME.sub("_", f"mcp__{server}__{tool}")[:64]
    name, number = base, 2
    while name in taken:
        suffix = f"_{number}"
        name, number = base[: 64 - len(suffix)] + suffix, number + 1
    taken.add(name)
    return name
