"""The two builders of an engine's images: BuildKit through the buildx CLI plugin, and the
classic builder through the engine's API; the same options reach both. A build that failed
is noted, so that the run's other trials of the task get its failure without building."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import docker
import docker.errors

from pytest_harbor.sandboxes.base import BuildOptions, SandboxStartError
from pytest_harbor.sandboxes.docker.engine import (
    ENGINE_ERRORS,
    TRANSPORT_ERRORS,
    Endpoint,
    cli_environment,
    explain,
    tail_lines,
)

__all__ = [
    "BUILDER_SETTING",
    "ClassicBuild",
    "ClassicRefusal",
    "builder_hint",
    "buildkit_build",
    "buildx_answers",
    "buildx_options",
    "classic_options",
    "failed_build",
    "note_failed_build",
]


#: The setting that picks a builder, as a run's command line gives it.
BUILDER_SETTING = "sandbox_provider_options.builder"


def builder_hint(builder: str) -> str:
    """The last line of a failed build's message: which builder ran, and how to get the
    other. The two read some Dockerfiles differently (the classic builder refuses a `COPY`
    of several sources to a destination without a trailing `/`, which BuildKit, Harbor's
    builder through Compose, accepts), so a task that builds under Harbor can fail here."""
    if builder == "buildkit":
        return (
            f"built with BuildKit ({BUILDER_SETTING}=buildkit), its RUN steps offline; "
            "without that setting the classic builder builds, its steps on the sandboxes' "
            "network"
        )
    return (
        "built with the classic builder (the docker provider's default), which refuses some "
        "Dockerfiles BuildKit (Harbor's and docker build's builder) accepts; "
        f"--harbor-set {BUILDER_SETTING}=buildkit builds with BuildKit (the docker buildx "
        "plugin), its RUN steps offline"
    )


class ClassicRefusal(SandboxStartError):
    """The classic builder refused a Dockerfile's form (a flag or syntax of BuildKit's),
    before or instead of running its steps: BuildKit may read it."""

    def __init__(self, message: str, *, refusal: str) -> None:
        super().__init__(message)
        self.refusal = refusal


def buildx_answers(endpoint: Endpoint | None = None) -> bool:
    """Whether `docker buildx` answers for the engine at `endpoint`."""
    try:
        answer = subprocess.run(
            ["docker", "buildx", "version"],
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=30,
            env=cli_environment(endpoint),
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return answer.returncode == 0


def buildx_options(options: BuildOptions, dockerfile: Path | None) -> list[str]:
    """The `docker buildx build` flags for `options` (their labels aside: the caller
    merges them with the run's); `dockerfile` when not the context's own."""
    flags: list[str] = []
    if dockerfile is not None:
        flags += ["--file", str(dockerfile)]
    for name, value in options.args:
        flags += ["--build-arg", f"{name}={value}"]
    if options.target is not None:
        flags += ["--target", options.target]
    for host, address in options.extra_hosts:
        flags += ["--add-host", f"{host}:{address}"]
    if options.network is not None:
        flags += ["--network", options.network]
    if options.platform is not None:
        flags += ["--platform", options.platform]
    if options.pull:
        flags.append("--pull")
    return flags


def classic_options(options: BuildOptions, dockerfile: Path | None) -> dict[str, Any]:
    """The classic builder's arguments (docker-py's `APIClient.build`) for `options`, as
    buildx_options() gives BuildKit's. A Dockerfile outside the context is sent inside it
    by docker-py."""
    arguments: dict[str, Any] = {"buildargs": dict(options.args), "pull": options.pull}
    if dockerfile is not None:
        arguments["dockerfile"] = str(dockerfile)
    if options.target is not None:
        arguments["target"] = options.target
    if options.extra_hosts:
        arguments["extra_hosts"] = dict(options.extra_hosts)
    if options.network is not None:
        arguments["network_mode"] = options.network
    if options.platform is not None:
        arguments["platform"] = options.platform
    return arguments


def buildkit_build(
    context: Path,
    *,
    tag: str,
    labels: Mapping[str, str],
    nocache: bool,
    what: str,
    budget: float,
    budget_name: str,
    endpoint: Endpoint | None = None,
    flags: list[str] | None = None,
) -> None:
    """A BuildKit build through the buildx CLI plugin (its default builder is the
    engine's own, so the image lands in the engine), with further `flags`. A build past
    `budget` is stopped: its client goes, and BuildKit cancels what it was doing."""
    command = ["docker", "buildx", "build", "--progress=plain", "-t", tag]
    for key, value in labels.items():
        command += ["--label", f"{key}={value}"]
    if nocache:
        command.append("--no-cache")
    command += [*(flags or []), str(context)]
    try:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            start_new_session=True,
            env=cli_environment(endpoint),
        )
    except OSError as error:
        raise SandboxStartError(f"{what}: cannot run docker buildx: {error}") from None
    try:
        output, _ = process.communicate(timeout=budget)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        raise SandboxStartError(
            f"{what} took longer than {budget_name} = {budget:g} s\n"
            + tail_lines(output.splitlines())
        ) from None
    if process.returncode != 0:
        raise SandboxStartError(
            f"{what} failed:\n{tail_lines(output.splitlines())}\n{builder_hint('buildkit')}"
        )


def _failure_file(tag: str) -> Path:
    return Path(tempfile.gettempdir()) / f"pytest-harbor-build-{tag}.failed"


def failed_build(tag: str, run: str) -> str | None:
    """The error of a build of `tag` that failed earlier in the run `run`, if one did."""
    if not run:
        return None
    try:
        noted = json.loads(_failure_file(tag).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(noted, dict) or noted.get("run") != run:
        return None
    return str(noted.get("error"))


def note_failed_build(tag: str, run: str, error: str) -> None:
    if run:
        with contextlib.suppress(OSError):
            _failure_file(tag).write_text(json.dumps({"run": run, "error": error}))


#: What a classic build keeps of its output: its last lines, each cut to so many characters.
LOG_LINES = 200
LINE_CHARS = 2000


class ClassicBuild:
    """One image build, followed event by event (run() in a thread of its own)."""

    _STEP_CONTAINER = re.compile(r"Running in ([0-9a-f]{12,64})")
    _STEP_IMAGE = re.compile(r"^---> ([0-9a-f]{12,64})$")

    def __init__(self, api: docker.APIClient, **arguments: Any) -> None:
        self._api = api
        self._arguments = arguments
        #: The last lines of the build's output (LOG_LINES, each cut at LINE_CHARS): a step
        #: that prints without end costs the run no more.
        self.log: list[str] = []
        self._steps: list[str] = []
        self.error: str | None = None
        self._step_container: str | None = None

    def run(self) -> None:
        try:
            for event in self._api.build(**self._arguments):
                text = str(event.get("stream", ""))
                self._keep(text.splitlines())
                running = self._STEP_CONTAINER.search(text)
                if running:
                    self._step_container = running.group(1)
                if "error" in event:
                    self.error = str(event["error"]).strip()
        except ENGINE_ERRORS as error:
            self.error = explain(error)
        except TRANSPORT_ERRORS as error:
            self.error = str(error)

    def _keep(self, lines: list[str]) -> None:
        for line in lines:
            step = self._STEP_IMAGE.match(line.strip())
            if step is not None:
                self._steps.append(step.group(1))
        self.log.extend(line[:LINE_CHARS] for line in lines[-LOG_LINES:])
        if len(self.log) > 2 * LOG_LINES:
            del self.log[:-LOG_LINES]

    def remove_steps(self) -> None:
        """After a failed build: the untagged images its finished steps left (kept by the
        builder as a cache) go, latest first; tagged ones and those still used stay."""
        for image in reversed(self._steps):
            with contextlib.suppress(docker.errors.APIError):
                if not self._api.inspect_image(image).get("RepoTags"):
                    self._api.remove_image(image)

    def stop(self) -> None:
        if self._step_container is not None:
            with contextlib.suppress(docker.errors.APIError):
                self._api.kill(self._step_container)
