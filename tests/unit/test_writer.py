"""Where result files go and what the writer puts there."""

from __future__ import annotations

import json
from pathlib import Path

from pytest_harbor.engine import EpisodeResult, TurnResult
from pytest_harbor.redaction import Redactor
from pytest_harbor.writers import ResultsLayout, RolloutsWriter


def test_layout_for_validation_and_agent_runs(tmp_path: Path) -> None:
    validation = ResultsLayout(tmp_path, validation=True)
    agent = ResultsLayout(tmp_path, validation=False)
    assert validation.rollouts_file("qs") == tmp_path / "harbor/validation/qs/rollouts.jsonl"
    assert agent.rollouts_file("qs") == tmp_path / "harbor/qs/rollouts.jsonl"
    assert (
        validation.verifier_dir("qs", "t__r0") == tmp_path / "harbor/validation/qs/verifier/t__r0"
    )
    assert agent.verifier_dir("qs", "t__r0", "02-b") == tmp_path / "harbor/qs/verifier/t__r0/02-b"


def test_writer_starts_fresh_at_its_first_row_then_appends(tmp_path: Path) -> None:
    layout = ResultsLayout(tmp_path, validation=True)
    layout.taskset_dir("qs").mkdir(parents=True)
    layout.rollouts_file("qs").write_text('{"old": true}\n')
    (layout.taskset_dir("qs") / "verifier" / "old__r0").mkdir(parents=True)
    writer = RolloutsWriter(layout, Redactor([]), run_id="r1")
    writer.plan("qs")
    # Planned, not begun: the earlier run is untouched.
    assert layout.rollouts_file("qs").read_text() == '{"old": true}\n'
    # A worker stages the episode's verifier folder while it runs.
    staged = layout.staged_verifier_dir("qs", "r1", "t__r1")
    staged.mkdir(parents=True)
    (staged / "test-stdout.txt").write_text("ok\n")
    result = EpisodeResult(
        task_id="t",
        taskset="qs",
        repeat=1,
        agent="oracle",
        reward=1.0,
        turns=[TurnResult(step="episode", reward=1.0, agent_log_tail="secret tail")],
    )
    writer.append_row(result)
    assert not (layout.taskset_dir("qs") / "verifier" / "old__r0").exists()
    assert (layout.verifier_dir("qs", "t__r1") / "test-stdout.txt").read_text() == "ok\n"
    (previous,) = (tmp_path / "harbor/validation/qs.previous").iterdir()
    assert (previous / "rollouts.jsonl").read_text() == '{"old": true}\n'
    assert (previous / "verifier" / "old__r0").is_dir()
    assert writer.set_aside["qs"].rows == 1
    rows = [json.loads(line) for line in layout.rollouts_file("qs").read_text().splitlines()]
    assert len(rows) == 1
    assert rows[0]["task_id"] == "t" and rows[0]["repeat"] == 1
    assert "agent_log_tail" not in rows[0]["turns"][0]


def test_only_the_controller_has_a_writer(tmp_path: Path) -> None:
    from pytest_harbor.plugin.options import HarborOptions
    from pytest_harbor.plugin.planned import PlannedRun
    from pytest_harbor.plugin.reporting import RunReport
    from pytest_harbor.plugin.run import HarborRun

    options = HarborOptions(
        datasets=(),
        agent="oracle",
        sandbox="docker",
        repeats=1,
        results_dir=tmp_path,
        pass_reward=1.0,
    )
    common = {"run_id": "r", "owner": "host:1", "targets": []}
    controller = HarborRun(options, is_worker=False, **common)  # type: ignore[arg-type]
    assert RunReport.of(controller, PlannedRun()).writer is not None
    assert getattr(HarborRun(options, is_worker=True, **common), "writer", None) is None  # type: ignore[arg-type]
