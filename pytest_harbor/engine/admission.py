"""What a sandbox provider cannot run is refused at collection, naming the key or file;
what the settings, the harness or the provider refuse is refused again at the seed, as the
episode's `harbor:task_refused`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from pytest_harbor.engine.failures import EpisodeError, FailureKind
from pytest_harbor.harnesses.base import Harness
from pytest_harbor.sandboxes.base import SandboxCapabilities, SandboxProvider
from pytest_harbor.settings import HarborSettings
from pytest_harbor.tasks.config import EnvironmentConfig
from pytest_harbor.tasks.digest import task_digest
from pytest_harbor.tasks.errors import TaskLoadError
from pytest_harbor.tasks.task import Task, Turn
from pytest_harbor.templates import SecretReference

__all__ = [
    "check_digest",
    "model_route_refusal",
    "refuse_at_seed",
    "refuse_secrets_beside_root",
    "refuse_unrunnable",
]


def refuse_unrunnable(task: Task, capabilities: SandboxCapabilities, provider: str) -> None:
    """Raise TaskLoadError for the first thing `task` needs that the provider lacks."""
    task_file = task.path / "task.toml"
    if task.compose_file is not None and not capabilities.compose:
        raise TaskLoadError(
            task.compose_file, f"Compose tasks are not supported by the {provider} sandbox"
        )
    config = task.config
    for key, environment in _environments(task):
        _refuse_environment(task_file, key, environment, capabilities, provider)
    policies = [("agent", config.agent.network_mode), ("verifier", config.verifier.network_mode)]
    for index, step in enumerate(config.steps or []):
        policies += [
            (f"steps[{index}].agent", step.agent.network_mode),
            (f"steps[{index}].verifier", step.verifier.network_mode),
        ]
    for key, mode in policies:
        if mode == "allowlist" and not capabilities.network_allowlists:
            raise TaskLoadError(
                task_file,
                f'network_mode = "allowlist" cannot be enforced by the {provider} sandbox',
                key=f"{key}.network_mode",
            )
    verifier_compose = task.path / "tests" / "docker-compose.yaml"
    if verifier_compose.is_file():
        raise TaskLoadError(
            verifier_compose, "a separate verifier from a Compose file is not supported"
        )
    if task.compose_file is None:
        # Services other than main exist only in a Compose task (or under a
        # compose_overlay, which planning checks with the run's settings).
        lacking = (
            "the task has no Compose file"
            if capabilities.compose
            else f"needs Compose, which the {provider} sandbox lacks"
        )
        for index, hook in enumerate(config.verifier.collect):
            if hook.service != "main":
                raise TaskLoadError(
                    task_file,
                    f"service {hook.service!r}: {lacking}",
                    key=f"verifier.collect[{index}].service",
                )
        for index, artifact in enumerate(config.artifacts):
            if artifact.service not in (None, "main"):
                raise TaskLoadError(
                    task_file,
                    f"service {artifact.service!r}: {lacking}",
                    key=f"artifacts[{index}].service",
                )


def _environments(task: Task) -> Iterator[tuple[str, EnvironmentConfig]]:
    yield "environment", task.config.environment
    if task.config.verifier.environment is not None:
        yield "verifier.environment", task.config.verifier.environment


def _refuse_environment(
    task_file: Path,
    key: str,
    environment: EnvironmentConfig,
    capabilities: SandboxCapabilities,
    provider: str,
) -> None:
    if environment.os != "linux" and not capabilities.windows:
        raise TaskLoadError(
            task_file,
            f"{environment.os} tasks cannot run on the {provider} sandbox (Linux only)",
            key=f"{key}.os",
        )
    if (
        environment.docker_image is None
        and not capabilities.builds
        and (
            key != "environment"
            or task_file.with_name("environment").joinpath("Dockerfile").is_file()
        )
    ):
        raise TaskLoadError(
            task_file,
            f"the image is built from a Dockerfile, which the {provider} sandbox cannot run "
            "as its options set it up (the opensandbox provider needs a registry to send "
            "it to: sandbox_provider_options.registry)",
            key=f"{key}.docker_image",
        )
    if environment.gpus and not capabilities.gpus:
        raise TaskLoadError(
            task_file, f"the {provider} sandbox has no GPUs to give", key=f"{key}.gpus"
        )
    if environment.tpu is not None and not capabilities.tpus:
        raise TaskLoadError(task_file, f"the {provider} sandbox has no TPUs", key=f"{key}.tpu")
    if environment.network_mode == "allowlist" and not capabilities.network_allowlists:
        raise TaskLoadError(
            task_file,
            f'network_mode = "allowlist" cannot be enforced by the {provider} sandbox',
            key=f"{key}.network_mode",
        )


def refuse_at_seed(
    task: Task,
    settings: HarborSettings,
    harness: Harness,
    provider: SandboxProvider,
    *,
    separate_verifier: bool = False,
    relayed: bool = False,
) -> None:
    """Raise EpisodeError (`harbor:task_refused`) for what the settings, the harness or
    the provider cannot give the task (`separate_verifier`: the task verifies in a
    sandbox of its own; `relayed`: the harness reaches its model through the relay)."""
    reasons = (
        model_route_refusal(task, harness, provider, relayed=relayed),
        _continued_sessions(task, settings, harness),
        _artifacts_to_separate(task, settings),
        _verifier_allowlist(task, settings, separate_verifier),
        _snapshots(settings, provider),
        _offline(task, provider),
        _user_groups(task, provider),
        _unfilled_secrets(task, settings),
    )
    for reason in reasons:
        if reason is not None:
            raise EpisodeError(FailureKind.TASK_REFUSED, reason)


def model_route_refusal(
    task: Task, harness: Harness, provider: SandboxProvider, *, relayed: bool
) -> str | None:
    """Why an agent that calls its model from inside the sandbox cannot reach it here: the
    provider's sandboxes cannot reach the relay on this machine, or (with no relay) a
    phase gives the agent no network."""
    if not getattr(harness, "model_in_sandbox", False):
        return None
    if relayed and not provider.capabilities.model_relay:
        return (
            f"{harness.name} calls its model from inside the sandbox, through the model "
            f"relay on this machine, which the {provider.name} sandboxes cannot reach"
        )
    offline = [turn.name for turn in task.turns if not turn.agent_network]
    if not relayed and offline:
        where = "" if not task.config.is_multi_step else f" (step {offline[0]!r})"
        return (
            f"{harness.name} calls its model from inside the sandbox, but the task gives the "
            f"agent no network{where} and no model relay carries its calls"
        )
    return None


def _continued_sessions(task: Task, settings: HarborSettings, harness: Harness) -> str | None:
    continued = settings.turn_sessions == "continue"
    if task.config.is_multi_step and continued and not harness.can_continue:
        return (
            f"turn_sessions = continue needs a harness that can continue a session; "
            f"{harness.name} cannot (set turn_sessions to fresh)"
        )
    return None


def _artifacts_to_separate(task: Task, settings: HarborSettings) -> str | None:
    config = task.config
    if config.is_multi_step and settings.separate_verifier_for_artifacts and config.artifacts:
        return (
            "separate_verifier_for_artifacts cannot send a multi-step task to a separate "
            "verifier: multi-step tasks verify in their agent's sandbox"
        )
    return None


def _verifier_allowlist(
    task: Task, settings: HarborSettings, separate_verifier: bool
) -> str | None:
    verifier_hosts = any(turn.verifier_hosts is not None for turn in task.turns)
    if verifier_hosts and (settings.verify_from_snapshot or separate_verifier):
        return (
            'a verifier phase with network_mode = "allowlist" runs only in the agent\'s '
            "sandbox (shared verification); it is not enforced in a separate or snapshot one"
        )
    return None


def _snapshots(settings: HarborSettings, provider: SandboxProvider) -> str | None:
    if settings.verify_from_snapshot and not provider.capabilities.snapshots:
        return (
            f"verify_from_snapshot needs snapshots of the agent's sandbox, which the "
            f"{provider.name} sandbox does not take"
        )
    return None


def _offline(task: Task, provider: SandboxProvider) -> str | None:
    if provider.capabilities.network_off:
        return None
    offline = task.config.environment.network_mode == "no-network" or any(
        not (turn.agent_network and turn.verifier_network) for turn in task.turns
    )
    if offline:
        return (
            "the task has a phase without the network (network_mode = no-network), "
            f"which the {provider.name} sandboxes cannot go without as the provider is "
            "set (sandbox_provider_options.network on docker, "
            "sandbox_provider_options.network_policy on opensandbox)"
        )
    return None


def _user_groups(task: Task, provider: SandboxProvider) -> str | None:
    if provider.capabilities.user_groups:
        return None
    for turn in task.turns:
        for role, user in (("agent", turn.agent_user), ("verifier", turn.verifier_user)):
            if user is not None and ":" in user:
                return (
                    f"step {turn.name!r}: the {role} user {user!r} names a group, "
                    f"which the {provider.name} sandbox cannot apply"
                )
    return None


def _unfilled_secrets(task: Task, settings: HarborSettings) -> str | None:
    """A secret the task's verifier is given that these settings cannot fill: the task
    was loaded with the template sources of other settings."""
    known = {*settings.secrets, *settings.host_variables()}
    for turn in task.turns:
        where = f"step {turn.name!r}: " if task.config.is_multi_step else ""
        for variable, value in turn.verifier_env.items():
            if isinstance(value, SecretReference) and value.name not in known:
                return (
                    f"{where}the verifier's {variable} reads ${{{value.name}}}, which is "
                    "neither a secret of the run nor a host variable host_env names: load "
                    "the task with the settings it runs with "
                    "(load_task(path, variables=settings.template_sources()))"
                )
    return None


def check_digest(task: Task, expected: str | None) -> None:
    """Raise EpisodeError (`harbor:digest_mismatch`) when the task folder is no longer
    the one whose digest was `expected` (None: nothing to check)."""
    if expected is None:
        return
    now = task_digest(task.path)
    if now != expected:
        raise EpisodeError(
            FailureKind.DIGEST_MISMATCH,
            f"{task.path} changed since its row was written ({expected} then, {now} now); "
            "run again to materialize it afresh",
        )


def secrets_given(turn: Turn) -> list[str]:
    """The names of the secrets `turn`'s verifier gets in its environment, read from
    its references."""
    return sorted(
        {
            secret
            for value in turn.verifier_env.values()
            if isinstance(value, SecretReference)
            for secret in value.secrets
        }
    )


def refuse_secrets_beside_root(
    task: Task, agent_id: Callable[[Turn], str | None], verifier: str
) -> None:
    """Raise EpisodeError (`harbor:task_refused`) when a turn's verifier would get a secret
    where a root agent had been, that turn's or an earlier one's: in the sandbox it shared
    (a root agent's processes outlive its turn, into the later turns too, and the engine
    cannot tell them from the image's services), or in a snapshot of its file system (it
    may have edited the `bash` or the tools test.sh runs). `agent_id` gives a turn's agent
    user as numbers, None for root; `verifier` is the verification mode's name. A separate
    verifier's sandbox holds nothing of the agent's but the declared artifacts."""
    root: Turn | None = None
    for turn in task.turns:
        if root is None and agent_id(turn) is None:
            root = turn
        given = secrets_given(turn)
        if not given or root is None:
            continue
        multi = task.config.is_multi_step
        where = f"step {turn.name!r}: " if multi else ""
        who = f"the agent of step {root.name!r}" if multi else "the agent"
        place = (
            "in a snapshot of the file system it had, where a program it edited (bash, "
            "a tool test.sh runs) could read it"
            if verifier == "snapshot"
            else "in the sandbox the verifier shares, where a process it leaves could read it"
        )
        raise EpisodeError(
            FailureKind.TASK_REFUSED,
            f"{where}the verifier gets the secret {', '.join(given)} in its environment, but "
            f"{who} runs as root {place}; verify in a separate sandbox "
            "([verifier.environment] in task.toml) or run the agent as another user "
            "([agent] user in task.toml)",
        )
