"""The probe of check mode without a sandbox: which lines of a task's solution and tests
it looks for in an image, and which files its tests name."""

from __future__ import annotations

from pathlib import Path

from pytest_harbor.engine.outcomes import probe_check_outcome, probe_findings
from pytest_harbor.engine.results import TurnResult
from pytest_harbor.harnesses.probe import distinctive_lines, named_files
from pytest_harbor.tasks import load_task
from tests.fixtures import write_task


def test_it_looks_for_lines_that_carry_a_value_and_not_for_boilerplate(tmp_path: Path) -> None:
    task = write_task(
        tmp_path,
        "t",
        instruction="Write the passphrase to /tmp/pass.txt.\n",
        solve_sh=(
            "#!/bin/bash\nset -euo pipefail\nfrom pathlib import Path\n"
            "echo correct-horse-battery-staple-7731 > /tmp/pass.txt\n"
        ),
        test_sh=(
            "# a comment that is long enough to count\n"
            'expected="a sentence the answer holds"\n'
            "echo 1 > /logs/verifier/reward.txt\n"
        ),
    )
    turn = load_task(task).turns[0]
    found = distinctive_lines(turn, turn.instruction)
    assert "correct-horse-battery-staple-7731" in found
    assert 'expected="a sentence the answer holds"' in found
    assert "echo correct-horse-battery-staple-7731 > /tmp/pass.txt" in found
    assert not any("comment" in line or "pipefail" in line or "pathlib" in line for line in found)
    assert not any("/logs/verifier" in line for line in found)


def test_it_creates_the_files_the_tests_name_outside_the_systems_folders(tmp_path: Path) -> None:
    task = write_task(
        tmp_path,
        "t",
        test_sh=(
            "[ -f report.txt ] && [ -x /app/bin/tool ] && grep -q x /app/out/data.csv\n"
            "cat /etc/passwd /usr/bin/env $HOME/x /tests/helper.sh > /dev/null\n"
        ),
    )
    turn = load_task(task).turns[0]
    assert named_files(turn, "/work") == ["/app/bin/tool", "/app/out/data.csv", "/work/report.txt"]


def test_the_probes_item_fails_on_a_score_for_files_or_a_finding(tmp_path: Path) -> None:
    quiet = TurnResult(step="episode", reward=0.0, response='{"git": [], "image": []}')
    assert probe_check_outcome(quiet).status == "passed"
    scored = TurnResult(step="episode", reward=1.0, response='{"created": ["/app/x"]}')
    assert "for only creating the files" in probe_check_outcome(scored).headline
    git = TurnResult(step="episode", reward=0.0, response='{"git": ["/app/.git"]}')
    assert probe_check_outcome(git).status == "failed"
    assert probe_findings("not json") == {} and probe_findings("[1]") == {}
