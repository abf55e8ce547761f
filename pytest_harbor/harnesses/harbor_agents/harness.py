"""`--harbor-agent=harbor:NAME` (or `harbor:module.path:Class`): Harbor's own agents, run
unchanged on the episode's sandbox through SandboxEnvironment.

The agent is made once per session and set up in `open_session` (within the harness's
set-up allowance); each turn runs `agent.run()` on an event loop of its own, bounded by the
turn's deadline and stopped when the run is interrupted. Harbor is imported here only.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any

from pytest_harbor.harnesses.base import (
    AgentFailure,
    AgentRun,
    AgentSetupError,
    Deadline,
    Harness,
    HarnessOptionsError,
    HarnessSession,
    SessionContext,
    TurnContext,
    Usage,
)
from pytest_harbor.sandboxes.base import SandboxProvider
from pytest_harbor.untrusted import load_json

__all__ = ["HarborAgentHarness"]


class _Cancelled(Exception):
    """The run is being interrupted."""


class HarborAgentHarness(Harness):
    """One of Harbor's agents: a registered name (`terminus-2`) or an import path
    (`package.module:Class`)."""

    needs_model = True
    #: One agent can take every step of a multi-step task (`turn_sessions = continue`), as
    #: `harbor run` does: set up once, `run()` once per step.
    can_continue = True

    def __init__(self, agent: str, options: Mapping[str, Any] | None = None) -> None:
        self.agent = agent
        self.name = f"harbor:{agent}"
        self.options = dict(options or {})
        from harbor.agents.factory import AgentFactory
        from harbor.models.agent.name import AgentName

        if ":" not in agent and agent not in AgentFactory.registered_names():
            raise HarnessOptionsError(
                f"Harbor has no agent {agent!r}; it has "
                + ", ".join(AgentFactory.registered_names())
            )
        self._factory = AgentFactory
        self._name_type = AgentName
        agent_class = self._agent_class()
        connection = getattr(agent_class, "MODEL_CONNECTION", None)
        #: The provider a bare --harbor-model name is given (`anthropic` for claude-code).
        self._provider = getattr(connection, "default_provider", None) or "openai"
        if self._provider == "anthropic":
            # Asked of the model endpoint before the run (SpeaksModelApi).
            self.model_api = "anthropic-messages"
        #: An agent Harbor installs in the sandbox, and the recipe of the same name that
        #: installs it here once per image and version (None: Harbor's own install()
        #: runs in every episode's set-up).
        self._installed = _is_installed_agent(agent_class)
        #: An installed agent calls its model from inside the sandbox: the engine gives it
        #: the model relay's route there (engine/model_access.py).
        self.model_in_sandbox = self._installed
        self._recipe = _recipe_harness(agent, self.options) if self._installed else None

    def prepare_image(
        self, image: str, provider: SandboxProvider, labels: Mapping[str, str]
    ) -> str:
        """An installed agent with a recipe of the same name is installed by the recipe's
        cached layer, once per image and version; Harbor's install() is then skipped."""
        if self._recipe is None:
            return image
        return str(self._recipe.prepare_image(image, provider, labels))

    def open_session(self, context: SessionContext) -> HarnessSession:
        from pytest_harbor.harnesses.harbor_agents.environment import SandboxEnvironment

        logs = context.logs.host_dir
        logs.mkdir(parents=True, exist_ok=True)
        environment = SandboxEnvironment(
            task_dir=context.task.path,
            name=context.task.id,
            session_id=context.episode_id,
            trial_dir=logs / ".harbor-trial",
            workdir=context.workdir,
        )
        environment.default_user = context.agent_user
        agent = self._make(logs, context)
        session = _Session(agent, environment)
        try:
            session.call(context, agent.setup(environment))
        except _Timeout:
            raise AgentSetupError("the agent's set-up ran out of time", "timeout") from None
        except _Cancelled:
            raise AgentSetupError("the run was interrupted during the agent's set-up") from None
        except Exception as error:  # the agent's own failure, whatever its kind
            raise AgentSetupError(f"the agent's set-up failed: {_describe(error)}") from None
        return session

    def _make(self, logs: Path, context: SessionContext) -> Any:
        """The agent, as Harbor's factory makes it, pointed at the run's model: the model
        by name (`openai/NAME` unless it names a provider), the base URL for agents that
        take one, the key in the environment of the agent's commands."""
        try:
            agent_class = self._agent_class()
            kwargs: dict[str, Any] = dict(self.options)
            if self._recipe is not None:
                kwargs["skip_install"] = True
            model = context.model
            model_name = None
            if model is not None:
                model_name = model.name if "/" in model.name else f"{self._provider}/{model.name}"
                base_url = model.url_in_sandbox if self._installed else model.base_url
                if self._provider == "anthropic":
                    base_url = base_url.removesuffix("/v1")  # the Messages API's base
                if getattr(agent_class, "MODEL_CONNECTION", None) is not None:
                    kwargs.setdefault("base_url", base_url)
                key = model.api_key.get_secret_value() if model.api_key is not None else ""
                kwargs.setdefault("extra_env", _model_env(self._provider, key, base_url))
                for name in ("temperature", "reasoning_effort"):
                    if name in model.params:
                        kwargs.setdefault(name, model.params[name])
            if context.mcp.granted:
                # Harbor's way: the entries as the task writes them, `${VAR}` filled by
                # the agent from its environment, which gets the variables here.
                from harbor.models.task.config import MCPServerConfig

                kwargs["mcp_servers"] = [
                    MCPServerConfig.model_validate(entry) for entry in context.mcp.as_written()
                ]
                kwargs["extra_env"] = {**kwargs.get("extra_env", {}), **context.mcp.values}
            return agent_class(logs_dir=logs, model_name=model_name, **kwargs)
        except Exception as error:  # Harbor's own refusal, whatever its kind
            raise AgentSetupError(
                f"cannot make Harbor's {self.agent}: {_describe(error)}"
            ) from None

    def _agent_class(self) -> Any:
        if ":" in self.agent:
            from pytest_harbor.harnesses.harbor_agents.private import import_agent_class

            return import_agent_class(self.agent)
        return self._factory.get_agent_class(self._name_type(self.agent))


class _Timeout(Exception):
    """The call ran past its deadline."""


class _Session:
    def __init__(self, agent: Any, environment: Any) -> None:
        self.agent = agent
        self.environment = environment

    def call(self, context: SessionContext, work: Coroutine[Any, Any, Any]) -> Any:
        """Run `work` against this call's sandbox, until it ends, the deadline passes
        (_Timeout) or the run is interrupted (_Cancelled)."""
        self.environment.attach(context.sandbox, context.deadline)
        try:
            return asyncio.run(_bounded(work, context.deadline, context.cancel))
        finally:
            self.environment.detach()

    def run_turn(self, context: TurnContext) -> AgentRun:
        from harbor.models.agent.context import AgentContext

        from pytest_harbor.harnesses.harbor_agents.causes import cause_of

        agent_context = AgentContext()
        failure: AgentFailure | None = None
        timed_out = False
        try:
            self.call(context, self.agent.run(context.instruction, self.environment, agent_context))
        except _Timeout:
            timed_out = True
            failure = AgentFailure("timeout", "the agent ran out of time")
        except _Cancelled:
            failure = AgentFailure("agent_crashed", "the run was interrupted")
        except Exception as error:  # the agent's own failure, whatever its kind
            failure = AgentFailure(cause_of(error), _describe(error))
        trajectory = _trajectory(context.logs.host_dir)
        return AgentRun(
            timed_out=timed_out,
            failure=failure,
            usage=_usage(agent_context, trajectory),
            trajectory=trajectory,
            log_tail=_describe_logs(context.logs.host_dir),
        )

    def close(self, context: SessionContext) -> None:
        self.environment.detach()


async def _bounded(
    work: Coroutine[Any, Any, Any], deadline: Deadline, cancel: threading.Event
) -> Any:
    task = asyncio.ensure_future(work)
    while not task.done():
        if cancel.is_set() or deadline.expired:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            raise _Cancelled() if not deadline.expired else _Timeout()
        await asyncio.wait({task}, timeout=min(0.1, max(deadline.remaining(), 0.01)))
    return task.result()


def _is_installed_agent(agent_class: Any) -> bool:
    from harbor.agents.installed.base import BaseInstalledAgent

    return isinstance(agent_class, type) and issubclass(agent_class, BaseInstalledAgent)


def _recipe_harness(agent: str, options: Mapping[str, Any]) -> Any:
    """The CLI-agent harness of the shipped recipe named `agent`, at the version the
    options ask for (the recipe's own otherwise), or None."""
    from pytest_harbor.harnesses.cli_agent import CliAgentHarness
    from pytest_harbor.harnesses.recipes import find_recipe

    recipe = find_recipe(agent)
    if recipe is None:
        return None
    version = options.get("version")
    return CliAgentHarness(recipe, {"version": str(version)} if version else None)


def _usage(context: Any, trajectory: Any) -> Usage:
    """The agent context's tokens and cost; its model calls counted as the trajectory's
    agent steps (Harbor's context does not count them)."""
    steps = trajectory.steps if trajectory is not None else []
    return Usage(
        prompt_tokens=context.n_input_tokens or 0,
        completion_tokens=context.n_output_tokens or 0,
        requests=sum(1 for step in steps if step.source == "agent"),
        cost_usd=context.cost_usd,
    )


def _trajectory(logs: Path) -> Any:
    """The agent's ATIF trajectory, as the engine's ATIF v1.7 subset takes it; None (the
    engine then writes its own two-step transcript) when there is none or it does not fit."""
    from pydantic import ValidationError

    from pytest_harbor.harnesses.atif import ATIF_VERSION, Trajectory

    path = logs / "trajectory.json"
    if not path.is_file():
        return None
    try:
        data, error = load_json(path.read_bytes())
    except OSError:
        return None
    if error is not None or not isinstance(data, dict):
        return None
    data["schema_version"] = ATIF_VERSION
    try:
        return Trajectory.model_validate(data)
    except (ValueError, ValidationError):
        return None


def _model_env(provider: str, key: str, base_url: str) -> dict[str, str]:
    """The model's key in the variable the agent's provider reads it from (and, for
    OpenAI's, the base URL in OpenAI's own variable, for agents that take no `base_url`)."""
    from pytest_harbor.harnesses.harbor_agents.private import key_variable

    env = {key_variable(provider): key}
    if provider == "openai":
        env["OPENAI_BASE_URL"] = base_url
    return env


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:2000]


def _describe_logs(logs: Path) -> str:
    names = sorted(str(path.relative_to(logs)) for path in logs.rglob("*") if path.is_file())
    return "Harbor agent logs: " + ", ".join(names[:20]) if names else ""
