"""Check mode's options and collection: the nop trial beside the oracle's repeats, and the
options that contradict the mode refused. Nothing here starts a sandbox."""

from __future__ import annotations

import pytest

from tests.fixtures import write_task


@pytest.fixture
def tasks(pytester: pytest.Pytester) -> str:
    dataset = pytester.path / "tasks"
    write_task(dataset, "alpha")
    write_task(dataset, "beta", solve_sh=None)
    return f"--harbor-dataset={dataset}"


def test_check_collects_the_oracle_repeats_and_one_nop_and_probe_trial_per_task(
    pytester: pytest.Pytester, tasks: str
) -> None:
    result = pytester.runpytest(tasks, "--harbor-check", "--harbor-check-repeats=2", "--co", "-q")
    result.stdout.fnmatch_lines(
        [
            "tasks/alpha::r0::episode",
            "tasks/alpha::r1::episode",
            "tasks/alpha::nop::episode",
            "tasks/alpha::probe::episode",
            "tasks/beta::r0::episode",
            "tasks/beta::r1::episode",
            "tasks/beta::nop::episode",
            "tasks/beta::probe::episode",
            "8 tests collected*",
        ]
    )


def test_without_check_there_is_no_nop_trial(pytester: pytest.Pytester, tasks: str) -> None:
    result = pytester.runpytest(tasks, "--co", "-q")
    result.stdout.fnmatch_lines(["tasks/alpha::r0::episode", "tasks/beta::r0::episode"])
    result.stdout.no_fnmatch_line("*::nop::*")


def test_check_is_selectable_by_trial(pytester: pytest.Pytester, tasks: str) -> None:
    result = pytester.runpytest(tasks, "--harbor-check", "-k", "nop", "--co", "-q")
    result.stdout.fnmatch_lines(
        ["tasks/alpha::nop::episode", "tasks/beta::nop::episode", "2/6 tests collected*"]
    )
    result = pytester.runpytest(tasks, "--harbor-check", "-k", "probe", "--co", "-q")
    result.stdout.fnmatch_lines(
        ["tasks/alpha::probe::episode", "tasks/beta::probe::episode", "2/6 tests collected*"]
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--harbor-check-repeats=3"],
            "*--harbor-check-repeats / harbor_check_repeats: only with --harbor-check*",
        ),
        (
            ["--harbor-check", "--harbor-agent=nop"],
            "*--harbor-check with --harbor-agent: the check runs the oracle and nop*",
        ),
        (
            ["--harbor-check", "--harbor-repeats=2"],
            "*--harbor-check with --harbor-repeats: the check*s repeats are --harbor-check-rep*",
        ),
        (
            ["--harbor-check", "--harbor-resume"],
            "*--harbor-check with --harbor-resume: a check runs every selected task afresh*",
        ),
        (
            ["--harbor-check", "--harbor-check-repeats=0"],
            "*--harbor-check-repeats / harbor_check_repeats: must be at least 1*",
        ),
        (
            ["--harbor-check", "--harbor-check-repeats=two"],
            "*--harbor-check-repeats / harbor_check_repeats: expected an integer, got 'two'*",
        ),
    ],
)
def test_options_that_contradict_the_check_are_usage_errors(
    pytester: pytest.Pytester, tasks: str, args: list[str], message: str
) -> None:
    result = pytester.runpytest(tasks, *args, "--co")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_an_ini_agent_gives_way_to_the_check(pytester: pytest.Pytester, tasks: str) -> None:
    pytester.makeini("[pytest]\nharbor_agent = nop\n")
    result = pytester.runpytest(tasks, "--harbor-check", "--co", "-q")
    # The oracle's trials, not skipped for want of a model or named after nop.
    result.stdout.fnmatch_lines(["tasks/alpha::r0::episode", "tasks/alpha::nop::episode"])
    assert result.ret == pytest.ExitCode.OK
