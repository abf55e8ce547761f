"""The live view's parts without a run: the block rewritten in place under pytest's output
(played on a test terminal), the progress it shows, and pytest's private names it uses."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import pytest
from _pytest._io import TerminalWriter

from pytest_harbor.plugin.ledger import EpisodeLedger
from pytest_harbor.plugin.live import LiveView
from pytest_harbor.plugin.live_terminal import LiveBlock, replace_terminal_file, terminal_file
from pytest_harbor.plugin.phases import PhaseBoard
from pytest_harbor.plugin.planned import PlannedRun
from pytest_harbor.plugin.progress import RunningEpisode, RunProgress, run_progress
from pytest_harbor.relay import RelayError, RunSpend
from pytest_harbor.relay.reports import Counts
from pytest_harbor.report import LiveNote, write_live_report
from pytest_harbor.report.page import render_page
from pytest_harbor.report.results import taskset_results
from pytest_harbor.report.transcripts import Budget
from tests.terminal_screen import Screen


class _Reporter:
    """What LiveBlock uses of pytest's TerminalReporter: its writer."""

    def __init__(self, file: io.StringIO) -> None:
        self._tw = TerminalWriter(file)
        self._tw.fullwidth = 60


def _played(file: io.StringIO) -> Screen:
    screen = Screen()
    screen.write(file.getvalue())
    return screen


def test_pytest_s_private_terminal_names_are_there(pytestconfig: pytest.Config) -> None:
    reporter = pytestconfig.pluginmanager.getplugin("terminalreporter")
    writer, file = terminal_file(reporter)
    assert isinstance(writer, TerminalWriter)
    assert hasattr(file, "write")
    other = io.StringIO()
    replace_terminal_file(writer, other)
    try:
        writer.write("through the stand-in")
    finally:
        replace_terminal_file(writer, file)
    assert other.getvalue() == "through the stand-in"


def test_only_the_page_of_a_run_in_progress_refreshes(tmp_path: Path) -> None:
    summary = {"taskset": "tasks", "episodes": [{"task_id": "a", "repeat": 0}]}
    note = LiveNote(done=1, total=4, running=2, failed=1, updated_at="T", refresh_s=2.5)
    live = write_live_report([(tmp_path, summary)], tmp_path / "live.html", note).read_text()
    assert '<meta http-equiv="refresh" content="3">' in live
    assert "Run in progress: 1 of 4 episodes done, 2 running, 1 failed; updated at T." in live
    page = render_page(
        [taskset_results(tmp_path, summary)],
        tmp_path / "final.html",
        generated_at="T",
        budget=Budget(),
    )
    assert "refresh" not in page
    assert "Run in progress" not in page


def test_the_block_sits_under_pytest_s_line_and_leaves_it_whole() -> None:
    file = io.StringIO()
    reporter = _Reporter(file)
    block = LiveBlock(reporter)  # type: ignore[arg-type]
    writer = reporter._tw
    writer.write("tasks/alpha ..")
    block.show(["harbor: 2/4 done, 1 running", "  tasks/beta::r0 agent 12s"])
    assert _played(file).text.splitlines() == [
        "tasks/alpha ..",
        "harbor: 2/4 done, 1 running",
        "  tasks/beta::r0 agent 12s",
    ]
    # pytest's next marks land on its own line, and the block is drawn again below.
    writer.write(".F")
    block.show(["harbor: 4/4 done (1 failed), 0 running"])
    assert _played(file).text.splitlines() == [
        "tasks/alpha ...F",
        "harbor: 4/4 done (1 failed), 0 running",
    ]
    # pytest's lines erase it: a line that ends an item must never sit above a block
    # that still shows the item running.
    writer.line(" [100%]")
    writer.line("FAILED tasks/gamma::r0::episode - reward 0")
    assert _played(file).text.splitlines() == [
        "tasks/alpha ...F [100%]",
        "FAILED tasks/gamma::r0::episode - reward 0",
    ]
    block.show(["harbor: 4/4 done (1 failed), 0 running"])
    # A snapshot older than the one shown is dropped.
    block.show(["harbor: 3/4 done, 1 running"], taken=0.0)
    assert _played(file).text.splitlines() == [
        "tasks/alpha ...F [100%]",
        "FAILED tasks/gamma::r0::episode - reward 0",
        "harbor: 4/4 done (1 failed), 0 running",
    ]
    block.close()
    assert _played(file).text.splitlines() == [
        "tasks/alpha ...F [100%]",
        "FAILED tasks/gamma::r0::episode - reward 0",
    ]
    # pytest has its file back.
    assert reporter._tw._file is file


def test_a_line_too_wide_is_cut_to_the_terminal() -> None:
    file = io.StringIO()
    reporter = _Reporter(file)
    block = LiveBlock(reporter)  # type: ignore[arg-type]
    block.show(["x" * 200])
    lines = _played(file).text.splitlines()
    assert lines == ["x" * 56 + "..."]


def _ledger(*trials: str) -> EpisodeLedger:
    ledger = EpisodeLedger(run_id="r", agent="oracle", validation=True, pass_reward=1.0)
    ledger.plan("tasks", 1, {name: "digest" for name in trials})
    ledger.select(f"tasks/{name}::r0::episode" for name in trials)
    return ledger


def test_an_episode_whose_item_ended_is_never_running(tmp_path: Path) -> None:
    ledger = _ledger("alpha", "beta", "gamma", "delta")
    records = {record.task_id: record for record in ledger.trials.values()}
    for name in ("alpha", "beta", "gamma"):
        records[name].started, records[name].began_at = True, 100.0
    ledger.failed(records["alpha"], "harbor:internal_error", "broke")
    records["beta"].skip_reason = "no solution"
    board = PhaseBoard(tmp_path)
    board.post("tasks/gamma::r0", "verifying", "episode")
    progress = run_progress(ledger, PlannedRun(), phases=board, now=130.0)
    assert progress.done == 2
    assert progress.failed == 1
    assert progress.waiting == 1
    assert progress.running == (RunningEpisode("tasks/gamma::r0", "verifying", "episode", 30.0),)
    assert progress.plain() == (
        "harbor: 2/4 done (1 failed), 1 running (tasks/gamma::r0 verifying 30s), 1 waiting"
    )


def test_the_block_names_each_running_episode_its_turn_and_the_spend() -> None:
    spend = RunSpend(
        counts=Counts(requests=3, prompt_tokens=1000, completion_tokens=234, cost_usd=0.5)
    )
    progress = RunProgress(
        done=1,
        total=3,
        failed=0,
        running=(
            RunningEpisode("tasks/a::r0", "agent", "step-2", 65.0),
            RunningEpisode("tasks/b::r0", None, None, 1.0),
        ),
        waiting=0,
        spend=spend,
        steps=True,
    )
    assert progress.block(200, 2) == [
        "harbor: 1/3 done, 2 running, 0 waiting, $0.5000, 1,234 tokens",
        "  ... and 2 more",
    ]
    assert progress.block(200, 10) == [
        "harbor: 1/3 done, 2 running, 0 waiting, $0.5000, 1,234 tokens",
        "  tasks/a::r0 agent step-2 1m05s",
        "  tasks/b::r0 starting 1s",
    ]


class _Relay:
    """What the live view asks of the run's relay: its spend, or an error."""

    def __init__(self, *answers: RunSpend | RelayError) -> None:
        self.answers = list(answers)

    def spend(self) -> RunSpend:
        answer = self.answers.pop(0)
        if isinstance(answer, RelayError):
            raise answer
        return answer


def test_the_live_view_shows_the_spend_once_the_relay_counts_it(tmp_path: Path) -> None:
    counts = Counts(requests=2, prompt_tokens=1200, completion_tokens=300, cost_usd=0.1234)
    relay = _Relay(RunSpend(), RunSpend(counts=counts), RelayError("gone"))
    run = SimpleNamespace(relay=relay, phases=PhaseBoard(tmp_path))
    state = SimpleNamespace(
        run=run, ledger=_ledger("alpha"), planned=PlannedRun(), builds=SimpleNamespace(building=0)
    )
    view = LiveView(state)  # type: ignore[arg-type]
    # No call served yet: no spend shown.
    assert view.progress(ask_relay=True).headline() == "harbor: 0/1 done, 0 running, 1 waiting"
    counted = "harbor: 0/1 done, 0 running, 1 waiting, $0.1234, 1,500 tokens"
    assert view.progress(ask_relay=True).headline() == counted
    # The relay not answering keeps what it last counted.
    assert view.progress(ask_relay=True).headline() == counted
