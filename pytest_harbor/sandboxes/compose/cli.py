"""The Docker Compose v2 CLI (`docker compose`), the one place it is run: with the
environment its caller hands it (a provider points it at its engine), never this
process's own whole."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CLI_VARIABLES",
    "CONFIG_TIMEOUT_S",
    "ComposeRun",
    "ComposeUnavailable",
    "cli_variables",
    "compose",
    "compose_config",
]

#: What the docker CLI needs of this process's environment to run (none of it a secret):
#: the CLI, Compose and buildx run with these alone (and the ssh client's agent socket),
#: and a Compose file's `${NAME}` can read them and the run's host_env, nothing else.
CLI_VARIABLES = (
    "PATH",
    "HOME",
    "TMPDIR",
    "XDG_CONFIG_HOME",
    "XDG_RUNTIME_DIR",
    "DOCKER_HOST",
    "DOCKER_CONTEXT",
    "DOCKER_CONFIG",
    "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY",
)
#: `docker compose config` gets this long; `up` has the sandbox's own start limit.
CONFIG_TIMEOUT_S = 60.0
#: The exit status a run that went past its time limit is given (as timeout(1) does).
TIMED_OUT = 124


class ComposeUnavailable(RuntimeError):
    """The docker CLI, or its Compose v2 plugin, is not installed."""


@dataclass(frozen=True)
class ComposeRun:
    """How one run of `docker compose` ended."""

    returncode: int
    stdout: str
    stderr: str
    #: It went past its time limit and was ended (returncode TIMED_OUT).
    timed_out: bool = False


def cli_variables(extra: Sequence[str] = ()) -> dict[str, str]:
    """CLI_VARIABLES (and the `extra` names) as this process has them."""
    return {name: os.environ[name] for name in (*CLI_VARIABLES, *extra) if name in os.environ}


def compose(
    arguments: Sequence[str], *, env: Mapping[str, str], timeout: float, what: str
) -> ComposeRun:
    """`docker compose ARGUMENTS` with exactly `env` as its environment and no input; a
    run past `timeout` ends with exit status TIMED_OUT and says so (`docker compose WHAT
    took over N s`). Raises ComposeUnavailable when there is no docker CLI."""
    try:
        done = subprocess.run(
            ["docker", "compose", *arguments],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
            env=dict(env),
        )
    except FileNotFoundError:
        raise ComposeUnavailable(
            "the docker CLI is not installed (Compose tasks need it)"
        ) from None
    except subprocess.TimeoutExpired:
        said = f"docker compose {what} took over {timeout:g} s"
        return ComposeRun(TIMED_OUT, "", said, timed_out=True)
    return ComposeRun(done.returncode, done.stdout, done.stderr)


def compose_config(
    files: Sequence[Path], project_dir: Path, env: Mapping[str, str]
) -> dict[str, Any]:
    """`docker compose config` of `files`: merged, interpolated (from `env` alone), in
    canonical form. Raises ComposeUnavailable when Compose v2 is missing or does not
    answer in time, ValueError with Compose's own words when it refuses the files."""
    arguments = ["--project-directory", str(project_dir)]
    for file in files:
        arguments += ["-f", str(file)]
    done = compose(
        [*arguments, "config", "--format", "json"],
        env=env,
        timeout=CONFIG_TIMEOUT_S,
        what="config",
    )
    if done.timed_out:
        raise ComposeUnavailable(done.stderr)
    if done.returncode != 0:
        message = done.stderr.strip() or done.stdout.strip()
        if "is not a docker command" in message or "unknown shorthand flag" in message:
            raise ComposeUnavailable(
                "Docker Compose v2 is not installed (`docker compose`); .ci/setup installs it"
            )
        raise ValueError(message.splitlines()[-1] if message else "docker compose config failed")
    data: dict[str, Any] = json.loads(done.stdout)
    return data
