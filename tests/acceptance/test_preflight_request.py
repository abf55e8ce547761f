"""The pre-flight request: before any episode, one small request like the agent's; an
endpoint that refuses it stops the run with its own words. Nothing here starts a sandbox."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.anthropic_server import ScriptedMessages
from tests.fixtures import write_task
from tests.model_server import MODEL, VLLM_NO_TOOLS, ScriptedModel, answer
from tests.responses_server import ScriptedResponses


@pytest.fixture
def dataset(pytester: pytest.Pytester) -> Path:
    folder = pytester.path / "tasks"
    write_task(folder, "alpha")
    return folder


@pytest.fixture
def no_tools() -> Iterator[ScriptedModel]:
    """vLLM served without --enable-auto-tool-choice."""
    with ScriptedModel(lambda request: answer("ok"), broken="no-tool-parser") as running:
        yield running


def agent_run(
    pytester: pytest.Pytester, dataset: Path, server: ScriptedModel, *args: str
) -> pytest.RunResult:
    return pytester.runpytest(
        f"--harbor-dataset={dataset}", "--harbor-results-dir=out", *server.options(), *args
    )


def test_an_endpoint_refusing_tool_calls_stops_the_run_with_its_own_words(
    pytester: pytest.Pytester,
    dataset: Path,
    no_tools: ScriptedModel,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HARBOR_MODEL_API_KEY", str(no_tools.api_key))
    result = agent_run(pytester, dataset, no_tools)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"*--harbor-model {MODEL} at {no_tools.url}: POST {no_tools.url}/chat/completions "
            "(the pre-flight request, chat-completions, with the tool bash) answered 400 Bad "
            f"Request: {VLLM_NO_TOOLS}",
            "*give --harbor-no-preflight-request to skip this check*",
        ]
    )
    assert len(no_tools.probes) == 1
    assert no_tools.requests == []  # no episode asked the model anything
    assert not (pytester.path / "out/harbor/tasks/rollouts.jsonl").exists()
    assert str(no_tools.api_key) not in result.stdout.str() + result.stderr.str()


def test_an_endpoint_failing_with_500_stops_the_run(
    pytester: pytest.Pytester, dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ScriptedModel(lambda request: answer("ok"), broken="500") as server:
        monkeypatch.setenv("HARBOR_MODEL_API_KEY", str(server.api_key))
        result = agent_run(pytester, dataset, server)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*(the pre-flight request, *) answered 500 Internal Server Error: Internal Server Error"]
    )
    assert server.requests == []


def test_a_healthy_endpoint_gets_one_small_request_like_shell_agents(
    pytester: pytest.Pytester, dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ScriptedModel(lambda request: answer("ok")) as server:
        monkeypatch.setenv("HARBOR_MODEL_API_KEY", str(server.api_key))
        result = agent_run(
            pytester,
            dataset,
            server,
            "--harbor-model-param=temperature=0.6",
            "--harbor-model-param=max_tokens=4096",
            "-k",
            "no-such-task",
        )
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    [probe] = server.probes
    body = probe.body
    assert [tool["function"]["name"] for tool in body["tools"]] == ["bash"]
    assert body["tools"][0]["function"]["parameters"]["required"] == ["command"]
    assert body["tool_choice"] == "auto"
    assert body["model"] == MODEL
    assert body["temperature"] == 0.6  # the run's parameters, as they change validity
    assert body["max_tokens"] == 16  # but the answer kept tiny
    assert probe.headers["Authorization"] == f"Bearer {server.api_key}"


def test_the_switch_skips_the_request(
    pytester: pytest.Pytester,
    dataset: Path,
    no_tools: ScriptedModel,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HARBOR_MODEL_API_KEY", str(no_tools.api_key))
    result = agent_run(
        pytester, dataset, no_tools, "--harbor-no-preflight-request", "-k", "no-such-task"
    )
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    assert no_tools.probes == []
    assert no_tools.model_list_requests == 1  # the model list is still asked for
    pytester.makeini("[pytest]\nharbor_no_preflight_request = true\n")
    by_ini = agent_run(pytester, dataset, no_tools, "-k", "no-such-task")
    assert by_ini.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    assert no_tools.probes == []


def test_a_replay_sends_the_endpoint_nothing(
    pytester: pytest.Pytester,
    dataset: Path,
    no_tools: ScriptedModel,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HARBOR_MODEL_API_KEY", str(no_tools.api_key))
    (pytester.path / "tapes").mkdir()
    result = agent_run(pytester, dataset, no_tools, "--harbor-replay=tapes", "-k", "nothing")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    assert no_tools.probes == []
    assert no_tools.model_list_requests == 0


def test_a_cli_agent_is_sent_a_request_of_its_own_api(
    pytester: pytest.Pytester, dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ScriptedResponses(lambda request: {}) as responses:
        monkeypatch.setenv("HARBOR_MODEL_API_KEY", responses.api_key)
        codex = pytester.runpytest(
            f"--harbor-dataset={dataset}",
            "--harbor-agent=codex",
            "--harbor-model=responses-scripted",
            f"--harbor-model-url={responses.url}",
            "-k",
            "nothing",
        )
    assert codex.ret == pytest.ExitCode.NO_TESTS_COLLECTED, codex.stderr.str()
    [probe] = responses.probes
    assert probe.body["tools"][0]["type"] == "function"
    assert probe.body["tools"][0]["name"] == "bash"
    assert probe.body["max_output_tokens"] == 16
    assert responses.requests == []

    with ScriptedMessages(lambda request: ([], "end_turn")) as messages:
        monkeypatch.setenv("HARBOR_MODEL_API_KEY", messages.api_key)
        claude = pytester.runpytest(
            f"--harbor-dataset={dataset}",
            "--harbor-agent=claude-code",
            "--harbor-model=claude-scripted",
            f"--harbor-model-url={messages.url}",
            "-k",
            "nothing",
        )
    assert claude.ret == pytest.ExitCode.NO_TESTS_COLLECTED, claude.stderr.str()
    [probe] = messages.probes
    assert probe.body["tools"][0]["input_schema"]["required"] == ["command"]
    assert probe.body["max_tokens"] == 16
    assert messages.requests == []
