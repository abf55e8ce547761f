"""Harnesses: built in `oracle`, `nop` and `shell-agent`; others from the
`pytest_harbor.harnesses` entry-point group or the `pytest_harbor_harnesses` hook."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_harbor.harnesses.base import (
    AGENT_LOGS,
    ATIF_VERSION,
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
    PreparesImage,
    RecipeError,
    SessionContext,
    SpeaksModelApi,
    TurnContext,
    Usage,
    parse_options,
)
from pytest_harbor.harnesses.model import ModelConfig
from pytest_harbor.harnesses.nop import NopHarness
from pytest_harbor.harnesses.oracle import OracleHarness
from pytest_harbor.registry import Registry

if TYPE_CHECKING:
    from pytest_harbor.harnesses.atif import Trajectory

__all__ = [
    "AGENT_LOGS",
    "ATIF_VERSION",
    "BUILT_IN_HARNESSES",
    "BUILT_IN_RECIPES",
    "ENTRY_POINT_GROUP",
    "HARNESSES",
    "RECIPES",
    "RECIPE_ENTRY_POINT_GROUP",
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
    "PreparesImage",
    "RecipeError",
    "SessionContext",
    "SpeaksModelApi",
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


#: Harnesses by name: built in, from the pytest hook, from installed packages.
HARNESSES: Registry[HarnessFactory] = Registry("harness", ENTRY_POINT_GROUP, BUILT_IN_HARNESSES)

#: CLI agents' recipes: shipped beside recipes.py, or named by an installed package's
#: entry point (a recipe file's path, a Recipe, or a function returning either).
RECIPE_ENTRY_POINT_GROUP = "pytest_harbor.recipes"
BUILT_IN_RECIPES = Path(__file__).parent / "recipes"


def _shipped_recipes() -> dict[str, Path]:
    return {path.stem: path for path in BUILT_IN_RECIPES.glob("*.toml")}


#: Recipes by name (listed without loading one: recipes.py reads them).
RECIPES: Registry[Path] = Registry("recipe", RECIPE_ENTRY_POINT_GROUP, _shipped_recipes)


def harness_names(registered: Mapping[str, HarnessFactory] | None = None) -> list[str]:
    """Every name --harbor-agent takes (CLI agents' recipes included)."""
    return sorted(set(HARNESSES.names(registered)) | set(RECIPES.names()))


def make_harness(
    name: str,
    options: Mapping[str, Any] | None = None,
    *,
    registered: Mapping[str, HarnessFactory] | None = None,
) -> Harness:
    """A harness by name: built in, `registered` (by the pytest hook), an installed entry
    point naming a class or a factory (each called with `options=`), or a CLI agent's
    recipe (by name, or a recipe file's path; RecipeError when it is broken)."""
    if name.startswith("harbor:"):
        # One of Harbor's own agents: Harbor is imported only now (an optional extra).
        from pytest_harbor.harnesses.harbor_agents import harbor_agent

        return harbor_agent(name, options)
    factory = HARNESSES.find(name, registered)
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


def __getattr__(name: str) -> Any:
    # The trajectory models load when a harness first needs them, not with the plugin.
    if name == "Trajectory":
        from pytest_harbor.harnesses.atif import Trajectory

        return Trajectory
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
