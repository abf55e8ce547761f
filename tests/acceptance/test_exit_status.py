"""What a run's exit status says: pytest's by default (an episode under the pass mark fails
the run, as CI needs), or, under `exit_status = "results"`, whether every episode has a
result, whatever its reward, as an evaluation needs. The sandboxes are the scripted
fake's (tests/fake_provider.py): no engine is needed."""

from __future__ import annotations

from pathlib import Path

import pytest

import tests.fake_provider  # noqa: F401  (imported once, before any run: see the conftest)
from tests.fixtures import write_task

#: Three fakes: every verification scores 0, every verification scores 1, no sandbox
#: starts (every episode has no result).
CONFTEST = """
from tests.fake_provider import FakeProvider, SandboxScript, Verdict

def pytest_harbor_sandbox_providers():
    return {
        "scores-0": lambda *, options, context: FakeProvider(
            SandboxScript(verdicts=(Verdict.reward("0"),))
        ),
        "scores-1": lambda *, options, context: FakeProvider(),
        "broken": lambda *, options, context: FakeProvider(
            SandboxScript(start_error="the engine is gone")
        ),
    }
"""


@pytest.fixture
def dataset(pytester: pytest.Pytester) -> Path:
    dataset = pytester.path / "tasks"
    write_task(dataset, "alpha")
    write_task(dataset, "beta")
    pytester.makeconftest(CONFTEST)
    return dataset


def run(pytester: pytest.Pytester, dataset: Path, sandbox: str, *more: str) -> pytest.RunResult:
    return pytester.runpytest(
        f"--harbor-dataset={dataset}",
        f"--harbor-sandbox={sandbox}",
        "--harbor-agent=nop",
        f"--harbor-results-dir={pytester.path / 'out'}",
        *more,
    )


@pytest.mark.parametrize(
    ("sandbox", "items", "results"),
    [
        ("scores-0", pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.OK),
        ("scores-1", pytest.ExitCode.OK, pytest.ExitCode.OK),
        ("broken", pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.TESTS_FAILED),
    ],
)
def test_the_exit_status_tells_a_low_score_from_a_broken_run_when_asked(
    pytester: pytest.Pytester,
    dataset: Path,
    sandbox: str,
    items: pytest.ExitCode,
    results: pytest.ExitCode,
) -> None:
    assert run(pytester, dataset, sandbox).ret == items
    assert run(pytester, dataset, sandbox, "--harbor-set=exit_status=results").ret == results


def test_an_exit_status_setting_of_another_name_is_a_usage_error(
    pytester: pytest.Pytester, dataset: Path
) -> None:
    result = run(pytester, dataset, "scores-1", "--harbor-set=exit_status=rewards")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*exit_status*"])
