"""Run folders: their names, `latest`, and moving the earlier layout's runs into `runs/`
(synthetic folders; tests/integration/test_results_kept.py makes them from real runs)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pytest_harbor.writers.runs import (
    LATEST,
    latest_run,
    migrate,
    point_latest,
    run_folder_name,
    runs_of,
    unused_name,
)


def test_a_run_is_named_by_its_start_agent_and_model() -> None:
    started = "2026-12-07T22:30:05.123+00:00"
    assert run_folder_name(started, "oracle", None) == "20261207T223005-oracle"
    assert (
        run_folder_name(started, "shell-agent", "openai/gpt-4o mini")
        == "20261207T223005-shell-agent-openai_gpt-4o_mini"
    )
    # Nothing of a name can climb out of runs/ or hide as a dot file.
    name = run_folder_name(started, "../../etc", "..")
    assert "/" not in name and not name.startswith(".") and ".." not in name.split("-")


def test_a_name_taken_gets_a_number(tmp_path: Path) -> None:
    (tmp_path / "runs" / "r").mkdir(parents=True)
    (tmp_path / "runs" / "r-2").mkdir()
    assert unused_name(tmp_path, "r") == "r-3"
    assert unused_name(tmp_path, "s") == "s"


def test_latest_is_a_relative_link_replaced_whole(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / "runs" / name).mkdir(parents=True)
    point_latest(tmp_path, "a")
    point_latest(tmp_path, "b")
    assert os.readlink(tmp_path / LATEST) == "runs/b"
    assert latest_run(tmp_path) == (tmp_path / "runs" / "b").resolve()
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".")] == []


def test_latest_never_names_a_folder_outside_runs(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "ts").mkdir()
    (tmp_path / "ts" / LATEST).symlink_to(elsewhere)
    assert latest_run(tmp_path / "ts") is None


def test_a_folder_a_user_made_as_latest_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "runs" / "a").mkdir(parents=True)
    (tmp_path / LATEST).mkdir()
    (tmp_path / LATEST / "mine.txt").write_text("keep")
    point_latest(tmp_path, "a")
    assert (tmp_path / LATEST / "mine.txt").read_text() == "keep"


def _old_run(folder: Path, started: str, agent: str, rows_in: Path) -> None:
    """A run as the earlier layout left it: its files, a row naming its verifier folder
    where the run wrote it (`rows_in`)."""
    (folder / "verifier" / "t__r0").mkdir(parents=True)
    (folder / "verifier" / "t__r0" / "reward.txt").write_text("1\n")
    (folder / "rollouts_manifest.json").write_text(
        json.dumps({"started_at": started, "agent": agent, "model": None})
    )
    row = {"task_id": "t", "verifier_logs_dir": str(rows_in / "verifier" / "t__r0")}
    row["turns"] = [{"verifier_logs_dir": row["verifier_logs_dir"], "response": str(rows_in)}]
    (folder / "rollouts.jsonl").write_text(json.dumps(row) + "\nnot json\n")


def test_the_earlier_layout_moves_into_runs_without_losing_a_file(tmp_path: Path) -> None:
    root = tmp_path / "harbor" / "ts"
    _old_run(root, "2026-12-02T10:00:00+00:00", "oracle", root)
    (root / "durations.json").write_text("{}")
    (root / ".secrets_key").write_text("k\n")
    previous = root.parent / "ts.previous" / "20261201T090000"
    _old_run(previous, "2026-12-01T09:00:00+00:00", "nop", root)
    moved = migrate(root)
    assert [(found.came_from, found.now_in.name) for found in moved] == [
        (previous, "20261201T090000-nop"),
        (root, "20261202T100000-oracle"),
    ]
    assert not previous.parent.exists()
    assert sorted(path.name for path in root.iterdir()) == [
        ".secrets_key",
        "durations.json",
        "latest",
        "runs",
    ]
    assert latest_run(root) == (root / "runs" / "20261202T100000-oracle").resolve()
    assert [run.name for run in runs_of(root)] == ["20261202T100000-oracle", "20261201T090000-nop"]
    for run in runs_of(root):
        lines = (run / "rollouts.jsonl").read_text().splitlines()
        row = json.loads(lines[0])
        # Each row's folders now name its run's; other text is as it was.
        assert row["verifier_logs_dir"] == str(run / "verifier" / "t__r0")
        assert row["turns"][0]["verifier_logs_dir"] == row["verifier_logs_dir"]
        assert row["turns"][0]["response"] == str(root)
        assert (Path(row["verifier_logs_dir"]) / "reward.txt").read_text() == "1\n"
        assert lines[1] == "not json"
    # A second look finds nothing more to move.
    assert migrate(root) == []


def test_verifier_folders_kept_apart_move_with_their_runs(tmp_path: Path) -> None:
    root, apart = tmp_path / "results" / "ts", tmp_path / "logs" / "ts"
    (root / "rollouts_manifest.json").parent.mkdir(parents=True)
    (root / "rollouts_manifest.json").write_text(
        json.dumps({"started_at": "2026-12-02T10:00:00Z", "agent": "oracle"})
    )
    (apart / "t__r0").mkdir(parents=True)
    (apart / "t__r0" / "reward.txt").write_text("1\n")
    row = {"task_id": "t", "verifier_logs_dir": str(apart / "t__r0")}
    (root / "rollouts.jsonl").write_text(json.dumps(row) + "\n")
    (found,) = migrate(root, apart)
    kept = apart / "runs" / found.now_in.name / "t__r0"
    assert (kept / "reward.txt").read_text() == "1\n"
    (moved_row,) = [json.loads(line) for line in (found.now_in / "rollouts.jsonl").open()]
    assert moved_row["verifier_logs_dir"] == str(kept)


@pytest.mark.parametrize("manifest", ["", "[1]", "{broken"])
def test_a_run_without_a_readable_manifest_is_named_by_its_files(
    tmp_path: Path, manifest: str
) -> None:
    root = tmp_path / "ts"
    root.mkdir()
    (root / "rollouts.jsonl").write_text("")
    if manifest:
        (root / "rollouts_manifest.json").write_text(manifest)
    (found,) = migrate(root)
    assert found.now_in.name.endswith("-unknown")
    assert (found.now_in / "rollouts.jsonl").is_file()
