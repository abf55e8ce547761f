"""The transcript a verifier reads in /logs/agent/trajectory.json (ATIF v1.7): the
harness's own trajectory, or for a harness that gives none, two steps written here."""

from __future__ import annotations

from pytest_harbor import strict_json
from pytest_harbor.harnesses.base import ATIF_VERSION, AgentRun
from pytest_harbor.tasks import Turn

__all__ = ["transcript"]


def transcript(session_id: str, agent_name: str, turn: Turn, run: AgentRun) -> bytes:
    """The harness's trajectory; else the instruction the harness was given and what it
    answered (a harness with no answer, such as the oracle, says what it ran)."""
    if run.trajectory is not None:
        return run.trajectory.to_bytes()
    if run.response is not None:
        answer = run.response
    elif run.exit_code is None and not run.timed_out:
        answer = "(no answer)"
    else:
        ending = "timed out" if run.timed_out else f"exited {run.exit_code}"
        answer = f"ran the reference solution; it {ending}"
    # Written as the Trajectory model would write it (a test holds the two together),
    # without loading the model: most episodes' harnesses give no trajectory of their own.
    document = {
        "schema_version": ATIF_VERSION,
        "session_id": session_id,
        "agent": {"name": agent_name, "version": "1.0.0"},
        "steps": [
            {"step_id": 1, "source": "user", "message": turn.instruction},
            {"step_id": 2, "source": "agent", "message": answer},
        ],
    }
    return (strict_json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode()
