"""The comparison of two real runs (`python -m pytest_harbor.report --compare OLD NEW`),
loaded in a real headless browser (Debian's chromium): the flips and new failures are on
the page, and a hostile failure reason shows as text, its script never run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures import REPO_ROOT
from tests.integration.test_report import browse, chromium
from tests.real_runs import HOSTILE_REASON, make_real_runs


def test_the_comparison_page_shows_flips_and_new_failures_and_runs_no_script(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    chromium()
    runs = make_real_runs(pytester)
    page = tmp_path / "compare.html"
    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest_harbor.report",
            "--compare",
            str(runs.old),
            str(runs.hostile),
            "-o",
            str(page),
        ],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},  # this checkout's package
    )
    assert made.returncode == 0, made.stderr
    assert "2 passed→failed, 1 failed→passed, 2 new failure(s)" in made.stdout

    dom, console = browse(page, tmp_path / "profile", "--dump-dom")
    assert console == []  # nothing failed, nothing the page's data put there ran
    assert "<title>pytest-harbor comparison: tasks</title>" in dom  # not 'pwned'
    assert dom.count("<script>") == 1 and "<img" not in dom  # the page's own sorter only
    # The flips, marked both ways, and the new failures with their kinds.
    assert '<tr class="flip change-regressed"><td>alpha</td>' in dom
    assert '<tr class="flip change-regressed"><td>delta</td>' in dom
    assert '<tr class="flip change-fixed"><td>beta</td>' in dom
    assert "▼ passed→failed" in dom and "▲ failed→passed" in dom
    new_failures = dom[dom.index('<h2 id="new-failures">') : dom.index('<h2 id="tasks">')]
    assert new_failures.count('<tr class="new-failure">') == 2
    assert '<td class="kind">the verifier scored 0</td>' in new_failures
    assert '<td class="kind">harbor:sandbox_start_failed</td>' in new_failures
    # The hostile reason as text, its bidi override as an escape.
    shown = (
        HOSTILE_REASON.replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace("\u202e", "\\u202e")
    )
    assert shown in new_failures and "\u202e" not in dom


def test_the_title_check_sees_a_script_that_ran(tmp_path: Path) -> None:
    """Without this, a title left as it was proves nothing: the reason's script, unescaped,
    runs. (Its alert() would hold a headless load: it is left out here.)"""
    chromium()
    script = HOSTILE_REASON.split("<img")[0]
    page = tmp_path / "raw.html"
    page.write_text(f"<!DOCTYPE html><title>kept</title><p>{script}</p>")
    dom, _ = browse(page, tmp_path / "profile", "--dump-dom")
    assert "<title>pwned</title>" in dom
