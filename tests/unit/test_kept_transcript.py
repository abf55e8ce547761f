"""The transcript a verifier was given, kept with the harness's files: never written
through a link a harness (or an agent through it) left under its name."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_harbor.engine.verification import TRAJECTORY_FILE, keep_transcript


def _verification(agent: Path, verifier: Path) -> object:
    return SimpleNamespace(agent_into=agent, into=verifier)


@pytest.mark.parametrize("target_exists", [True, False])
def test_a_link_under_the_transcripts_name_is_replaced_not_written_through(
    tmp_path: Path, target_exists: bool
) -> None:
    agent, verifier, outside = tmp_path / "agent", tmp_path / "verifier", tmp_path / "host.txt"
    agent.mkdir()
    if target_exists:
        outside.write_text("the host's own file\n")
    (agent / TRAJECTORY_FILE).symlink_to(outside)
    keep_transcript(_verification(agent, verifier), b'{"steps": []}')  # type: ignore[arg-type]
    assert not (agent / TRAJECTORY_FILE).is_symlink()
    assert (agent / TRAJECTORY_FILE).read_bytes() == b'{"steps": []}'
    assert (verifier / TRAJECTORY_FILE).read_bytes() == b'{"steps": []}'
    if target_exists:
        assert outside.read_text() == "the host's own file\n"
    else:
        assert not outside.exists()


def test_a_transcript_the_harness_kept_itself_stays(tmp_path: Path) -> None:
    agent, verifier = tmp_path / "agent", tmp_path / "verifier"
    agent.mkdir()
    (agent / TRAJECTORY_FILE).write_text("the harness's own")
    keep_transcript(_verification(agent, verifier), b"engine's")  # type: ignore[arg-type]
    assert (agent / TRAJECTORY_FILE).read_text() == "the harness's own"
    assert (verifier / TRAJECTORY_FILE).read_bytes() == b"engine's"
