"""Hostile inputs against the run folders, their migration, the comparison of two runs,
the live terminal block and the endpoint errors shown as they happen. Each test is an attack
the product refuses."""

from __future__ import annotations

import json
import logging
import unicodedata
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from pytest_harbor.agent_outcomes import ENDPOINT_ERROR, EndpointError
from pytest_harbor.engine.relay_errors import RelayErrorWatch
from pytest_harbor.harnesses import chat
from pytest_harbor.harnesses.model import endpoint_words
from pytest_harbor.plugin.endpoint_errors import EndpointErrors
from pytest_harbor.plugin.phases import PhaseBoard
from pytest_harbor.plugin.progress import RunningEpisode, RunProgress
from pytest_harbor.redaction import Redactor
from pytest_harbor.relay import GrantReport
from pytest_harbor.relay.usage import error_words
from pytest_harbor.report.compare import compare_runs
from pytest_harbor.report.compare_table import comparison_table
from pytest_harbor.writers.runs import LATEST, RUNS, migrate, run_folder_name
from tests.unit.test_compare_report import Ep, write_run

FORGED = "harbor: 40/40 done, 0 running, 0 waiting"


# ---------------------------------------------------------------- endpoint errors, live


class _Writer:
    width_of_current_line = 0
    _file = None


class _Reporter:
    """pytest's terminal reporter as EndpointErrors uses it: every line written kept."""

    def __init__(self) -> None:
        self._tw = _Writer()
        self.currentfspath = None
        self.lines: list[str] = []
        self.stats: dict[str, list[Any]] = {}

    def write(self, text: str, **_: object) -> None:
        self.lines.append(text)

    def write_line(self, text: str, **_: object) -> None:
        self.lines.append(text)


def _config(reporter: _Reporter) -> Any:
    plugins = {"terminalreporter": reporter, "capturemanager": None}
    return SimpleNamespace(pluginmanager=SimpleNamespace(get_plugin=plugins.get))


class _Books:
    def __init__(self, errors: list[tuple[int | None, str]]) -> None:
        self.errors = errors

    def report(self, token: str) -> GrantReport:
        return GrantReport(errors=tuple(self.errors))


def _relayed(body: bytes, caplog: pytest.LogCaptureFixture) -> EndpointError:
    """What the relay books for a failed answer with `body`, as the watch tells it."""
    watch = RelayErrorWatch(_Books([(500, error_words(body))]), "tok", "a__r0")  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="pytest_harbor"):
        watch.poll()
    (record,) = [r for r in caplog.records if hasattr(r, ENDPOINT_ERROR)]
    return getattr(record, ENDPOINT_ERROR)


def test_a_relayed_endpoint_error_cannot_forge_a_terminal_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    error = _relayed(f"overloaded\n{FORGED}".encode(), caplog)
    reporter = _Reporter()
    errors = EndpointErrors(_config(reporter), Redactor(["sk-secret"]).shown)
    errors.show(error)
    written = "".join(line + "\n" for line in reporter.lines)
    assert not any(line.startswith(FORGED) for line in written.splitlines())


def test_the_closing_counts_of_endpoint_errors_stay_one_line_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    error = _relayed(f"overloaded\n{FORGED}".encode(), caplog)
    reporter = _Reporter()
    errors = EndpointErrors(_config(reporter), Redactor().shown)
    errors.show(error)
    reporter.lines.clear()
    errors.pytest_terminal_summary(reporter)  # type: ignore[arg-type]
    assert all("\n" not in line for line in reporter.lines)


def test_a_harness_requests_endpoint_error_cannot_forge_a_terminal_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = object.__new__(chat.ChatClient)
    client.redactor = Redactor(["sk-secret"])
    answer = httpx.Response(500, json={"error": {"message": f"overloaded\n{FORGED}"}})
    with pytest.raises(chat._Retryable) as raised:
        client._read(answer, chat.UsageMeter())
    with caplog.at_level(logging.WARNING, logger="pytest_harbor"):
        chat._tell(raised.value, 1, 3, 1.0)
    (record,) = [r for r in caplog.records if hasattr(r, ENDPOINT_ERROR)]
    reporter = _Reporter()
    errors = EndpointErrors(_config(reporter), Redactor(["sk-secret"]).shown)
    errors.show(getattr(record, ENDPOINT_ERROR))
    written = "".join(line + "\n" for line in reporter.lines)
    assert not any(line.startswith(FORGED) for line in written.splitlines())


def test_a_relayed_endpoint_error_cannot_send_escapes_or_the_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Held: escape sequences, carriage returns, bidi overrides and the key are masked."""
    error = _relayed(b"\x1b]0;pwned\x07\r\x1b[2Jover\xe2\x80\xaeloaded sk-secret", caplog)
    reporter = _Reporter()
    errors = EndpointErrors(_config(reporter), Redactor(["sk-secret"]).shown)
    errors.show(error)
    errors.pytest_terminal_summary(reporter)  # type: ignore[arg-type]
    written = "".join(reporter.lines)
    assert "\x1b" not in written and "\r" not in written and "\u202e" not in written
    assert "sk-secret" not in written


def test_the_preflight_endpoint_words_are_one_line() -> None:
    """Held: the pre-flight request's words escape line breaks (the relay's do not)."""
    model = SimpleNamespace(secret_values=lambda: ["sk-secret"])
    words = endpoint_words(f"sk-secret\n{FORGED}\r\x1b[2J", model)  # type: ignore[arg-type]
    assert "\n" not in words and "\r" not in words and "\x1b" not in words
    assert "sk-secret" not in words


# ---------------------------------------------------------------- the live block


def test_a_task_named_in_wide_characters_stays_within_the_live_blocks_width() -> None:
    wide = "\u4efb\u52a1" * 30  # 60 characters, 120 columns
    progress = RunProgress(
        done=0,
        total=1,
        failed=0,
        running=(RunningEpisode(trial=f"{wide}__r0", phase="agent", step=None, age_s=5.0),),
        waiting=0,
    )
    width = 79
    for line in progress.block(width, 10):
        columns = sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in line)
        assert columns <= width


def test_a_phase_file_of_another_trial_is_not_read_as_this_ones(tmp_path: Path) -> None:
    """Held: a phase report names its trial; one copied over another trial's is ignored."""
    board = PhaseBoard(tmp_path)
    board.post("tasks/a::r0::episode", "agent", "s\x1b[2J")
    board.post("tasks/b::r0::episode", "verifying", None)
    board._file("tasks/b::r0::episode").write_bytes(
        board._file("tasks/a::r0::episode").read_bytes()
    )
    assert board.read("tasks/b::r0::episode") is None
    (tmp_path / "junk").mkdir()
    board._file("tasks/c::r0::episode").write_text('{"trial": 1}')
    assert board.read("tasks/c::r0::episode") is None


# ---------------------------------------------------------------- comparing two runs


def test_a_changed_tasks_name_cannot_forge_a_line_of_the_comparison(tmp_path: Path) -> None:
    name = "t\nNEW: /elsewhere · taskset demo · agent oracle"
    old = write_run(tmp_path / "old", [Ep(name, "passed", 1.0, digest="sha256:1")])
    new = write_run(tmp_path / "new", [Ep(name, "passed", 1.0, digest="sha256:2")])
    text = comparison_table(compare_runs(old, new), show_all=True)
    assert sum(line.startswith("NEW:") for line in text.splitlines()) == 1


def test_two_tasks_never_show_under_one_name_in_the_comparison(tmp_path: Path) -> None:
    stem = "a-long-task-name-shared-by-two-tasks-of-the-set-"
    old = write_run(
        tmp_path / "old", [Ep(stem + "easy", "passed", 1.0), Ep(stem + "hard", "failed", 0.0)]
    )
    new = write_run(
        tmp_path / "new", [Ep(stem + "easy", "failed", 0.0), Ep(stem + "hard", "passed", 1.0)]
    )
    text = comparison_table(compare_runs(old, new))
    rows = [line.split()[0] for line in text.splitlines() if line.startswith(stem[:20])]
    assert len(rows) == 2
    assert rows[0] != rows[1]


def test_a_task_name_with_a_comma_reads_as_one_changed_task(tmp_path: Path) -> None:
    name = "fast, slow"
    old = write_run(tmp_path / "old", [Ep(name, "passed", 1.0, digest="sha256:1")])
    new = write_run(tmp_path / "new", [Ep(name, "passed", 1.0, digest="sha256:2")])
    text = comparison_table(compare_runs(old, new), show_all=True)
    (header,) = [line for line in text.splitlines() if "task(s) changed" in line]
    named = header.split(": ", 1)[1]
    # Quoted, as every name that is not plain: one task, not `fast` and `slow`.
    assert named == "'fast, slow'"


def test_a_hostile_task_name_is_one_line_in_the_tables_rows(tmp_path: Path) -> None:
    """Held: the grid's cells and the failure kinds are one line each."""
    name = "t\nNEW: forged\r\x1b[2J\u202e"
    old = write_run(tmp_path / "old", [Ep(name, "passed", 1.0)])
    new = write_run(tmp_path / "new", [Ep(name, "failed", 0.0, kind="k\nNEW: forged")])
    text = comparison_table(compare_runs(old, new), show_all=True)
    assert sum(line.startswith("NEW:") for line in text.splitlines()) == 1
    assert "\x1b" not in text and "\r" not in text and "\u202e" not in text


# ---------------------------------------------------------------- the earlier layout


def _new_layout_taskset(root: Path, run: str) -> Path:
    folder = root / RUNS / run
    folder.mkdir(parents=True)
    (folder / "rollouts.jsonl").write_text(
        json.dumps({"task_id": "t", "repeat": 0, "trial_dir": str(folder / "verifier")}) + "\n"
    )
    (folder / "rollouts_manifest.json").write_text(json.dumps({"started_at": "2026-12-01"}))
    (root / LATEST).symlink_to(f"{RUNS}/{run}")
    (root / "durations.json").write_text("{}")
    return folder


def test_a_taskset_named_like_the_earlier_layouts_folder_keeps_its_runs(tmp_path: Path) -> None:
    harbor = tmp_path / "results" / "harbor"
    theirs = _new_layout_taskset(harbor / "demo.previous", "20261201T000000-oracle")
    migrate(harbor / "demo")
    assert theirs.is_dir()
    assert not (harbor / "demo" / RUNS).exists()


def test_a_taskset_named_validation_keeps_the_validation_runs_apart(tmp_path: Path) -> None:
    harbor = tmp_path / "results" / "harbor"
    theirs = _new_layout_taskset(harbor / "validation" / "demo", "20261201T000000-oracle")
    migrate(harbor / "validation")
    assert theirs.is_dir()


def test_agent_and_model_names_cannot_leave_the_runs_folder() -> None:
    """Held: a run's folder name is one plain part, whatever the agent and model say."""
    for agent, model in [("../../etc", "../x"), ("..", ".."), ("a/b\\c", "\x1b[2J\n"), ("", "")]:
        name = run_folder_name("../2026-12-07T22:30:00", agent, model)
        assert "/" not in name and "\\" not in name and name not in ("", ".", "..")
        assert all(c.isalnum() or c in "._-" for c in name)
