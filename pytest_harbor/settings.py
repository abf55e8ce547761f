"""Run settings: the keys of the Gym harbor server's "Configure the server" table."""

from __future__ import annotations

import difflib
import os
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from pytest_harbor.agent_outcomes import AgentOutcomePolicy
from pytest_harbor.labels import LABEL_PREFIX
from pytest_harbor.reach import check_reach
from pytest_harbor.tasks.config import MCPServerConfig
from pytest_harbor.templates import TemplateSources

__all__ = [
    "CONFIG_BLOCK",
    "NOT_IMPLEMENTED",
    "SET_BY_THE_RUN",
    "Assignment",
    "HarborSettings",
    "ProviderBlock",
    "ResourcesOverride",
    "SettingsError",
    "literal_secrets",
    "load_settings",
    "parse_assignments",
    "secret_value",
]

#: Where a `--harbor-config` file keeps the settings, as Gym's config files do.
CONFIG_BLOCK = ("harbor_environment_server", "environment_servers", "harbor")

#: Keys of the table this release does not act on: setting one is refused, never ignored.
NOT_IMPLEMENTED: frozenset[str] = frozenset()
#: Keys Gym's `eval run` sets itself; here the command line does their job.
SET_BY_THE_RUN = frozenset({"agent_server", "tasksets", "sandbox_provider"})


class SettingsError(ValueError):
    """A setting that is unknown, malformed or not acted on; names the key and its source."""


class ResourcesOverride(BaseModel):
    """`sandbox_resources_override`: replaces only the task resources it names."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpu: float | None = Field(default=None, gt=0)
    memory_mib: int | None = Field(default=None, gt=0)
    disk_gib: float | None = Field(default=None, gt=0)


class ProviderBlock(BaseModel):
    """`gpu_sandbox_provider`: the provider tasks that ask for GPUs run on, and its
    options (as `--harbor-sandbox` and `sandbox_provider_options` give the run's own)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sandbox: str = Field(min_length=1)
    options: dict[str, Any] = {}


class ComposeOverlay(BaseModel):
    """`compose_overlay`: Compose files added after every task's own (a task without a
    Compose file becomes one), MCP servers for every task, and a prompt template around
    every instruction."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    files: list[str] = []
    #: MCP servers offered with every task's own; one with a task's server's name
    #: replaces it.
    mcp_servers: list[MCPServerConfig] = []
    #: `{instruction}` stands for the task's instruction.
    prompt_template: str | None = None

    @model_validator(mode="after")
    def _template_has_instruction(self) -> ComposeOverlay:
        if self.prompt_template is not None and "{instruction}" not in self.prompt_template:
            raise ValueError("prompt_template must contain {instruction}")
        return self


#: A sandbox's process cap (`sandbox_pids_limit`) unless the settings say otherwise.
DEFAULT_PIDS_LIMIT = 4096


class HarborSettings(BaseModel):
    """Every key with the seed's default; unknown keys are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu_sandbox_provider: ProviderBlock | None = None
    request_gpu_type: bool = False
    sandbox_ready_timeout_s: float = Field(default=900.0, gt=0)
    #: pytest-harbor's own: how long a sandbox start waits for an engine that stopped
    #: answering (restarted, say) before the run stops.
    engine_recovery_timeout_s: float = Field(default=120.0, gt=0)
    image_pull_retries: int = Field(default=2, ge=0)
    sandbox_provider_options: dict[str, Any] = {}
    sandbox_metadata: dict[str, str] = {"benchmark": "harbor"}
    sandbox_resources_override: ResourcesOverride | None = None
    enforce_task_timeouts: bool = True
    harness_setup_allowance_s: float = Field(default=300.0, ge=0)
    verifier_grace_s: float = Field(default=30.0, ge=0)
    step_setup_timeout_s: float | None = Field(default=None, gt=0)
    default_episode_timeout_seconds: float = Field(default=21600.0, gt=0)
    cleanup_timeout_seconds: float = Field(default=180.0, gt=0)
    sandbox_ttl_slack_s: float = Field(default=900.0, ge=0)
    #: A sandbox started ahead of its episode (while the one before it works) waits for
    #: it at most this long, then is removed: the episode starts a fresh one.
    started_ahead_idle_s: float = Field(default=600.0, gt=0)
    max_concurrent_episodes: int | None = Field(default=None, ge=1)
    queue_timeout_seconds: float | None = Field(default=None, gt=0)
    separate_verifier_for_artifacts: bool = False
    #: pytest-harbor's own: how many images are made at once ahead of the episodes (task
    #: images, verifier images, Compose builds, agent installs); 0 makes each in the first
    #: episode that needs it.
    image_build_concurrency: int = Field(default=4, ge=0)
    #: pytest-harbor's own: verify every shared-mode turn in a fresh sandbox started from
    #: a snapshot of the agent's (its files, none of its processes).
    verify_from_snapshot: bool = False
    #: pytest-harbor's own: the most processes (threads included) a sandbox may hold at
    #: once, so that one episode cannot take the machine's from the others; null: no cap.
    sandbox_pids_limit: int | None = Field(default=DEFAULT_PIDS_LIMIT, ge=64)
    #: Each value as given (`env:NAME`, `file:PATH` or itself) until load_settings reads
    #: it; revealed_secrets() hands the values to the few places that need one.
    secrets: dict[str, SecretStr] = {}
    #: pytest-harbor's own: the host variables a task's `${NAME}` templates may read
    #: (in any env table); no other reaches a task, and a secret's value never reaches
    #: a table but a verifier's.
    host_env: list[str] = []
    #: pytest-harbor's own: a task's Dockerfile may `ADD` a URL or a git repository, which
    #: the engine fetches itself from this machine's network (refused by default).
    allow_remote_add: bool = False
    #: pytest-harbor's own: what a sandbox (a Compose service, a build step) may reach
    #: beyond the internet, each `HOST:PORT` (an address, `[IPv6]`, a name, or
    #: `host-gateway` for this machine), by TCP and UDP; nothing else on this machine,
    #: link-local, private or shared addresses opens.
    reach: list[str] = []
    task_mcp_grants: Literal["off", "optional", "required"] = "off"
    turn_sessions: Literal["fresh", "continue"] = "fresh"
    #: pytest-harbor's own: a multi-step episode's reward over the steps that ran (the
    #: reference's rule) or over every declared step, one that did not run counting 0
    #: (an agent cannot raise its mean by ending the episode early).
    multi_step_rollup: Literal["ran", "declared"] = "ran"
    #: What the run's exit status says: `items`, pytest's (a failed item, such as a reward
    #: under the pass mark, fails the run); `results`, for evaluations: 0 when every
    #: selected episode has a result, whatever its reward, 1 when one has none.
    exit_status: Literal["items", "results"] = "items"
    compose_variables: dict[str, str] = {}
    compose_overlay: ComposeOverlay | None = None
    agent_outcome_policy: AgentOutcomePolicy = AgentOutcomePolicy()
    artifacts_dir: str | None = None
    agent_server: Any = None
    tasksets: Any = None
    sandbox_provider: Any = None

    @field_validator("reach")
    @classmethod
    def _reach_entries(cls, entries: list[str]) -> list[str]:
        check_reach(entries)
        return entries

    @model_validator(mode="after")
    def _cap_needs_queue_timeout(self) -> HarborSettings:
        if self.max_concurrent_episodes is not None and self.queue_timeout_seconds is None:
            raise ValueError("max_concurrent_episodes requires queue_timeout_seconds")
        for key in self.sandbox_metadata:
            if key.startswith(LABEL_PREFIX):
                raise ValueError(f"sandbox_metadata key {key!r} is reserved ({LABEL_PREFIX}*)")
        return self

    def redacted(self) -> dict[str, Any]:
        """The settings as data, secret values hidden (for summaries and logs)."""
        data = self.model_dump(mode="json")
        data["secrets"] = {name: "***" for name in self.secrets}
        return data

    def revealed_secrets(self) -> dict[str, str]:
        """Each secret's value by its name, for what needs the value itself: the
        verifier's environment, MCP headers, the redactor and the manifest's fingerprint."""
        return {name: secret.get_secret_value() for name, secret in self.secrets.items()}

    def host_variables(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """The host variables a task may see, with their values: those `host_env` names
        that `environ` (this process's environment when not given) sets, and no other."""
        environ = os.environ if environ is None else environ
        return {name: environ[name] for name in self.host_env if name in environ}

    def template_sources(self, environ: Mapping[str, str] | None = None) -> TemplateSources:
        """What a task's `${NAME}`s may read: the host variables, and the secrets by name.

        A host variable that holds a secret's text (a secret given as `env:VAR` while
        `host_env` names VAR) is handed on by name too, as a carrier of that secret: a
        task that names it is refused, or given a reference, as one that names the secret
        is. This comparison is a defence where text the run does not own enters a task
        (docs/decisions.md); from here on a secret travels by name.
        """
        secrets = self.revealed_secrets()
        host: dict[str, str] = {}
        carriers: dict[str, tuple[str, ...]] = {}
        for name, value in self.host_variables(environ).items():
            held = tuple(secret for secret, text in secrets.items() if text and text in value)
            if held:
                carriers[name] = held
            else:
                host[name] = value
        return TemplateSources(host=host, secrets=frozenset(secrets), carriers=carriers)


@dataclass(frozen=True)
class Assignment:
    """One `--harbor-set KEY.PATH=VALUE`, read once: its key's path and its value."""

    #: As given, for the messages that say where a setting came from.
    text: str
    keys: tuple[str, ...]
    #: Read as YAML: numbers, booleans, lists, maps.
    value: Any


def parse_assignments(texts: Iterable[str]) -> list[Assignment]:
    """`a.b=VALUE` assignments, each read into its key's path and its YAML value."""
    parsed = []
    for text in texts:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise SettingsError(f"--harbor-set {text!r}: expected KEY=VALUE")
        parsed.append(Assignment(text, tuple(key.strip().split(".")), _scalar(value)))
    return parsed


def literal_secrets(assignments: Iterable[Assignment]) -> list[str]:
    """The secrets `assignments` give as literal values (not `env:` or `file:`)."""
    found = []
    for assignment in assignments:
        keys, value = assignment.keys, assignment.value
        if keys[0] != "secrets":
            continue
        values = {".".join(keys[1:]): value} if len(keys) > 1 else value
        if not isinstance(values, dict):
            continue
        found += [
            name for name, given in values.items() if not str(given).startswith(("env:", "file:"))
        ]
    return found


#: YAML 1.1 reads these as booleans; settings mean them as words (`task_mcp_grants=off`).
_WORDS = {"yes", "no", "on", "off", "y", "n"}


def _scalar(value: str) -> Any:
    if not value.strip() or value.strip().lower() in _WORDS:
        return value.strip()
    import yaml  # read only when a setting is given as text

    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        return value


def load_settings(
    ini: Mapping[str, str],
    config_files: Iterable[Path],
    assignments: Iterable[Assignment],
    sources: dict[str, str] | None = None,
) -> HarborSettings:
    """Defaults < ini keys < config files in order < `--harbor-set` (the last one wins).
    `sources`, when given, is filled with where each setting given came from."""
    values: dict[str, Any] = {}
    sources = {} if sources is None else sources
    for key, text in ini.items():
        values[key] = _scalar(text)
        sources[key] = f"ini key harbor_{key}"
    for path in config_files:
        for key, value in _config_block(path).items():
            values[key] = value
            sources[key] = str(path)
    for assignment in assignments:
        _set_dotted(values, list(assignment.keys), assignment.value)
        sources[assignment.keys[0]] = f"--harbor-set {assignment.text}"
    settings = _validated(values, sources)
    _refuse_set_by_the_run(settings, sources)
    source = sources.get("secrets", "settings")
    secrets = {
        name: SecretStr(secret_value(name, given.get_secret_value(), source))
        for name, given in settings.secrets.items()
    }
    return settings.model_copy(update={"secrets": secrets}) if secrets else settings


def _validated(values: dict[str, Any], sources: Mapping[str, str]) -> HarborSettings:
    """`values` as settings; an unknown key or a bad value names where it came from."""
    unknown = sorted(set(values) - set(HarborSettings.model_fields))
    if unknown:
        raise SettingsError(
            "unknown setting "
            + ", ".join(f"{key!r} (from {sources[key]}){_nearest(key)}" for key in unknown)
        )
    try:
        return HarborSettings.model_validate(values)
    except ValidationError as error:
        errors = error.errors()
        # A misspelt key is also a required one missing: the misspelling is what to say.
        first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        message = first["msg"].removeprefix("Value error, ")
        if not first["loc"]:
            # A rule between settings: the message names them.
            given = sorted(set(values) & set(sources))
            where = ", ".join(sorted({sources[key] for key in given})) or "the settings"
            raise SettingsError(f"settings (from {where}): {message}") from None
        key = ".".join(str(part) for part in first["loc"])
        source = sources.get(str(first["loc"][0]), "settings")
        raise SettingsError(f"setting {key} (from {source}): {_in_our_words(first)}") from None


def _in_our_words(error: Any) -> str:
    """A nested key's error as a person reads it: an unknown key with the nearest of the
    keys its table takes, a missing one as required; others as pydantic words them."""
    loc = tuple(error["loc"])
    keys = _keys_at(loc[:-1])
    if error["type"] == "extra_forbidden" and keys is not None:
        near = difflib.get_close_matches(str(loc[-1]), keys, n=1, cutoff=0.6)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        return f"no such key{hint} (it takes {', '.join(sorted(keys))})"
    if error["type"] == "missing":
        return "required, and not given"
    return str(error["msg"]).removeprefix("Value error, ")


def _keys_at(path: tuple[Any, ...]) -> list[str] | None:
    """The keys of the table at `path` in the settings (None: not a table of known keys)."""
    model: type[BaseModel] | None = HarborSettings
    for part in path:
        field = None if model is None else model.model_fields.get(str(part))
        if field is None:
            return None
        model = _model_of(field.annotation)
    return None if model is None else list(model.model_fields)


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (`Model | None` gives Model)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in typing.get_args(annotation):
        if isinstance(argument, type) and issubclass(argument, BaseModel):
            return argument
    return None


def _nearest(key: str) -> str:
    """`; did you mean 'KEY'?` for the setting nearest `key`, when one is near."""
    near = difflib.get_close_matches(key, list(HarborSettings.model_fields), n=1, cutoff=0.75)
    return f"; did you mean {near[0]!r}?" if near else ""


def _refuse_set_by_the_run(settings: HarborSettings, sources: Mapping[str, str]) -> None:
    """What the run sets itself, and what this release does not act on, is refused."""
    defaults = HarborSettings()
    reserved = sorted(SET_BY_THE_RUN & settings.model_fields_set)
    if reserved:
        raise SettingsError(
            "set by the run itself, not by settings: "
            + ", ".join(f"{key} (from {sources[key]})" for key in reserved)
        )
    refused = [
        key
        for key in sorted(NOT_IMPLEMENTED & settings.model_fields_set)
        if getattr(settings, key) != getattr(defaults, key)
    ]
    if refused:
        raise SettingsError(
            "not implemented in this release, so not accepted: "
            + ", ".join(f"{key} (from {sources[key]})" for key in refused)
        )


def secret_value(name: str, value: str, source: str) -> str:
    """A secret as given: `env:NAME` reads the environment variable, `file:PATH` the file
    (one trailing newline dropped); anything else is the value itself."""
    if value.startswith("env:"):
        variable = value[len("env:") :]
        if variable not in os.environ:
            raise SettingsError(
                f"setting secrets.{name} (from {source}): the variable {variable} is not set"
            )
        return os.environ[variable]
    if value.startswith("file:"):
        path = Path(value[len("file:") :]).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise SettingsError(
                f"setting secrets.{name} (from {source}): cannot read {path}: {error}"
            ) from None
        return text.removesuffix("\n")
    return value


def _config_block(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise SettingsError(f"--harbor-config {path}: cannot be read as YAML: {error}") from None
    block: Any = data
    for part in CONFIG_BLOCK:
        if not isinstance(block, dict) or part not in block:
            raise SettingsError(
                f"--harbor-config {path}: expected the block {'.'.join(CONFIG_BLOCK)}"
            )
        block = block[part]
    if block is None:
        return {}
    if not isinstance(block, dict):
        raise SettingsError(f"--harbor-config {path}: {'.'.join(CONFIG_BLOCK)} must be a mapping")
    return block


def _set_dotted(values: dict[str, Any], keys: list[str], value: Any) -> None:
    """`secrets.TOKEN=x` sets one entry of a mapping, keeping the rest (defaults too)."""
    target = values
    for depth, key in enumerate(keys[:-1]):
        child = target.get(key)
        if child is None and depth == 0 and key in HarborSettings.model_fields:
            child = HarborSettings.model_fields[key].get_default(call_default_factory=True)
        target[key] = child = dict(child) if isinstance(child, dict) else {}
        target = child
    target[keys[-1]] = value
