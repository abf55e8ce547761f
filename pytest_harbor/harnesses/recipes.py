"""Recipes: how to install a CLI agent in a sandbox and run one turn of it.

A recipe is a TOML file (the format is documented in docs/run-a-cli-agent.md). The ones
shipped live beside this module, in `recipes/`; other packages add theirs through the
`pytest_harbor.recipes` entry-point group (the entry point names a recipe file's path, a
`Recipe`, or a function returning either), and `--harbor-agent` also takes a recipe file's
path.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pytest_harbor.agent_outcomes import AGENT_CAUSES
from pytest_harbor.harnesses import BUILT_IN_RECIPES, RECIPE_ENTRY_POINT_GROUP, RECIPES
from pytest_harbor.harnesses.base import RecipeError
from pytest_harbor.harnesses.mcp.agent_configs import McpFormat
from pytest_harbor.harnesses.model_request import ModelApi

__all__ = [
    "BUILT_IN_RECIPES",
    "RECIPES",
    "RECIPE_ENTRY_POINT_GROUP",
    "Recipe",
    "RecipeError",
    "find_recipe",
    "load_recipe",
    "recipe_names",
    "render",
]

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
#: What a run command may name; the environment may name these and `api_key` too.
COMMAND_PLACEHOLDERS = frozenset(
    {"instruction_file", "model", "model_url", "model_url_root", "workdir", "logs_dir", "version"}
)
ENV_PLACEHOLDERS = COMMAND_PLACEHOLDERS | {"api_key"}
INSTALL_PLACEHOLDERS = frozenset({"version"})


class InstallStep(BaseModel):
    """`[install]`: a POSIX sh script run as root in the task's image, once per (image,
    recipe, version); its result is kept as an image."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    script: str = Field(min_length=1)
    timeout_sec: float = Field(default=900.0, gt=0)


class RunStep(BaseModel):
    """`[run]`: the command of one turn (run with the image's /bin/sh, as the agent user,
    from the working directory) and the environment it gets."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: str = Field(min_length=1)
    env: dict[str, str] = {}


class LogsStep(BaseModel):
    """`[logs]`: which files under /logs/agent are kept with the results, and the
    converter that turns the agent's own log into an ATIF trajectory."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    keep: list[str] = []
    #: A built-in converter's name, or `module:function` (see converters.py).
    trajectory: str | None = None


class McpStep(BaseModel):
    """`[mcp]`: how the agent reads the MCP servers granted to it (task_mcp_grants): the
    form the harness writes them in (harnesses/mcp/agent_configs.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: McpFormat


class Recipe(BaseModel):
    """One CLI agent: what it speaks, how it installs, how one turn runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    description: str = ""
    #: The API the agent calls its model with.
    api: ModelApi
    #: The pinned version the install script installs ({{ version }}).
    version: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._+~-]*$")
    install: InstallStep
    run: RunStep
    logs: LogsStep = LogsStep()
    #: Without it, the agent finds its MCP servers only in the task description file.
    mcp: McpStep | None = None
    #: Patterns (regular expressions) in the output of a run that failed, by the cause
    #: they show: rate_limited, api_error, context_length_exceeded, timeout.
    causes: dict[str, list[str]] = {}

    @field_validator("causes")
    @classmethod
    def _known_causes(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for cause, patterns in value.items():
            if cause not in AGENT_CAUSES:
                raise ValueError(f"unknown cause {cause!r}; causes: {', '.join(AGENT_CAUSES)}")
            for pattern in patterns:
                try:
                    re.compile(pattern)
                except re.error as error:
                    raise ValueError(f"{cause}: bad pattern {pattern!r}: {error}") from None
        return value

    def check_placeholders(self, source: str) -> None:
        """Every {{ name }} is one its field may use; the key only in the environment."""
        fields: list[tuple[str, str, frozenset[str]]] = [
            ("install.script", self.install.script, INSTALL_PLACEHOLDERS),
            ("run.command", self.run.command, COMMAND_PLACEHOLDERS),
        ]
        fields += [
            (f"run.env.{key}", value, ENV_PLACEHOLDERS) for key, value in self.run.env.items()
        ]
        for where, text, allowed in fields:
            for name in _PLACEHOLDER.findall(text):
                if name not in allowed:
                    hint = (
                        " (the API key reaches the agent only through its environment: "
                        "use it in [run.env])"
                        if name == "api_key"
                        else ""
                    )
                    raise RecipeError(
                        f"{source}: {where}: unknown placeholder {{{{ {name} }}}}{hint}; "
                        f"allowed here: {', '.join(sorted(allowed))}"
                    )

    def with_version(self, version: str) -> Recipe:
        return Recipe.model_validate({**self.model_dump(), "version": version})


def render(text: str, values: Mapping[str, str], *, quote: bool) -> str:
    """`text` with each {{ name }} replaced by its value (shell-quoted with `quote`)."""

    def value(match: re.Match[str]) -> str:
        found = values[match.group(1)]
        return shlex.quote(found) if quote else found

    return _PLACEHOLDER.sub(value, text)


def load_recipe(path: Path) -> Recipe:
    """A recipe from its TOML file; RecipeError names the file and the field."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise RecipeError(f"{path}: cannot read the recipe: {error.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise RecipeError(f"{path}: not valid TOML: {error}") from None
    return _validated(data, str(path))


def _validated(data: Any, source: str) -> Recipe:
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        key = ".".join(str(part) for part in first["loc"]) or "(recipe)"
        raise RecipeError(
            f"{source}: {key}: {first['msg'].removeprefix('Value error, ')}"
        ) from None
    recipe.check_placeholders(source)
    return recipe


def _from_entry_point(value: Any, source: str) -> Recipe:
    if callable(value) and not isinstance(value, Recipe):
        value = value()
    if isinstance(value, Recipe):
        recipe = value
        recipe.check_placeholders(source)
        return recipe
    if isinstance(value, (str, Path)):
        return load_recipe(Path(value))
    raise RecipeError(f"{source}: gives {type(value).__name__}, not a recipe or its path")


def recipe_names() -> list[str]:
    """The recipes that can be named with --harbor-agent."""
    return RECIPES.names()


def find_recipe(name: str) -> Recipe | None:
    """The recipe `name` (shipped or from an entry point), or the recipe file at the path
    `name` (ending in .toml); None when there is none of that name."""
    if name.endswith(".toml"):
        return load_recipe(Path(name))
    shipped = RECIPES.built_in.get(name)
    if shipped is not None:
        return load_recipe(shipped)
    ep = RECIPES.entry_point(name)
    if ep is not None:
        return _from_entry_point(ep.load(), f"entry point {ep.name} ({ep.value})")
    return None
