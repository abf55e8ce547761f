"""Hostile dataset names against the run folders, in whole runs on the scripted fake
sandboxes (tests/fake_provider.py): no engine is needed. Each xfail(strict) test is an
attack that works today."""

from __future__ import annotations

from pathlib import Path

import pytest

import tests.fake_provider  # noqa: F401  (imported once, before any run: see the conftest)
from tests.fixtures import write_task

CONFTEST = """
from tests.fake_provider import FakeProvider

def pytest_harbor_sandbox_providers():
    return {"fake": lambda *, options, context: FakeProvider()}
"""


def run(pytester: pytest.Pytester, dataset: Path, agent: str) -> pytest.RunResult:
    return pytester.runpytest(
        f"--harbor-dataset={dataset}",
        "--harbor-sandbox=fake",
        f"--harbor-agent={agent}",
        f"--harbor-results-dir={pytester.path / 'out'}",
        "-p",
        "no:cacheprovider",
    )


def _runs(folder: Path) -> list[str]:
    runs = folder / "runs"
    return sorted(path.name for path in runs.iterdir()) if runs.is_dir() else []


@pytest.mark.xfail(
    strict=True,
    reason="a dataset named `validation` is given <results>/harbor/validation/ as its "
    "folder, where the oracle's runs of every taskset are: its first run moves them all "
    "into a run of its own (writers/runs.py:migrate)",
)
def test_a_dataset_named_validation_leaves_the_oracles_runs_in_place(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST)
    demo = pytester.path / "demo"
    write_task(demo, "alpha")
    assert run(pytester, demo, "oracle").ret == pytest.ExitCode.OK
    validated = pytester.path / "out" / "harbor" / "validation" / "demo"
    before = _runs(validated)
    assert len(before) == 1

    hostile = pytester.path / "sets" / "validation"
    write_task(hostile, "beta")
    run(pytester, hostile, "nop")
    assert _runs(validated) == before


@pytest.mark.xfail(
    strict=True,
    reason="a dataset named `<other>.previous` is taken for the earlier layout's folder "
    "of <other>'s runs: <other>'s next run moves its runs away (writers/runs.py:migrate)",
)
def test_a_dataset_named_like_the_earlier_layouts_folder_keeps_its_runs(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST)
    hostile = pytester.path / "sets" / "demo.previous"
    write_task(hostile, "beta")
    run(pytester, hostile, "nop")
    theirs = pytester.path / "out" / "harbor" / "demo.previous"
    before = _runs(theirs)
    assert len(before) == 1

    demo = pytester.path / "demo"
    write_task(demo, "alpha")
    run(pytester, demo, "nop")
    assert _runs(theirs) == before
    assert len(_runs(pytester.path / "out" / "harbor" / "demo")) == 1
