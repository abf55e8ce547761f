"""The `harbor` section at the end of a run, in the order it says things: filters that
matched nothing, task folders left out, each taskset's score and files, what became of its
results folder, the run's report and the run's notes. The sandboxes are the scripted fake's
(tests/fake_provider.py): no engine is needed."""

from __future__ import annotations

from pathlib import Path

import pytest

import tests.fake_provider  # noqa: F401  (imported once, before any run: see the conftest)
from tests.fixtures import write_task

#: The fake provider, registered for the run under test (it passes every verification).
CONFTEST = """
from tests.fake_provider import FakeProvider

def pytest_harbor_sandbox_providers():
    return {"fake": lambda *, options, context: FakeProvider()}
"""


@pytest.fixture
def dataset(pytester: pytest.Pytester) -> Path:
    dataset = pytester.path / "tasks"
    write_task(dataset, "alpha")
    write_task(dataset, "beta")
    write_task(dataset, "broken", toml="this is not toml [\n")
    pytester.makeconftest(CONFTEST)
    return dataset


def section(result: pytest.RunResult) -> list[str]:
    """The lines of the `harbor` section, up to pytest's closing line (blank ones left
    out)."""
    lines = result.outlines
    start = next(i for i, line in enumerate(lines) if " harbor " in line and line.startswith("="))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("="))
    return [line for line in lines[start + 1 : end] if line]


def test_the_harbor_section_says_each_thing_in_its_place(
    pytester: pytest.Pytester, dataset: Path
) -> None:
    out = pytester.path / "out"
    root = out / "harbor" / "validation" / "tasks"
    # Each run's own folder, named by its start and agent.
    folder = root / "runs" / "*-oracle*"
    common = (
        f"--harbor-dataset={dataset}",
        "--harbor-sandbox=fake",
        f"--harbor-results-dir={out}",
        "--harbor-skip-unloadable",
        "--harbor-only-tasks=alpha",
        "--harbor-only-tasks=broken",
        "--harbor-only-tasks=gamma",
    )
    left_out = [
        "tasks: left out 1 task folder (refused, or could not load)",
        "  broken: *",
    ]
    listed = f"  all of them: {folder / 'skipped.json'}"
    unmatched = "--harbor-only-tasks=gamma: no task matches (the tasks: alpha, beta, broken)"
    first = pytester.runpytest(*common, f"--harbor-report={out / 'run.html'}")
    assert first.ret == pytest.ExitCode.OK
    pytest.LineMatcher(section(first)).fnmatch_lines(
        [
            unmatched,
            *left_out,
            listed,
            "tasks: 1 episode, mean reward 1.000 (1 passed, 0 failed, 0 masked, 0 no result)",
            f"  rows: {folder / 'rollouts.jsonl'}",
            f"  summary: {folder / 'rollouts_run_summary.json'}",
            f"report: {out / 'run.html'}",
            "images made ahead for 1 task",
        ],
        consecutive=True,
    )
    assert len(section(first)) == 9

    again = pytester.runpytest(*common)
    pytest.LineMatcher(section(again)).fnmatch_lines(
        [
            unmatched,
            *left_out,
            listed,
            "tasks: 1 episode, mean reward 1.000 *",
            f"  rows: {folder / 'rollouts.jsonl'}",
            f"  summary: {folder / 'rollouts_run_summary.json'}",
            f"  report: {folder / 'report.html'}",
            "images made ahead for 1 task",
        ],
        consecutive=True,
    )
    assert len(section(again)) == 9
    # Both runs are kept, each in a folder of its own; latest names the second.
    first_run, second_run = sorted((root / "runs").iterdir())
    assert (root / "latest").resolve() == second_run
    assert f"  rows: {second_run / 'rollouts.jsonl'}" in section(again)
    assert (first_run / "rollouts.jsonl").read_text().count("\n") == 1

    # Nothing selected: no score, no folder, and latest still names the run before.
    none = pytester.runpytest(*common, "-k", "nothing")
    pytest.LineMatcher(section(none)).fnmatch_lines(
        [
            unmatched,
            "-k 'nothing': no episode matches (1 planned)",
            *left_out,
            "tasks: this run wrote no result, so it keeps no folder; "
            f"{root / 'latest'} still names {second_run.name}",
        ],
        consecutive=True,
    )
    assert len(section(none)) == 5
    assert sorted((root / "runs").iterdir()) == [first_run, second_run]


def test_a_run_with_nothing_to_say_has_no_harbor_section(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="def test_one():\n    pass\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.OK
    assert not any(" harbor " in line for line in result.outlines)
