"""What a run shows while it goes: in a terminal, a block under pytest's output rewritten
in place (episodes done of all, each one running with its phase and age); in a log, no
control character and at most a plain line now and then; under -q, nothing. The
sandboxes are the scripted fake's (tests/fake_provider.py): no engine is needed."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

import tests.fake_provider  # noqa: F401  (imported once, before any run: see the conftest)
from tests.fixtures import write_task
from tests.terminal_screen import Screen

#: A fake whose first agent command of the run (whichever process runs it) says it began,
#: then takes SLOW_S seconds; every other episode ends at once.
CONFTEST = """
import os
import time
from pathlib import Path

from tests.fake_provider import FakeProvider, SandboxScript, Verdict

HERE = Path(__file__).parent
SLOW_S = float(os.environ.get("HARBOR_TEST_SLOW_S", "0"))

def slow(call):
    if call.kind != "command":
        return None
    try:
        os.close(os.open(HERE / "slow-claimed", os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return None
    (HERE / "slow-started").touch()
    time.sleep(SLOW_S)
    return None

def pytest_harbor_sandbox_providers():
    return {
        "slow": lambda *, options, context: FakeProvider(SandboxScript(commands=slow)),
        "first-fails": lambda *, options, context: FakeProvider(
            SandboxScript(verdicts=(Verdict.reward("0"), Verdict.reward("1")))
        ),
    }
"""

#: How long the slow episode's agent takes: the live view redraws every 2 s.
SLOW_S = 7.0


@pytest.fixture
def dataset(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    # The run's conftest imports the fake from this repository's tests.
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    monkeypatch.setenv("HARBOR_TEST_SLOW_S", str(SLOW_S))
    dataset = pytester.path / "tasks"
    write_task(dataset, "alpha")
    write_task(dataset, "beta")
    pytester.makeconftest(CONFTEST)
    return dataset


def _command(pytester: pytest.Pytester, dataset: Path, *more: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pytest",
        f"--harbor-dataset={dataset}",
        "--harbor-sandbox=slow",
        f"--harbor-results-dir={pytester.path / 'out'}",
        "-p",
        "no:cacheprovider",
        "--color=no",
        "-n",
        "2",
        *more,
    ]


def _in_a_terminal(pytester: pytest.Pytester, command: list[str]) -> tuple[str, int]:
    """Run `command` with a pseudo-terminal (120 columns) as its output; all it wrote."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = {**os.environ, "COLUMNS": "120", "LINES": "40", "TERM": "xterm"}
    process = subprocess.Popen(
        command, stdin=slave, stdout=slave, stderr=slave, cwd=pytester.path, env=env
    )
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the other side closed
                break
            if not chunk:
                break
            chunks.append(chunk)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(master)
    return b"".join(chunks).decode(errors="replace"), process.returncode


def test_a_terminal_shows_each_running_episode_its_phase_and_age(
    pytester: pytest.Pytester, dataset: Path
) -> None:
    output, status = _in_a_terminal(pytester, _command(pytester, dataset))
    assert status == 0, output
    # While the slow one's agent worked, the block said so, its age growing.
    assert "harbor: 1/2 done, 1 running, 0 waiting" in output, output
    ages = [int(age) for age in re.findall(r"  tasks/(?:alpha|beta)::r0 agent (\d+)s", output)]
    assert ages and max(ages) >= 4, output
    assert ages == sorted(ages), output
    # Rewritten in place: played on a terminal, pytest's output is whole and the block
    # is gone at the end.
    screen = Screen()
    screen.write(output)
    shown = screen.text
    assert "harbor: 1/2 done" not in shown, shown
    assert re.search(r"^\.\. +\[100%\]$", shown, re.MULTILINE), shown
    assert re.search(r"^=+ 2 passed in ", shown, re.MULTILINE), shown


def test_a_terminal_under_q_shows_nothing_live(pytester: pytest.Pytester, dataset: Path) -> None:
    output, status = _in_a_terminal(pytester, _command(pytester, dataset, "-q"))
    assert status == 0, output
    assert "\x1b[K" not in output
    assert "harbor: 1/2" not in output


def test_a_log_gets_no_control_character_and_a_plain_line_when_asked(
    pytester: pytest.Pytester, dataset: Path
) -> None:
    out = pytester.path / "stdout"
    with out.open("wb") as stream:
        subprocess.run(
            _command(pytester, dataset, "--harbor-status-every=0", "--color=auto"),
            stdout=stream,
            stderr=subprocess.STDOUT,
            cwd=pytester.path,
            check=True,
            timeout=120,
        )
    output = out.read_text()
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", output), repr(output)
    lines = [line for line in output.splitlines() if line.startswith("harbor: ")]
    # After the quick episode's item ended: it is done, the slow one runs (its phase
    # as far as its process reported it).
    assert any(
        re.fullmatch(r"harbor: 1/2 done, 1 running \(tasks/\w+::r0 \w+ \d+s\), 0 waiting", line)
        for line in lines
    ), output


def test_a_log_gets_no_status_line_by_default_in_a_short_run(
    pytester: pytest.Pytester, dataset: Path
) -> None:
    result = pytester.runpytest(
        f"--harbor-dataset={dataset}",
        "--harbor-sandbox=first-fails",
        f"--harbor-results-dir={pytester.path / 'out'}",
    )
    result.assert_outcomes(passed=1, failed=1)
    assert not [line for line in result.outlines if line.startswith("harbor: ")]


def test_the_status_never_counts_an_ended_episode_as_running(
    pytester: pytest.Pytester, dataset: Path
) -> None:
    result = pytester.runpytest(
        f"--harbor-dataset={dataset}",
        "--harbor-sandbox=first-fails",
        f"--harbor-results-dir={pytester.path / 'out'}",
        "--harbor-status-every=0",
    )
    result.assert_outcomes(passed=1, failed=1)
    lines = [line for line in result.outlines if line.startswith("harbor: ")]
    # One line as each report (setup, call, teardown) is recorded: alpha's item failed
    # (reward 0), and from its call's report on it is done, not running.
    expected = [
        r"harbor: 0/2 done, 1 running \(tasks/alpha::r0 \w+ \d+s\), 1 waiting",
        r"harbor: 1/2 done \(1 failed\), 0 running, 1 waiting",
        r"harbor: 1/2 done \(1 failed\), 0 running, 1 waiting",
        r"harbor: 1/2 done \(1 failed\), 1 running \(tasks/beta::r0 \w+ \d+s\), 0 waiting",
        r"harbor: 2/2 done \(1 failed\), 0 running, 0 waiting",
        r"harbor: 2/2 done \(1 failed\), 0 running, 0 waiting",
    ]
    assert len(lines) == len(expected), lines
    for line, pattern in zip(lines, expected, strict=True):
        assert re.fullmatch(pattern, line), lines


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (
            "--harbor-live-report=0",
            "--harbor-live-report / harbor_live_report: expected a "
            "number of seconds above 0, got '0'",
        ),
        (
            "--harbor-status-every=soon",
            "--harbor-status-every / harbor_status_every: expected a number of seconds, got 'soon'",
        ),
    ],
)
def test_a_live_option_of_no_number_is_a_usage_error(
    pytester: pytest.Pytester, dataset: Path, option: str, message: str
) -> None:
    result = pytester.runpytest(f"--harbor-dataset={dataset}", "--harbor-sandbox=slow", option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


def test_a_live_report_without_a_report_is_warned_of(
    pytester: pytest.Pytester, dataset: Path
) -> None:
    result = pytester.runpytest(
        f"--harbor-dataset={dataset}",
        "--harbor-sandbox=first-fails",
        f"--harbor-results-dir={pytester.path / 'out'}",
        "--harbor-report=none",
        "--harbor-live-report=5",
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*--harbor-live-report: --harbor-report=none writes no report*"])
