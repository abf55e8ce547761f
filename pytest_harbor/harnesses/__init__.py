"""Harnesses: built in `oracle`, `nop` and `shell-agent`; others from the
`pytest_harbor.harnesses` entry-point group or the `pytest_harbor_harnesses` hook."""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from pytest_harbor.harnesses.atif import ATIF_VERSION, Trajectory
from pytest_harbor.harnesses.base import (
    AGENT_LOGS,
    AgentFailure,
    AgentLogs,
    AgentRun,
    AgentSetupError,
    Deadline,
    Harness,
    HarnessFactory,
    HarnessOptionsError,
    HarnessSession,
    ModelGate,
    SessionContext,
    TurnContext,
    Usage,
    parse_options,
)
from pytest_harbor.harnesses.model import ModelConfig
from pytest_harbor.harnesses.nop import NopHarness
from pytest_harbor.harnesses.oracle import OracleHarness

__all__ = [
    "AGENT_LOGS",
    "ATIF_VERSION",
    "BUILT_IN_HARNESSES",
    "ENTRY_POINT_GROUP",
    "AgentFailure",
    "AgentLogs",
    "AgentRun",
    "AgentSetupError",
    "Deadline",
    "Harness",
    "HarnessFactory",
    "HarnessOptionsError",
    "HarnessSession",
    "ModelConfig",
    "ModelGate",
    "NopHarness",
    "OracleHarness",
    "SessionContext",
    "Trajectory",
    "TurnContext",
    "UnknownHarness",
    "Usage",
    "harness_names",
    "make_harness",
    "parse_options",
]

ENTRY_POINT_GROUP = "pytest_harbor.harnesses"


def _shell_agent(options: Mapping[str, Any] | None = None) -> Harness:
    # Imported when asked for: it needs the optional `agents` extra (httpx).
    from pytest_harbor.harnesses.shell_agent import ShellAgentHarness

    return ShellAgentHarness(options)


BUILT_IN_HARNESSES: dict[str, HarnessFactory] = {
    "oracle": OracleHarness,
    "nop": NopHarness,
    "shell-agent": _shell_agent,
}


class UnknownHarness(LookupError):
    pass


def harness_names(registered: Mapping[str, HarnessFactory] | None = None) -> list[str]:
    from pytest_harbor.harnesses.recipes import recipe_names

    names = set(BUILT_IN_HARNESSES) | set(registered or {}) | set(recipe_names())
    return sorted(names | {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def make_harness(
    name: str,
    options: Mapping[str, Any] | None = None,
    *,
    registered: Mapping[str, HarnessFactory] | None = None,
) -> Harness:
    """A harness by name: built in, `registered` (by the pytest hook), an installed entry
    point naming a class or a factory (each called with `options=`), or a CLI agent's
    recipe (by name, or a recipe file's path; RecipeError when it is broken)."""
    factory = BUILT_IN_HARNESSES.get(name) or (registered or {}).get(name)
    if factory is None:
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if ep.name == name:
                factory = ep.load()
                break
    if factory is None:
        # A CLI agent by its recipe: shipped, from an entry point, or a recipe file.
        from pytest_harbor.harnesses.cli_agent import CliAgentHarness
        from pytest_harbor.harnesses.recipes import find_recipe

        recipe = find_recipe(name)
        if recipe is not None:
            return CliAgentHarness(recipe, options)
        raise UnknownHarness(
            f"unknown harness {name!r}; available: {', '.join(harness_names(registered))}"
        )
    return factory(options=dict(options or {}))
