"""The failures file, the manifest, reading a run back for resume, and the run summary."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from pytest_harbor.engine import EpisodeResult, FailureKind, TurnResult
from pytest_harbor.redaction import Redactor
from pytest_harbor.run.metrics import score_taskset
from pytest_harbor.settings import HarborSettings
from pytest_harbor.writers import ResultsLayout, RolloutsWriter
from pytest_harbor.writers.failures import FailureRecord
from pytest_harbor.writers.manifest import ManifestError, RunManifest, dataset_digest
from pytest_harbor.writers.resume import read_resume_point
from pytest_harbor.writers.summary import EpisodeEntry, run_summary, write_run_summary


def _manifest(**changes: Any) -> RunManifest:
    values: dict[str, Any] = {
        "run_id": "r1",
        "started_at": "2026-01-01T00:00:00+00:00",
        "target": Path("/data/ts"),
        "taskset": "ts",
        "agent": "oracle",
        "sandbox": "docker",
        "repeats": 1,
        "settings": HarborSettings(),
        "task_digests": {"a": "sha256:aaaa", "b": "sha256:bbbb"},
    }
    values.update(changes)
    return RunManifest.describe(**values)


def _failure(task: str, kind: str, repeat: int = 0) -> FailureRecord:
    return FailureRecord.new(
        failure_kind=kind,
        failure_reason="why",
        stage="seed",
        task_id=task,
        taskset="ts",
        repeat=repeat,
        agent="oracle",
        run_id="r1",
    )


def _row(task: str, reward: float, repeat: int = 0) -> dict[str, Any]:
    result = EpisodeResult(
        task_id=task,
        taskset="ts",
        repeat=repeat,
        agent="oracle",
        reward=reward,
        turns=[TurnResult(step="episode", reward=reward)],
    )
    return result.row()


def test_terminal_failures_are_not_retried() -> None:
    assert not _failure("a", FailureKind.DIGEST_MISMATCH).retry
    assert not _failure("a", FailureKind.BUDGET_REFUSED).retry
    assert not _failure("a", FailureKind.TASK_REFUSED).retry
    for kind in (
        FailureKind.WORKER_DIED,
        FailureKind.EPISODE_TIMEOUT,
        FailureKind.SANDBOX_START_FAILED,
        FailureKind.INTERRUPTED,
    ):
        assert _failure("a", kind).retry


def test_a_failure_row_has_no_reward_and_no_response() -> None:
    data = _failure("a", FailureKind.WORKER_DIED).model_dump(mode="json")
    assert "reward" not in data and "response" not in data
    assert data["failure_kind"] == "harbor:worker_died"


def test_the_same_run_has_no_differences() -> None:
    assert _manifest().differences(_manifest(run_id="r2", started_at="later")) == []


def test_differences_name_what_changed() -> None:
    before = _manifest()
    after = _manifest(
        agent="nop",
        target=Path("/data/other/ts"),
        repeats=3,
        settings=HarborSettings(verifier_grace_s=5, secrets={"TOKEN": "new"}),
        task_digests={"a": "sha256:aaaa", "b": "sha256:cccc", "c": "sha256:dddd"},
    )
    assert before.differences(after) == [
        "target: '/data/ts' then, '/data/other/ts' now",
        "agent: 'oracle' then, 'nop' now",
        "repeats: 1 then, 3 now",
        "setting verifier_grace_s: 30.0 then, 5.0 now",
        "setting secrets: the names or values differ",
        "task folder b changed (digest sha256:bbbb then, sha256:cccc now)",
    ]


def test_scheduling_settings_may_change_on_resume() -> None:
    after = _manifest(settings=HarborSettings(max_concurrent_episodes=2, queue_timeout_seconds=60))
    assert _manifest().differences(after) == []


def test_secret_values_never_reach_the_manifest(tmp_path: Path) -> None:
    manifest = _manifest(settings=HarborSettings(secrets={"TOKEN": "hunter2"}))
    manifest.write(tmp_path / "m.json", Redactor([]))
    text = (tmp_path / "m.json").read_text()
    assert "hunter2" not in text
    assert json.loads(text)["settings"]["secrets"] == {"TOKEN": "***"}


def test_dataset_digest_does_not_depend_on_order() -> None:
    assert dataset_digest({"a": "1", "b": "2"}) == dataset_digest({"b": "2", "a": "1"})
    assert dataset_digest({"a": "1", "b": "2"}) != dataset_digest({"a": "1", "b": "3"})


def _write_lines(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))


def test_resume_keeps_rows_and_terminal_failures_each_episode_once(tmp_path: Path) -> None:
    layout = ResultsLayout(tmp_path, validation=True, runs={"ts": "run"})
    rows = [_row("a", 1.0), _row("b", 0.0), _row("a", 1.0)]  # a second row of a: dropped
    _write_lines(
        layout.rollouts_file("ts"), [json.dumps(row) for row in rows] + ['{"task_id": "c", "re']
    )
    failures = [
        _failure("c", FailureKind.WORKER_DIED),  # retried
        _failure("d", FailureKind.DIGEST_MISMATCH),  # kept
        _failure("b", FailureKind.EPISODE_TIMEOUT),  # b has a row: dropped
    ]
    _write_lines(layout.failures_file("ts"), [f.model_dump_json() for f in failures] + ["not json"])
    _manifest().write(layout.manifest_file("ts"), Redactor([]))
    point = read_resume_point(
        "ts",
        rollouts=layout.rollouts_file("ts"),
        failures=layout.failures_file("ts"),
        manifest=layout.manifest_file("ts"),
    )
    assert point.manifest == _manifest()
    assert sorted(point.rows) == [("a", 0), ("b", 0)]  # a reward of 0 is kept too
    assert [f.task_id for f in point.kept_failures] == ["d"]
    assert [f.task_id for f in point.retried] == ["c"]
    assert point.finished == {("a", 0), ("b", 0), ("d", 0)}
    assert point.dropped_lines == 4

    writer = RolloutsWriter(layout, Redactor([]))
    writer.plan("ts", resume=point)
    writer.begin("ts")
    kept_rows = [json.loads(line) for line in layout.rollouts_file("ts").read_text().splitlines()]
    assert [(row["task_id"], row["reward"]) for row in kept_rows] == [("a", 1.0), ("b", 0.0)]
    kept_failures = layout.failures_file("ts").read_text().splitlines()
    assert [json.loads(line)["task_id"] for line in kept_failures] == ["d"]


def test_an_unreadable_manifest_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "rollouts_manifest.json"
    path.write_text('{"run_id": 3}')
    with pytest.raises(ManifestError, match=r"rollouts_manifest\.json: not a run manifest"):
        read_resume_point("ts", rollouts=tmp_path / "r", failures=tmp_path / "f", manifest=path)


def test_a_fresh_run_begins_empty_files_in_its_own_folder(tmp_path: Path) -> None:
    earlier = ResultsLayout(tmp_path, validation=False, runs={"ts": "earlier"})
    for path in (earlier.rollouts_file("ts"), earlier.failures_file("ts")):
        _write_lines(path, ['{"old": 1}'])
    earlier.summary_file("ts").write_text("{}")
    layout = ResultsLayout(tmp_path, validation=False, runs={"ts": "now"})
    writer = RolloutsWriter(layout, Redactor([]))
    writer.plan("ts")
    # Not begun: an interruption alone writes nothing.
    assert not writer.append_failure(_failure("y", FailureKind.INTERRUPTED), begins=False)
    writer.begin("ts")
    assert layout.rollouts_file("ts").read_text() == ""
    assert layout.failures_file("ts").read_text() == ""
    assert not layout.summary_file("ts").exists()
    writer.append_failure(_failure("x", FailureKind.WORKER_DIED))
    (line,) = layout.failures_file("ts").read_text().splitlines()
    assert json.loads(line)["task_id"] == "x"
    # The earlier run's files are as they were.
    assert earlier.rollouts_file("ts").read_text() == '{"old": 1}\n'
    assert earlier.summary_file("ts").read_text() == "{}"


def test_summary_paths_resolve_after_the_results_folder_moves(tmp_path: Path) -> None:
    layout = ResultsLayout(tmp_path / "results", validation=True, runs={"ts": "run"})
    writer = RolloutsWriter(layout, Redactor([]))
    writer.begin("ts")
    # As a worker leaves them: the verifier's files in the episode's folder.
    folder = layout.verifier_dir("ts", "a__r0")
    folder.mkdir(parents=True)
    (folder / "test-stdout.txt").write_bytes(b"ok\n")
    (folder / "reward.txt").write_bytes(b"1\n")
    result = EpisodeResult.model_validate(
        {
            **_row("a", 1.0),
            "turns": [
                {
                    "step": "episode",
                    "reward": 1.0,
                    "verifier_logs_dir": str(layout.verifier_dir("ts", "a__r0")),
                }
            ],
        }
    )
    writer.append_row(result)
    failure = _failure("b", FailureKind.WORKER_DIED)
    writer.append_failure(failure)
    manifest = _manifest(target=tmp_path / "data" / "ts")
    manifest.write(layout.manifest_file("ts"), Redactor([]))
    entries = [
        EpisodeEntry("a", 0, "sha256:aaaa", "passed", result=result),
        EpisodeEntry("b", 0, "sha256:bbbb", "no_result", failure=failure),
    ]
    summary = run_summary(
        layout,
        manifest,
        finished_at="now",
        interrupted=False,
        episodes=entries,
        score=score_taskset(
            [("a", "passed", result, None), ("b", "no_result", None, failure.failure_kind)],
            repeats=1,
        ),
    )
    write_run_summary(layout, "ts", summary, Redactor([]))

    shutil.move(tmp_path / "results", tmp_path / "moved")
    folder = tmp_path / "moved" / "harbor" / "validation" / "ts" / "latest"
    data = json.loads((folder / "rollouts_run_summary.json").read_text())
    paths = [*data["files"].values(), *data["all_files"]]
    for episode in data["episodes"]:
        for logs in episode.get("logs", []):
            paths += [value for key, value in logs.items() if key != "step"]
    assert "verifier/a__r0/test-stdout.txt" in paths
    for path in paths:
        assert not os.path.isabs(path)
        assert (folder / path).exists(), path
    assert not os.path.isabs(data["target"])
    assert data["counts"]["passed"] == 1 and data["counts"]["no_result"] == 1
    assert data["failure_kinds"] == {"harbor:worker_died": 1}
    (second,) = (e for e in data["episodes"] if e["task_id"] == "b")
    assert (second["status"], second["reward"], second["retry"]) == ("no_result", None, True)
