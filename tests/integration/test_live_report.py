"""The report of a run in progress (`--harbor-live-report`), loaded in a real headless
browser (Debian's chromium) while the run goes and after it ended. The sandboxes are the
scripted fake's (tests/fake_provider.py): no engine is needed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tests.fake_provider  # noqa: F401  (imported once, before any run: see the conftest)
from tests.acceptance.test_live_view import CONFTEST
from tests.fixtures import write_task
from tests.integration.test_report import browse

#: How long the slow episode's agent takes.
SLOW_S = 12.0


def _live_report(root: Path, deadline: float) -> Path:
    """The report under `root` once it says one episode ended and the other runs."""
    while time.monotonic() < deadline:
        for path in root.rglob("report.html"):
            if "Run in progress: 1 of 2 episodes done" in path.read_text(errors="replace"):
                return path
        time.sleep(0.2)
    raise AssertionError(f"no report in progress under {root}")


def test_a_browser_follows_the_run_and_keeps_the_final_report(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    monkeypatch.setenv("HARBOR_TEST_SLOW_S", str(SLOW_S))
    dataset = pytester.path / "tasks"
    write_task(dataset, "alpha")
    write_task(dataset, "beta")
    pytester.makeconftest(CONFTEST)
    out = pytester.path / "out"
    log = pytester.path / "stdout"
    with log.open("wb") as stream:
        run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pytest",
                f"--harbor-dataset={dataset}",
                "--harbor-sandbox=slow",
                f"--harbor-results-dir={out}",
                "--harbor-live-report=1",
                "-p",
                "no:cacheprovider",
                "-n",
                "2",
            ],
            stdout=stream,
            stderr=subprocess.STDOUT,
            cwd=pytester.path,
            env=dict(os.environ),
        )
        try:
            page = _live_report(out, time.monotonic() + 60)
            assert run.poll() is None, "the run ended before its report was read live"
            dom, console = browse(page, pytester.path / "profile-live", "--dump-dom")
            assert run.poll() is None, "the run ended before the browser read its report"
            assert console == []
            assert "Run in progress: 1 of 2 episodes done, 1 running; updated at" in dom, dom
            assert '<meta http-equiv="refresh" content="1">' in dom, dom
            assert run.wait(timeout=120) == 0, log.read_text()
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
    dom, console = browse(page, pytester.path / "profile-final", "--dump-dom")
    assert console == []
    assert "Run in progress" not in dom, dom
    assert 'http-equiv="refresh"' not in dom, dom
    assert "pytest-harbor report" in dom
