"""Harbor's names outside its public API that the `harbor:` harnesses rely on, each
reached here and nowhere else.

A Harbor release may rename any of them: `harbor_agent()` checks them all before it makes
a harness, and HarborApiMissing (an ImportError, so a usage error) names what is gone.
`tests/unit/test_harbor_names.py` checks them against the installed Harbor.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Final

from pytest_harbor.harnesses.harbor_agents import HARBOR_VERSIONS

__all__ = [
    "RELIED_ON",
    "DefinitionChecked",
    "HarborApiMissing",
    "PrivateName",
    "import_agent_class",
    "key_variable",
    "merge_env",
    "require_all",
    "resolve_user",
]

#: The variable of the model's key for a provider Harbor's table does not name: the model
#: endpoint speaks OpenAI's Chat Completions.
DEFAULT_KEY_VARIABLE: Final = "OPENAI_API_KEY"


class HarborApiMissing(ImportError):
    """The installed Harbor lacks a name the adapter relies on."""


@dataclass(frozen=True)
class PrivateName:
    """A name in one of Harbor's modules (`Class.attribute` for a class's), and what the
    adapter does with it."""

    module: str
    path: str
    use: str

    def resolve(self) -> Any:
        """What the name holds in the installed Harbor, else HarborApiMissing."""
        try:
            found: Any = importlib.import_module(self.module)
            for part in self.path.split("."):
                found = getattr(found, part)
        except (ImportError, AttributeError):
            raise _missing(f"{self.module}.{self.path}", self.use) from None
        return found


IMPORT_AGENT_CLASS: Final = PrivateName(
    "harbor.agents.factory",
    "_import_agent_class",
    "load an agent by import path (harbor:package.module:Class)",
)
RESOLVE_USER: Final = PrivateName(
    "harbor.environments.base",
    "BaseEnvironment._resolve_user",
    "run an agent's command as the user it names, else the task's agent user",
)
MERGE_ENV: Final = PrivateName(
    "harbor.environments.base",
    "BaseEnvironment._merge_env",
    "give an agent's command the environment the agent set for it",
)
VALIDATE_DEFINITION: Final = PrivateName(
    "harbor.environments.base",
    "BaseEnvironment._validate_definition",
    "present the episode's sandbox as an environment (the check it asks of every one)",
)
PROVIDERS: Final = PrivateName(
    "harbor.agents.agent_auth_resolution",
    "PROVIDERS",
    "name the variable an agent's provider reads the model's key from",
)
#: Every name this module reaches.
RELIED_ON: Final = (IMPORT_AGENT_CLASS, RESOLVE_USER, MERGE_ENV, VALIDATE_DEFINITION, PROVIDERS)


def require_all() -> None:
    """HarborApiMissing for the first name of RELIED_ON the installed Harbor lacks."""
    for name in RELIED_ON:
        name.resolve()


def import_agent_class(path: str) -> Any:
    """The agent class at `package.module:Class`, loaded as Harbor's factory loads it."""
    return IMPORT_AGENT_CLASS.resolve()(path)


def resolve_user(environment: Any, user: str | int | None) -> str | int | None:
    """The user a command of `environment` runs as: `user`, else its default user."""
    resolved: str | int | None = RESOLVE_USER.resolve()(environment, user)
    return resolved


def merge_env(environment: Any, env: dict[str, str] | None) -> dict[str, str] | None:
    """A command's environment: the environment's own variables, then `env`, then the
    ones an agent scoped to its calls."""
    merged: dict[str, str] | None = MERGE_ENV.resolve()(environment, env)
    return merged


def key_variable(provider: str) -> str:
    """The variable an agent reads its `provider`'s key from, by Harbor's table of
    providers (the first it tries); DEFAULT_KEY_VARIABLE for a provider the table does
    not name."""
    access = PROVIDERS.resolve().get(provider)
    if access is None:
        return DEFAULT_KEY_VARIABLE
    try:
        names: list[str] = access.api_key_candidate_names
    except AttributeError:
        name = f"{PROVIDERS.module}.ProviderAccess.api_key_candidate_names"
        raise _missing(name, PROVIDERS.use) from None
    return names[0] if names else DEFAULT_KEY_VARIABLE


class DefinitionChecked:
    """For a subclass of Harbor's BaseEnvironment, which asks each environment to check
    its task's definition files (VALIDATE_DEFINITION, abstract): the episode loaded and
    checked the task, and the sandbox is running."""

    def _validate_definition(self) -> None:
        pass


def _missing(name: str, use: str) -> HarborApiMissing:
    return HarborApiMissing(
        f"the installed Harbor ({_version()}) has no {name}, which pytest-harbor needs to "
        f"{use}; install Harbor {HARBOR_VERSIONS} (pytest-harbor[harbor-agents])"
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("harbor")
    except PackageNotFoundError:
        return "version unknown"
