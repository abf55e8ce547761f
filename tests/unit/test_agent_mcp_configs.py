"""The granted MCP servers in each CLI agent's own configuration: Claude Code's
--mcp-config file, Codex's -c overrides, opencode's configuration file. A header's value
reaches the agent only in its environment; the configuration names the variable."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from pytest_harbor.harnesses.base import RecipeError
from pytest_harbor.harnesses.mcp.access import GrantedServer, McpAccess
from pytest_harbor.harnesses.mcp.agent_configs import agent_mcp_config
from pytest_harbor.harnesses.recipes import find_recipe, load_recipe
from pytest_harbor.tasks.config import MCPServerConfig

TOKEN = "tok-filled-value"


def granted(config: dict[str, object], number: int = 0) -> GrantedServer:
    server = MCPServerConfig.model_validate(config)
    headers = {header: value.replace("${TOKEN}", TOKEN) for header, value in server.headers.items()}
    variables = {header: f"HARBOR_MCP_AUTH_{number}_{i}" for i, header in enumerate(headers)}
    return GrantedServer(config=server, headers=headers, variables=variables)


ACCESS = McpAccess(
    mode="optional",
    granted=(
        granted(
            {
                "name": "tools",
                "transport": "streamable-http",
                "url": "http://tools:8000/mcp",
                "headers": {"Authorization": "Bearer ${TOKEN}"},
            }
        ),
        granted({"name": "events", "transport": "sse", "url": "http://events:8001/sse"}, 1),
        granted(
            {"name": "local", "transport": "stdio", "command": "python3", "args": ["s.py", "x y"]},
            2,
        ),
    ),
)


def test_claude_code_gets_its_mcp_config_file() -> None:
    made = agent_mcp_config(ACCESS, "claude-json", "/logs/agent")
    assert made.args == ["--mcp-config", "/logs/agent/mcp.json"]
    assert json.loads(made.files["mcp.json"]) == {
        "mcpServers": {
            "tools": {
                "type": "http",
                "url": "http://tools:8000/mcp",
                "headers": {"Authorization": "${HARBOR_MCP_AUTH_0_0}"},
            },
            "events": {"type": "sse", "url": "http://events:8001/sse", "headers": {}},
            "local": {"type": "stdio", "command": "python3", "args": ["s.py", "x y"]},
        }
    }
    assert made.env == {"HARBOR_MCP_AUTH_0_0": f"Bearer {TOKEN}"}
    assert TOKEN.encode() not in made.files["mcp.json"]


def test_codex_gets_overrides_and_leaves_out_what_it_cannot_speak() -> None:
    made = agent_mcp_config(ACCESS, "codex-overrides", "/logs/agent")
    assert made.files == {}
    overrides = made.args[1::2]
    assert made.args[0::2] == ["-c"] * len(overrides)
    # Each override's value is TOML, as Codex reads it.
    parsed = {
        key: tomllib.loads(f"v = {value}")["v"]
        for key, value in (override.split("=", 1) for override in overrides)
    }
    assert parsed == {
        "mcp_servers.tools.url": "http://tools:8000/mcp",
        "mcp_servers.tools.env_http_headers": {"Authorization": "HARBOR_MCP_AUTH_0_0"},
        "mcp_servers.local.command": "python3",
        "mcp_servers.local.args": ["s.py", "x y"],
    }
    assert made.left_out == ["events: Codex does not speak the sse transport"]
    assert made.env == {"HARBOR_MCP_AUTH_0_0": f"Bearer {TOKEN}"}


def test_codex_leaves_out_a_server_whose_name_breaks_a_dotted_key() -> None:
    access = McpAccess(
        mode="optional",
        granted=(granted({"name": "a.b", "transport": "streamable-http", "url": "http://x/"}),),
    )
    made = agent_mcp_config(access, "codex-overrides", "/logs/agent")
    assert made.args == [] and made.env == {}
    assert "a.b" in made.left_out[0]


def test_opencode_gets_a_config_file_named_in_its_environment() -> None:
    made = agent_mcp_config(ACCESS, "opencode-json", "/logs/agent")
    assert made.args == []
    assert made.env == {
        "HARBOR_MCP_AUTH_0_0": f"Bearer {TOKEN}",
        "OPENCODE_CONFIG": "/logs/agent/opencode-mcp.json",
    }
    assert json.loads(made.files["opencode-mcp.json"])["mcp"] == {
        "tools": {
            "type": "remote",
            "url": "http://tools:8000/mcp",
            "headers": {"Authorization": "{env:HARBOR_MCP_AUTH_0_0}"},
            "enabled": True,
        },
        "events": {
            "type": "remote",
            "url": "http://events:8001/sse",
            "headers": {},
            "enabled": True,
        },
        "local": {"type": "local", "command": ["python3", "s.py", "x y"], "enabled": True},
    }


@pytest.mark.parametrize("form", ["claude-json", "codex-overrides", "opencode-json"])
def test_nothing_is_added_when_no_server_is_granted(form: str) -> None:
    made = agent_mcp_config(McpAccess(mode="off"), form, "/logs/agent")  # type: ignore[arg-type]
    assert (made.files, made.args, made.env, made.left_out) == ({}, [], {}, [])


@pytest.mark.parametrize(
    ("recipe", "form"),
    [("claude-code", "claude-json"), ("codex", "codex-overrides"), ("opencode", "opencode-json")],
)
def test_the_shipped_recipes_name_their_agents_form(recipe: str, form: str) -> None:
    found = find_recipe(recipe)
    assert found is not None and found.mcp is not None
    assert found.mcp.format == form


def test_a_recipe_with_an_unknown_mcp_format_is_named_with_its_field(tmp_path: Path) -> None:
    shipped = find_recipe("codex")
    assert shipped is not None
    path = tmp_path / "agent.toml"
    text = (Path(__file__).parents[2] / "pytest_harbor/harnesses/recipes/codex.toml").read_text()
    path.write_text(text.replace('format = "codex-overrides"', 'format = "cursor"'))
    with pytest.raises(RecipeError, match=r"agent\.toml: mcp\.format: Input should be"):
        load_recipe(path)
