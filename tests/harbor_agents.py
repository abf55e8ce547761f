"""Running pytest from the Python 3.12 environment that has Harbor (`.venv-harbor`, made
by .ci/setup --tests) for the tests of Harbor's own agents, and terminus-2's answers."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.anthropic_server import MODEL as CLAUDE_MODEL
from tests.anthropic_server import ScriptedMessages
from tests.fixtures import REPO_ROOT
from tests.model_server import ScriptedModel

__all__ = ["HARBOR_PYTHON", "TMUX_DOCKERFILE", "harbor_pytest", "terminus"]

HARBOR_PYTHON = REPO_ROOT / ".venv-harbor" / "bin" / "python"
#: terminus-2 types into a tmux session in the sandbox: the image ships tmux.
TMUX_DOCKERFILE = (
    "FROM debian:bookworm-slim\n"
    "RUN apt-get update -qq && apt-get install -y -qq tmux > /dev/null && "
    "rm -rf /var/lib/apt/lists/*\n"
)


def needs_harbor() -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        not HARBOR_PYTHON.exists(),
        reason=".venv-harbor (Python 3.12 with pytest-harbor[harbor-agents]) is missing: "
        "run .ci/setup --tests on a machine with Python 3.12",
    )


def terminus(*keystrokes: str, complete: bool = False) -> str:
    """An answer in terminus-2's JSON format: keys to type, and whether it is done."""
    return json.dumps(
        {
            "analysis": "Looking at the terminal.",
            "plan": "Type the next commands.",
            "commands": [{"keystrokes": keys, "duration": 0.1} for keys in keystrokes],
            "task_complete": complete,
        }
    )


def harbor_pytest(
    cwd: Path,
    server: ScriptedModel | ScriptedMessages,
    *args: str,
    timeout: float = 600,
    extra_path: str = "",
    agent_options: bool = True,
) -> subprocess.CompletedProcess[str]:
    """pytest in `cwd`, from .venv-harbor, pointed at `server`; no network for LiteLLM's
    price list, and no terminal recording (it would install asciinema)."""
    env: dict[str, Any] = {
        **os.environ,
        "HARBOR_MODEL_API_KEY": server.api_key,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [extra_path, env.get("PYTHONPATH")]))
    return subprocess.run(
        [
            str(HARBOR_PYTHON),
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            f"--harbor-model={getattr(server, 'model', CLAUDE_MODEL)}",
            f"--harbor-model-url={server.url}",
            *(["--harbor-agent-option=record_terminal_session=false"] if agent_options else []),
            "--harbor-results-dir=out",
            "-rA",
            *args,
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
