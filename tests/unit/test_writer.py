"""Where result files go and what the writer puts there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_harbor.engine import EpisodeResult, TurnResult
from pytest_harbor.redaction import Redactor
from pytest_harbor.writers import ResultsLayout, RolloutsWriter
from pytest_harbor.writers.runs import latest_run


def test_layout_for_validation_and_agent_runs(tmp_path: Path) -> None:
    validation = ResultsLayout(tmp_path, validation=True, runs={"qs": "20261207T100000-oracle"})
    agent = ResultsLayout(tmp_path, validation=False, runs={"qs": "r"})
    run = tmp_path / "harbor/validation/qs/runs/20261207T100000-oracle"
    assert validation.rollouts_file("qs") == run / "rollouts.jsonl"
    assert agent.rollouts_file("qs") == tmp_path / "harbor/qs/runs/r/rollouts.jsonl"
    assert validation.verifier_dir("qs", "t__r0") == run / "verifier/t__r0"
    assert (
        agent.verifier_dir("qs", "t__r0", "02-b")
        == tmp_path / "harbor/qs/runs/r/verifier/t__r0/02-b"
    )
    # Kept apart (artifacts_dir): split by run as well.
    apart = ResultsLayout(tmp_path, validation=True, verifier_root=tmp_path / "v", runs={"qs": "r"})
    assert apart.verifier_dir("qs", "t__r0") == tmp_path / "v/validation/qs/runs/r/t__r0"
    # What a taskset's runs share stays above them.
    assert validation.incoming_dir("qs", "id") == tmp_path / "harbor/validation/qs/.incoming/id"
    with pytest.raises(LookupError, match="no run folder"):
        ResultsLayout(tmp_path, validation=True).taskset_dir("qs")


def test_a_fresh_run_writes_a_folder_of_its_own_and_latest_follows_its_first_row(
    tmp_path: Path,
) -> None:
    earlier = ResultsLayout(tmp_path, validation=True, runs={"qs": "old"})
    earlier.taskset_dir("qs").mkdir(parents=True)
    earlier.rollouts_file("qs").write_text('{"old": true}\n')
    (earlier.taskset_dir("qs") / "verifier" / "old__r0").mkdir(parents=True)
    earlier.point_latest("qs")
    layout = ResultsLayout(tmp_path, validation=True, runs={"qs": "new"})
    writer = RolloutsWriter(layout, Redactor([]), run_id="r1")
    writer.plan("qs")
    writer.begin("qs")
    assert layout.rollouts_file("qs").read_text() == ""
    # Begun, nothing written yet: latest still names the earlier run.
    assert latest_run(layout.root_dir("qs")) == earlier.taskset_dir("qs")
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
    assert latest_run(layout.root_dir("qs")) == layout.taskset_dir("qs")
    assert (layout.verifier_dir("qs", "t__r1") / "test-stdout.txt").read_text() == "ok\n"
    # The earlier run is untouched.
    assert earlier.rollouts_file("qs").read_text() == '{"old": true}\n'
    assert (earlier.taskset_dir("qs") / "verifier" / "old__r0").is_dir()
    rows = [json.loads(line) for line in layout.rollouts_file("qs").read_text().splitlines()]
    assert len(rows) == 1
    assert rows[0]["task_id"] == "t" and rows[0]["repeat"] == 1
    assert "agent_log_tail" not in rows[0]["turns"][0]
    writer.finish("qs")
    assert layout.taskset_dir("qs").is_dir()


def test_a_fresh_run_that_wrote_nothing_leaves_no_folder(tmp_path: Path) -> None:
    layout = ResultsLayout(tmp_path, validation=False, runs={"qs": "new"})
    writer = RolloutsWriter(layout, Redactor([]), run_id="r1")
    writer.plan("qs")
    writer.begin("qs")
    assert layout.taskset_dir("qs").is_dir()
    writer.finish("qs", ran=False)
    assert not layout.taskset_dir("qs").exists()
    assert not writer.begun("qs")
    assert latest_run(layout.root_dir("qs")) is None


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
