"""What an interrupted run says: how many episodes the same command with --harbor-resume
runs (those cut short and those never started), and its pass@k as a score so far. The
sandboxes are the scripted fake's (tests/fake_provider.py): no engine is needed."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

import tests.fake_provider  # noqa: F401  (imported once, before any run: see the conftest)
from tests.fixtures import write_task

#: A fake whose third solve.sh (a command of the agent's) says it started, then hangs:
#: two episodes end first, scored 1.
CONFTEST = """
import itertools
import time
from pathlib import Path

from tests.fake_provider import FakeProvider, SandboxScript

STARTED = Path(__file__).parent / "started"
AGENT_COMMANDS = itertools.count(1)

def hang(call):
    if call.kind == "command" and next(AGENT_COMMANDS) == 3:
        STARTED.touch()
        time.sleep(60)
    return None

def pytest_harbor_sandbox_providers():
    return {"hangs": lambda *, options, context: FakeProvider(SandboxScript(commands=hang))}
"""


def test_an_interrupted_run_counts_what_resume_runs(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The run's conftest imports the fake from this repository's tests.
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    dataset = pytester.path / "tasks"
    for name in ("alpha", "beta", "gamma"):
        write_task(dataset, name)
    pytester.makeconftest(CONFTEST)
    started = pytester.path / "started"
    run = pytester.popen(
        [
            sys.executable,
            "-m",
            "pytest",
            f"--harbor-dataset={dataset}",
            "--harbor-sandbox=hangs",
            "--harbor-repeats=2",
            f"--harbor-results-dir={pytester.path / 'out'}",
            "-p",
            "no:cacheprovider",
        ],
        stdout=pytester.path.joinpath("stdout").open("wb"),
        stderr=pytester.path.joinpath("stderr").open("wb"),
    )
    try:
        deadline = time.monotonic() + 60
        while not started.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert started.exists(), pytester.path.joinpath("stdout").read_text()
        run.send_signal(signal.SIGINT)
        run.wait(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    output = pytester.path.joinpath("stdout").read_text()
    # Two episodes ended, the third was cut short, the other three never started.
    assert (
        "interrupted: 4 episode(s) have no result (1 cut short, 3 not started); the same "
        "command with --harbor-resume runs only those, keeping the rest"
    ) in output, output
    # A pass@k of the episodes that ended is no final score.
    assert "  pass@k so far (the run did not finish): pass@1 1.000" in output, output
