"""The one reader of rollouts.jsonl and rollouts_failures.jsonl, and what each of its
readers does with a line that is not a row: resume counts it as dropped, the report
counts it in a note, the durations pass it by."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_harbor.plugin.recording import ResultRecorder
from pytest_harbor.report import load_taskset
from pytest_harbor.run.durations import read_history
from pytest_harbor.writers.resume import read_resume_point
from pytest_harbor.writers.rollouts import ResultsLayout
from pytest_harbor.writers.rows import RowLine, read_rows
from tests.unit.hostile import deep
from tests.unit.test_report import row, write_results

ROW = '{"task_id": "a", "repeat": 0}'


def _write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, str):
        text = text.encode()
    path.write_bytes(text)
    return path


def test_rows_are_read_in_order_with_their_line_numbers(tmp_path: Path) -> None:
    path = _write(tmp_path / "rows.jsonl", f"{ROW}\n\n   \n{ROW.replace('0', '1')}\n")
    assert read_rows(path) == [
        RowLine(1, {"task_id": "a", "repeat": 0}),
        RowLine(4, {"task_id": "a", "repeat": 1}),
    ]


def test_an_empty_file_has_no_lines(tmp_path: Path) -> None:
    assert read_rows(_write(tmp_path / "rows.jsonl", "")) == []


def test_a_file_that_is_not_there_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_rows(tmp_path / "rows.jsonl")


def test_a_torn_last_line_is_not_a_row(tmp_path: Path) -> None:
    path = _write(tmp_path / "rows.jsonl", f'{ROW}\n{{"task_id": "b", "re')
    first, torn = read_rows(path)
    assert first.row == {"task_id": "a", "repeat": 0} and not first.torn
    assert torn.number == 2 and torn.row is None and torn.torn
    assert torn.error is not None and "not valid JSON" in torn.error


def test_a_whole_last_line_without_its_line_break_is_a_row(tmp_path: Path) -> None:
    (line,) = read_rows(_write(tmp_path / "rows.jsonl", ROW))
    assert line.row == {"task_id": "a", "repeat": 0} and not line.torn


def test_lines_that_are_not_json_objects_say_why(tmp_path: Path) -> None:
    path = _write(tmp_path / "rows.jsonl", f"not json\n[1, 2]\n{ROW}\n")
    text, array, whole = read_rows(path)
    assert (text.row, text.torn) == (None, False) and "not valid JSON" in str(text.error)
    assert (array.row, array.error) == (None, "not a JSON object")
    assert whole.row is not None


def test_a_hostile_deep_line_is_refused_without_raising(tmp_path: Path) -> None:
    path = _write(tmp_path / "rows.jsonl", f"{deep(100_000)}\n{ROW}\n")
    hostile, whole = read_rows(path)
    assert hostile.row is None and "deeper than" in str(hostile.error)
    assert whole.row == {"task_id": "a", "repeat": 0}


def test_bytes_that_are_not_utf8_and_other_line_breaks_are_read(tmp_path: Path) -> None:
    path = _write(tmp_path / "rows.jsonl", b'{"task_id": "\xff"}\r\n' + ROW.encode() + b"\r")
    first, second = read_rows(path)
    assert first.row == {"task_id": "\ufffd"} and second.row is not None and not second.torn


def test_nan_reads_as_a_float_or_as_null(tmp_path: Path) -> None:
    path = _write(tmp_path / "rows.jsonl", '{"task_id": "a", "reward": NaN}\n')
    (as_float,) = read_rows(path)
    assert as_float.row is not None and math.isnan(as_float.row["reward"])
    (as_null,) = read_rows(path, constants="null")
    assert as_null.row == {"task_id": "a", "reward": None}


# ---------------------------------------------------------------------------- policies


def _episode_row(task: str, repeat: int, *, agent_s: float = 2.0) -> str:
    return json.dumps(
        {
            "task_id": task,
            "taskset": "ts",
            "repeat": repeat,
            "agent": "oracle",
            "reward": 1.0,
            "turns": [{"step": "episode", "reward": 1.0}],
            "timings": {"seed_s": 1.0, "agent_s": agent_s, "verify_s": 1.0},
        }
    )


def test_resume_counts_every_line_that_is_not_a_row_as_dropped(tmp_path: Path) -> None:
    layout = ResultsLayout(tmp_path, validation=False, runs={"ts": "run"})
    lines = [_episode_row("a", 0), "", "[1]", deep(5_000), _episode_row("a", 0)]
    _write(layout.rollouts_file("ts"), "\n".join(lines) + '\n{"task_id": "b", "re')
    _write(layout.failures_file("ts"), "not json\n")
    point = read_resume_point(
        "ts",
        rollouts=layout.rollouts_file("ts"),
        failures=layout.failures_file("ts"),
        manifest=layout.manifest_file("ts"),
    )
    assert list(point.rows) == [("a", 0)]
    # The array, the deep line, the second row of a, the torn line; the failures' line.
    assert point.dropped_lines == 5


def test_the_report_counts_lines_that_are_not_rows_in_a_note(tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    summary = write_results(folder, [row("hello", 0, folder=folder)])
    rows = folder / "rollouts.jsonl"
    with rows.open("a") as handle:
        handle.write('\n{"repeat": 1}\nnot json\n' + deep(5_000) + '\n{"task_id": "x", "re')
    results = load_taskset(summary)
    assert [row["task_id"] for row in results.rows] == ["hello"]
    assert "rollouts.jsonl: 4 line(s) that are not rows were left out" in results.notes


def test_the_durations_take_every_row_of_the_file_and_pass_other_lines_by(
    tmp_path: Path,
) -> None:
    layout = ResultsLayout(tmp_path, validation=False, runs={"ts": "run"})
    # A resumed run's file: the earlier run's row of `a` counts with this run's.
    lines = [_episode_row("a", 0, agent_s=2.0), "not json", _episode_row("a", 1, agent_s=6.0)]
    _write(layout.rollouts_file("ts"), "\n".join(lines) + '\n{"task_id": "a", "re')
    recorder = ResultRecorder.__new__(ResultRecorder)
    recorder.run = SimpleNamespace(layout=layout)  # type: ignore[assignment]
    recorder._record_durations("ts")
    assert read_history(layout.root_dir("ts")) == {"a": {"episode_s": 6.0}}


def test_the_durations_of_a_taskset_without_rows_file_are_left_alone(tmp_path: Path) -> None:
    layout = ResultsLayout(tmp_path, validation=False, runs={"ts": "run"})
    recorder = ResultRecorder.__new__(ResultRecorder)
    recorder.run = SimpleNamespace(layout=layout)  # type: ignore[assignment]
    recorder._record_durations("ts")
    assert not layout.root_dir("ts").exists()
