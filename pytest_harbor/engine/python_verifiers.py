"""Turns graded by a Python `verify(...)` (the reference documents' Python verifiers):
the files the engine ships into /tests for such a turn, and how a contract error reads.

The shipped `test.sh` finds a Python of 3.8 or newer and runs the runner
(`sandbox_python/run_verifier.py`) in isolated mode; the runner loads the engine's own
helpers (`harbor_verifiers`) first, then the verifier, calls `verify(...)` with what it
declares and writes `reward.txt` for a number, `reward.json` for a dict. All of it lands
in `/tests/.harbor/` after the task's own tests, so nothing of the task's takes its place.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pytest_harbor.tasks import Turn

__all__ = ["CONTRACT_FILE", "SHIPPED", "contract_error", "response_object", "verifier_files"]

#: The engine's files for a Python verifier, in this package.
_RUNNER = Path(__file__).parent / "sandbox_python"
#: Where they go, below /tests.
SHIPPED = ".harbor"
#: What the runner (or its test.sh) writes to /logs/verifier when it cannot call verify().
CONTRACT_FILE = "contract-error.txt"
_SHOWN = 2000


def verifier_files(turn: Turn, response: str | None) -> dict[str, bytes]:
    """The named files a turn's verification uploads besides its tests (paths below `/`):
    none for a turn graded by `test.sh`; for a Python one, the engine's `test.sh`, runner
    and helpers, the settings (the module, the task's fields), the dataset's own files,
    and the agent's final answer (`response`, None for the oracle) as a Responses
    object."""
    python = turn.python_verifier
    if python is None:
        return {}
    base = f"tests/{SHIPPED}"
    files = {
        "tests/test.sh": (_RUNNER / "test.sh").read_bytes(),
        f"{base}/run_verifier.py": (_RUNNER / "run_verifier.py").read_bytes(),
        f"{base}/harbor_verifiers/__init__.py": (
            _RUNNER / "harbor_verifiers" / "__init__.py"
        ).read_bytes(),
        f"{base}/verifier.json": json.dumps(
            {"verifier": python.module, "task_data": dict(python.task_data or {})}
        ).encode(),
    }
    for name, data in python.files.items():
        files[f"{base}/{name}"] = data
    if response is not None:
        files[f"{base}/response.json"] = json.dumps(response_object(response)).encode()
    return files


def response_object(text: str) -> dict[str, Any]:
    """The agent's final answer as an OpenAI Responses object (what `verify(response)`
    gets): `output_text` and one assistant message holding it."""
    return {
        "object": "response",
        "status": "completed",
        "output_text": text,
        "output": [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text}],
            }
        ],
    }


def contract_error(into: Path) -> str | None:
    """What the runner said kept it from calling verify() (from the copied folder
    `into`), or None."""
    path = into / CONTRACT_FILE
    try:
        text = path.read_bytes()[: _SHOWN * 4].decode("utf-8", "replace").strip()
    except OSError:
        return None
    return (text[:_SHOWN] or "the Python verifier could not be called") if path.is_file() else None
