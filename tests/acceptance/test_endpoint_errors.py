"""The model endpoint's errors during a run are on the terminal as they happen, before the
item's result, each distinct one a few times, then counted at the end. The sandboxes are
the scripted fake's (tests/fake_provider.py): no engine is needed."""

from __future__ import annotations

from pathlib import Path

import pytest

import tests.fake_provider  # noqa: F401  (imported once, before any run: see the conftest)
from tests.fixtures import write_task
from tests.model_server import VLLM_NO_TOOLS, ScriptedModel, error, no_tool_parser

CONFTEST = """
from tests.fake_provider import FakeProvider

def pytest_harbor_sandbox_providers():
    return {"fake": lambda *, options, context: FakeProvider()}
"""

#: One retry in a fresh sandbox, at once.
ONE_RETRY = "--harbor-set=agent_outcome_policy.api_error={action: retry, retries: 1, backoff_s: 0}"


@pytest.fixture(autouse=True)
def _tests_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's xdist workers import the conftest's fake sandboxes from this checkout."""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))


def dataset(pytester: pytest.Pytester, *names: str) -> Path:
    folder = pytester.path / "tasks"
    for name in names:
        write_task(folder, name)
    pytester.makeconftest(CONFTEST)
    return folder


def run(
    pytester: pytest.Pytester, folder: Path, server: ScriptedModel, *more: str
) -> pytest.RunResult:
    arguments = (
        f"--harbor-dataset={folder}",
        "--harbor-sandbox=fake",
        f"--harbor-results-dir={pytester.path / 'out'}",
        *server.options(),
        *more,
    )
    if "-n" in more:
        # A process of its own: xdist gives its workers the import path their controller
        # started with, which in this process (itself maybe a worker) lacks the checkout.
        return pytester.runpytest_subprocess(*arguments)
    return pytester.runpytest(*arguments)


def index_of(lines: list[str], part: str) -> int:
    return next(number for number, line in enumerate(lines) if part in line)


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["sole", "xdist"])
def test_a_refusal_mid_run_is_shown_before_the_items_result(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, workers: list[str]
) -> None:
    folder = dataset(pytester, "alpha")
    # The pre-flight request passes (the fake answers it apart); every agent request fails.
    with ScriptedModel(lambda request: no_tool_parser()) as server:
        monkeypatch.setenv("HARBOR_MODEL_API_KEY", str(server.api_key))
        result = run(pytester, folder, server, "-v", *workers)
    lines = result.outlines
    shown = index_of(
        lines,
        f"harbor: alpha__r0: model endpoint answered 400: {VLLM_NO_TOOLS} "
        "(request not tried again)",
    )
    outcome = index_of(lines, "tasks/alpha::r0::episode")
    result_word = next(
        number
        for number, line in enumerate(lines)
        if number >= outcome and ("PASSED" in line or "FAILED" in line or "ERROR" in line)
    )
    assert shown < result_word, result.stdout.str()
    result.stdout.fnmatch_lines(
        ["harbor: the model endpoint's errors during the run:", f"  1 x 400: {VLLM_NO_TOOLS}"]
    )
    assert "EndpointErrorWarning" not in result.stdout.str()  # not in the warnings summary
    assert str(server.api_key) not in result.stdout.str()


def test_a_server_error_is_shown_at_each_try_and_each_episode_retry(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = dataset(pytester, "alpha")
    with ScriptedModel(lambda request: error(500, "upstream worker died")) as server:
        monkeypatch.setenv("HARBOR_MODEL_API_KEY", str(server.api_key))
        result = run(
            pytester,
            folder,
            server,
            "--harbor-agent-option=max_request_attempts=2",
            "--harbor-agent-option=backoff_base_s=0",
            ONE_RETRY,
        )
    said = "harbor: alpha__r0: model endpoint answered 500: upstream worker died"
    result.stdout.fnmatch_lines(
        [
            f"{said} (request attempt 1 of 2, retrying in 0 s)",
            f"{said} (episode attempt 1 of 2, retrying in 0 s in a fresh sandbox)",
            f"{said} (request attempt 1 of 2, retrying in 0 s)",
            "harbor: (this error is now counted, not shown; the counts end the run)",
            "*ERROR*alpha*",
            "harbor: the model endpoint's errors during the run:",
            "  4 x 500: upstream worker died",
        ]
    )


def test_many_episodes_refused_alike_are_counted_not_flooded(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = dataset(pytester, "a", "b", "c", "d", "e")
    with ScriptedModel(lambda request: no_tool_parser()) as server:
        monkeypatch.setenv("HARBOR_MODEL_API_KEY", str(server.api_key))
        result = run(pytester, folder, server)
    shown = [line for line in result.outlines if "model endpoint answered 400" in line]
    assert len(shown) == 3
    result.stdout.fnmatch_lines(
        [
            "harbor: (this error is now counted, not shown; the counts end the run)",
            "harbor: the model endpoint refused 3 episodes with the same 400: the others will "
            "most likely be refused too*",
            f"  5 x 400: {VLLM_NO_TOOLS}",
        ]
    )
