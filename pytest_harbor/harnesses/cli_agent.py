"""The in-sandbox harness: a CLI agent installed in the sandbox by a recipe, run once per
turn, talking to the model from inside the sandbox.

The install runs once per (task image, recipe, version) and is kept as an image (see
`prepare_image`), before the episode's clock starts. A turn writes the instruction to a file
in the sandbox, runs the recipe's command with the model's URL and key in the command's
environment only (in a run, the model relay's route into the sandbox and the episode's
token: never the endpoint's key), keeps the files the recipe names and the command's
output, and turns the agent's own log into an ATIF trajectory when the recipe has a
converter.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
import shlex
import tarfile
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from pytest_harbor.display import harbor_logger
from pytest_harbor.harnesses.base import (
    AGENT_LOGS,
    AgentFailure,
    AgentRun,
    AgentSetupError,
    Harness,
    HarnessSession,
    SessionContext,
    TurnContext,
    Usage,
    parse_options,
)
from pytest_harbor.harnesses.converters import ConverterInput, convert
from pytest_harbor.harnesses.mcp.agent_configs import agent_mcp_config
from pytest_harbor.harnesses.model_request import RequestShape
from pytest_harbor.harnesses.recipes import Recipe, render
from pytest_harbor.labels import AGENT_LABEL, RUN_LABEL
from pytest_harbor.redaction import clip_head, clip_tail
from pytest_harbor.sandboxes.base import (
    ExecResult,
    ImageLayer,
    SandboxError,
    SandboxProvider,
    SandboxStartError,
)
from pytest_harbor.sandboxes.copies import AGENT_LOGS_COPY, bounded, members

__all__ = ["INSTRUCTION_FILE", "CliAgentHarness", "CliAgentOptions"]

log = harbor_logger()

#: Where a turn's instruction is written for the agent to read.
INSTRUCTION_FILE = f"{AGENT_LOGS}/instruction.md"
#: Bumped when the way an install image is made changes (so old ones are not reused).
_LAYER_FORMAT = "1"
_LOG_TAIL_CHARS = 4000
#: Of each kept file at most this much is copied (its end is cut).
_KEPT_FILE_CAP = 64 * 1024 * 1024
_NO_KEY = "EMPTY"


class CliAgentOptions(BaseModel):
    """The `--harbor-agent-option` keys every recipe takes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Install this version instead of the recipe's pinned one (its own cached image).
    version: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._+~-]*$")
    #: Make the install image again (once per run), even when one is cached.
    rebuild: bool = False
    #: Words added to the end of the run command, as they are (shell syntax).
    extra_args: str = ""
    #: Replaces the recipe's [install].timeout_sec.
    install_timeout_sec: float | None = Field(default=None, gt=0)


class CliAgentHarness(Harness):
    """A recipe's CLI agent, run inside the sandbox (see the module's docstring)."""

    needs_model: ClassVar[bool] = True
    #: The agent calls its model from inside the sandbox: the engine gives it the model
    #: relay's route there, in every agent phase (engine/model_access.py).
    model_in_sandbox: ClassVar[bool] = True

    def __init__(self, recipe: Recipe, options: Mapping[str, Any] | None = None) -> None:
        self.options = parse_options(CliAgentOptions, recipe.name, options)
        self.recipe = (
            recipe if self.options.version is None else recipe.with_version(self.options.version)
        )
        self.name = recipe.name
        #: The API the agent speaks (the model endpoint's preflight asks it that way).
        self.model_api = recipe.api
        #: The pre-flight request: of the agent's API, offering a tool as agents do (the
        #: agent's own tools and parameters are its own business).
        self.model_request = RequestShape(recipe.api)

    # ------------------------------------------------------------------------ install

    @property
    def install_key(self) -> str:
        """What the install image depends on, besides the task's image."""
        recipe = self.recipe
        content = json.dumps(
            [_LAYER_FORMAT, recipe.name, recipe.version, recipe.install.script], sort_keys=True
        )
        return hashlib.sha256(content.encode()).hexdigest()

    def prepare_image(
        self, image: str, provider: SandboxProvider, labels: Mapping[str, str]
    ) -> str:
        recipe = self.recipe
        run_id = labels.get(RUN_LABEL)
        script = f"set -e\nexport AGENT_VERSION={recipe.version}\n" + render(
            recipe.install.script, {"version": recipe.version}, quote=True
        )
        layer = ImageLayer(
            base=image,
            script=script,
            key=self.install_key,
            what=f"the {recipe.name} {recipe.version} install",
            timeout_sec=self.options.install_timeout_sec or recipe.install.timeout_sec,
            labels={**labels, AGENT_LABEL: f"{recipe.name}@{recipe.version}"},
            rebuild_unless=(RUN_LABEL, run_id) if self.options.rebuild and run_id else None,
        )
        try:
            return provider.prepare_layer(layer)
        except SandboxStartError as error:
            raise AgentSetupError(f"cannot install the agent on {image}: {error}") from None

    # ------------------------------------------------------------------------ turns

    def open_session(self, context: SessionContext) -> HarnessSession:
        if context.model is None:
            raise ValueError(f"{self.name} needs a model (--harbor-model and --harbor-model-url)")
        return _CliSession(self)


class _CliSession:
    def __init__(self, harness: CliAgentHarness) -> None:
        self.harness = harness
        self.recipe = harness.recipe

    def close(self, context: SessionContext) -> None:
        pass

    def run_turn(self, context: TurnContext) -> AgentRun:
        recipe, sandbox, model = self.recipe, context.sandbox, context.model
        assert model is not None
        sandbox.upload({"instruction.md": context.instruction.encode()}, AGENT_LOGS)
        workdir = context.workdir or "."
        values = {
            "instruction_file": INSTRUCTION_FILE,
            "model": model.name,
            "model_url": model.url_in_sandbox,
            "model_url_root": re.sub(r"/v1/?$", "", model.url_in_sandbox),
            "workdir": workdir,
            "logs_dir": AGENT_LOGS,
            "version": recipe.version,
        }
        command = render(recipe.run.command, values, quote=True)
        if self.harness.options.extra_args:
            command += " " + self.harness.options.extra_args
        key = model.api_key.get_secret_value() if model.api_key is not None else _NO_KEY
        env = {
            name: render(value, {**values, "api_key": key}, quote=False)
            for name, value in recipe.run.env.items()
        }
        if recipe.mcp is not None:
            tools = agent_mcp_config(context.mcp, recipe.mcp.format, AGENT_LOGS)
            for left_out in tools.left_out:
                log.warning("%s: MCP server %s", context.episode_id, left_out)
            if tools.files:
                sandbox.upload(tools.files, AGENT_LOGS)
            command += "".join(" " + shlex.quote(word) for word in tools.args)
            env.update(tools.env)
        result = sandbox.exec(
            ["/bin/sh", "-c", command],
            user=context.agent_user,
            workdir=context.workdir,
            env=env,
            timeout=context.deadline.remaining(),
        )
        host = context.logs.host_dir
        (host / "stdout.txt").write_bytes(result.stdout_bytes)
        (host / "stderr.txt").write_bytes(result.stderr_bytes)
        kept = _keep_files(context, recipe.logs.keep)
        trajectory = None
        if recipe.logs.trajectory is not None:
            trajectory, note = convert(
                recipe.logs.trajectory,
                ConverterInput(
                    files=kept,
                    stdout=result.stdout,
                    agent=recipe.name,
                    version=recipe.version,
                    model=model.name,
                    session_id=f"{context.episode_id}/{context.step}",
                    instruction=context.instruction,
                ),
            )
            if note:
                log.warning("%s: %s", context.episode_id, note)
        usage = _usage(trajectory)
        return AgentRun(
            exit_code=result.exit_code,
            timed_out=result.timed_out,
            log_tail=_tail(result),
            response=_last_answer(trajectory),
            trajectory=trajectory,
            usage=usage,
            failure=None if result.timed_out else _failure(recipe, result),
        )


def _failure(recipe: Recipe, result: ExecResult) -> AgentFailure | None:
    """A run that exited non-zero (its cause told by the recipe's patterns, else a
    crash), or printed nothing at all."""
    if result.exit_code == 0:
        if result.stdout_bytes.strip() or result.stderr_bytes.strip():
            return None
        return AgentFailure(
            cause="agent_crashed", message=f"{recipe.name} exited 0 but printed nothing"
        )
    output = result.stdout + "\n" + result.stderr
    for cause, patterns in recipe.causes.items():
        if any(re.search(pattern, output) for pattern in patterns):
            # The agent's commands print into this output too: the cause is a claim.
            return AgentFailure(
                cause=cause,  # type: ignore[arg-type]
                message=f"{recipe.name} exited {result.exit_code}: {_last_line(result)}",
                claimed=True,
            )
    what = "was not found" if result.exit_code == 127 else f"exited {result.exit_code}"
    return AgentFailure(
        cause="agent_crashed", message=f"{recipe.name} {what}: {_last_line(result)}"
    )


def _last_line(result: ExecResult) -> str:
    for text in (result.stderr, result.stdout):
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if lines:
            return clip_head(lines[-1], 500)
    return "(no output)"


def _tail(result: ExecResult) -> str:
    text = clip_tail(result.stdout, _LOG_TAIL_CHARS)
    if result.stderr.strip():
        text += "\n--- stderr ---\n" + clip_tail(result.stderr, _LOG_TAIL_CHARS)
    return text.strip()


def _usage(trajectory: Any) -> Usage | None:
    metrics = getattr(trajectory, "final_metrics", None)
    if metrics is None:
        return None
    requests = sum(step.llm_call_count or 0 for step in trajectory.steps) or sum(
        1 for step in trajectory.steps if step.source == "agent"
    )
    return Usage(
        prompt_tokens=metrics.total_prompt_tokens or 0,
        completion_tokens=metrics.total_completion_tokens or 0,
        requests=requests,
        cost_usd=metrics.total_cost_usd,
    )


def _last_answer(trajectory: Any) -> str | None:
    if trajectory is None:
        return None
    for step in reversed(trajectory.steps):
        if step.source == "agent" and step.message and not step.tool_calls:
            return str(step.message)
    return None


def _keep_files(context: TurnContext, patterns: list[str]) -> dict[str, bytes]:
    """The files below /logs/agent matching `patterns` (globs on their path there),
    copied to the host folder and returned (the converter reads them)."""
    if not patterns:
        return {}
    try:
        chunks = context.sandbox.iter_archive(AGENT_LOGS)
    except SandboxError:
        return {}
    if chunks is None:
        return {}
    kept: dict[str, bytes] = {}
    stream = bounded(chunks, AGENT_LOGS_COPY, AGENT_LOGS)
    try:
        for archive, member in members(stream):
            relative = _relative(member.name)
            if relative is None or not member.isfile():
                continue
            if not any(fnmatch.fnmatch(relative, pattern) for pattern in patterns):
                continue
            source = archive.extractfile(member)
            if source is None:
                continue
            data = source.read(_KEPT_FILE_CAP)
            context.logs.place(relative).write_bytes(data)
            kept[relative] = data
    except (tarfile.TarError, SandboxError, OSError) as error:
        # What was copied is kept; the rest is lost with the sandbox (a cap reached
        # included: CopyCapped is a SandboxError).
        log.info("copying %s stopped: %s", AGENT_LOGS, error)
    finally:
        stream.close()
    return kept


def _relative(name: str) -> str | None:
    """A member's path below the folder (the archive's top entry is its name), or None
    for the folder itself and for anything that would leave it."""
    parts = PurePosixPath(name).parts[1:]
    if not parts or any(part in ("..", "") for part in parts) or parts[0].startswith("/"):
        return None
    return str(PurePosixPath(*parts))
