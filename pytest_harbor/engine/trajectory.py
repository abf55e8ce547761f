"""The transcript a verifier may read: ATIF v1.7 in /logs/agent/trajectory.json."""

from __future__ import annotations

import json

from pytest_harbor.harnesses.base import AgentRun
from pytest_harbor.tasks import Turn

__all__ = ["ATIF_VERSION", "trajectory"]

ATIF_VERSION = "ATIF-v1.7"


def trajectory(session_id: str, agent_name: str, turn: Turn, run: AgentRun) -> bytes:
    """The turn as a two-step ATIF transcript: the instruction the harness was given, and
    what it answered (a harness with no answer, such as the oracle, says what it ran)."""
    if run.response is not None:
        answer = run.response
    elif run.exit_code is None and not run.timed_out:
        answer = "(no answer)"
    else:
        ending = "timed out" if run.timed_out else f"exited {run.exit_code}"
        answer = f"ran the reference solution; it {ending}"
    document = {
        "schema_version": ATIF_VERSION,
        "session_id": session_id,
        "agent": {"name": agent_name, "version": "1.0.0"},
        "steps": [
            {"step_id": 1, "source": "user", "message": turn.instruction},
            {"step_id": 2, "source": "agent", "message": answer},
        ],
    }
    return (json.dumps(document, indent=2) + "\n").encode()
