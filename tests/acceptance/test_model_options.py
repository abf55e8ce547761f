"""Model and harness options before any episode starts: the endpoint check, the key, the
manifest, resume, and harnesses registered by other plugins.

Nothing here starts a sandbox: a run stops before its first episode, or selects none.
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures import write_task
from tests.model_server import MODEL, ScriptedModel, answer


@pytest.fixture
def server() -> Iterator[ScriptedModel]:
    with ScriptedModel(lambda request: answer("ok")) as running:
        yield running


@pytest.fixture
def dataset(pytester: pytest.Pytester) -> Path:
    folder = pytester.path / "tasks"
    write_task(folder, "alpha")
    return folder


def agent_run(pytester: pytest.Pytester, dataset: Path, *args: str) -> pytest.RunResult:
    return pytester.runpytest(
        f"--harbor-dataset={dataset}",
        "--harbor-results-dir=out",
        "--harbor-agent=shell-agent",
        *args,
    )


def test_an_unreachable_endpoint_stops_the_run_before_any_episode(
    pytester: pytest.Pytester, dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HARBOR_MODEL_API_KEY", "k")
    # A port held by a socket that does not listen: refused, and no other test can take it.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"
        result = agent_run(pytester, dataset, "--harbor-model=m", f"--harbor-model-url={url}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"*--harbor-model m at {url}: cannot reach {url}/models: *refused*"]
    )
    assert "passed" not in result.stdout.str()
    assert not (pytester.path / "out/harbor/tasks/latest/rollouts.jsonl").exists()


def test_a_wrong_key_stops_the_run_naming_the_url_and_status(
    pytester: pytest.Pytester, dataset: Path, server: ScriptedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HARBOR_MODEL_API_KEY", "not-the-key")
    result = agent_run(pytester, dataset, *server.options()[1:])
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"*GET {server.url}/models answered 401 Unauthorized: Incorrect API key provided.*"
            "(check the API key*"
        ]
    )
    assert server.requests == []  # no episode asked the model anything


def test_a_model_the_endpoint_does_not_list_stops_the_run(
    pytester: pytest.Pytester, dataset: Path, server: ScriptedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HARBOR_MODEL_API_KEY", server.api_key)
    result = agent_run(
        pytester, dataset, "--harbor-model=gpt-imaginary", f"--harbor-model-url={server.url}"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"*{server.url}/models does not list the model 'gpt-imaginary'; it lists: {MODEL}*"]
    )


def test_a_base_url_without_v1_gets_a_hint(
    pytester: pytest.Pytester, dataset: Path, server: ScriptedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HARBOR_MODEL_API_KEY", server.api_key)
    bare = server.url.removesuffix("/v1")
    result = agent_run(pytester, dataset, f"--harbor-model={MODEL}", f"--harbor-model-url={bare}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*GET {bare}/models answered 404*should end in /v1*"])


def test_an_unset_key_variable_is_a_usage_error_naming_it(
    pytester: pytest.Pytester, dataset: Path, server: ScriptedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MY_KEY", raising=False)
    result = agent_run(
        pytester, dataset, *server.options()[1:], "--harbor-model-api-key-env=MY_KEY"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--harbor-model-api-key-env: the variable MY_KEY is not set*"])


def test_a_model_harness_without_a_model_is_a_usage_error(
    pytester: pytest.Pytester, dataset: Path
) -> None:
    result = agent_run(pytester, dataset, "--harbor-model=m")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--harbor-agent shell-agent talks to a model: give --harbor-model-url*"]
    )


def test_a_key_on_the_command_line_is_accepted_with_a_warning(
    pytester: pytest.Pytester, dataset: Path, server: ScriptedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HARBOR_MODEL_API_KEY", raising=False)
    result = agent_run(
        pytester,
        dataset,
        *server.options()[1:],
        f"--harbor-model-api-key={server.api_key}",
        "-k",
        "no-such-task",
    )
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.stdout.fnmatch_lines(["*--harbor-model-api-key: other users of this machine can read*"])
    assert server.model_list_requests == 1  # the endpoint check went through with that key
    assert server.api_key not in result.stdout.str() + result.stderr.str()


def test_model_options_for_a_harness_without_a_model_are_warned_about(
    pytester: pytest.Pytester, dataset: Path
) -> None:
    result = pytester.runpytest(
        f"--harbor-dataset={dataset}", "--harbor-model=m", "--harbor-model-url=http://x/v1", "--co"
    )
    result.stdout.fnmatch_lines(
        ["*the model options are not used: the oracle harness talks to no model*"]
    )
    # A budget or a recording with no model to spend on is said to be unused too.
    result = pytester.runpytest(f"--harbor-dataset={dataset}", "--harbor-max-cost=5", "--co")
    result.stdout.fnmatch_lines(
        ["*the model options are not used: the oracle harness talks to no model*"]
    )


def test_spend_options_that_contradict_are_usage_errors(
    pytester: pytest.Pytester, dataset: Path, server: ScriptedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HARBOR_MODEL_API_KEY", server.api_key)
    both = pytester.runpytest(
        f"--harbor-dataset={dataset}",
        *server.options(),
        "--harbor-record=tapes",
        "--harbor-replay=tapes",
    )
    assert both.ret == pytest.ExitCode.USAGE_ERROR
    both.stderr.fnmatch_lines(["*--harbor-record with --harbor-replay*"])
    missing = pytester.runpytest(
        f"--harbor-dataset={dataset}", *server.options(), "--harbor-replay=no-such-folder"
    )
    assert missing.ret == pytest.ExitCode.USAGE_ERROR
    missing.stderr.fnmatch_lines(["*--harbor-replay: */no-such-folder is not a folder*"])
    negative = pytester.runpytest(
        f"--harbor-dataset={dataset}", *server.options(), "--harbor-max-cost=-1"
    )
    assert negative.ret == pytest.ExitCode.USAGE_ERROR
    negative.stderr.fnmatch_lines(["*--harbor-max-cost / harbor_max_cost: must be at least 0*"])
    bad = pytester.runpytest(
        f"--harbor-dataset={dataset}", *server.options(), "--harbor-prices=nothing.toml"
    )
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--harbor-prices: *nothing.toml: cannot read*"])
    (pytester.path / "prices.toml").write_text(
        'date = "2026-12-01"\nsource = "ours"\n[models.m]\ninput = -1\noutput = 1\n'
    )
    table = pytester.runpytest(
        f"--harbor-dataset={dataset}", *server.options(), "--harbor-prices=prices.toml"
    )
    assert table.ret == pytest.ExitCode.USAGE_ERROR
    table.stderr.fnmatch_lines(["*--harbor-prices: *prices.toml: models.m.input: *"])
    unpriced = pytester.runpytest(
        f"--harbor-dataset={dataset}", *server.options(), "--harbor-max-cost=5"
    )
    assert unpriced.ret == pytest.ExitCode.USAGE_ERROR
    unpriced.stderr.fnmatch_lines(
        ["*--harbor-max-cost: the price table has no price for 'scripted-model'*"]
    )


def test_the_manifest_names_the_model_but_not_its_key_and_resume_refuses_another(
    pytester: pytest.Pytester, dataset: Path, server: ScriptedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HARBOR_MODEL_API_KEY", server.api_key)
    # The scripted fake's sandboxes, none of which starts: the run ends with a failure row
    # and no model call (a run that runs nothing keeps no folder to resume).
    pytester.makeconftest(
        "import tests.fake_provider as fake\n"
        "def pytest_harbor_sandbox_providers():\n"
        "    return {'broken': lambda *, options, context: fake.FakeProvider("
        "fake.SandboxScript(start_error='no engine'))}\n"
    )
    params = ["--harbor-model-param=temperature=0.2", "--harbor-model-param=stop=END"]
    first = agent_run(pytester, dataset, *server.options()[1:], *params, "--harbor-sandbox=broken")
    assert first.ret == pytest.ExitCode.TESTS_FAILED
    manifest_file = pytester.path / "out/harbor/tasks/latest/rollouts_manifest.json"
    manifest = json.loads(manifest_file.read_text())
    assert manifest["model"] == {
        "name": MODEL,
        "base_url": server.url,
        "params": {"temperature": 0.2, "stop": "END"},
    }
    assert server.api_key not in manifest_file.read_text()

    again = agent_run(
        pytester,
        dataset,
        *server.options()[1:],
        "--harbor-model-param=temperature=0.7",
        "--harbor-sandbox=broken",
        "--harbor-resume",
    )
    assert again.ret == pytest.ExitCode.USAGE_ERROR
    again.stderr.fnmatch_lines(
        [
            '*model: {"base_url": *"params": {"stop": "END", "temperature": 0.2}} then, *'
            '"params": {"temperature": 0.7}} now*'
        ]
    )


def test_bad_harness_options_are_usage_errors(pytester: pytest.Pytester, dataset: Path) -> None:
    oracle = pytester.runpytest(f"--harbor-dataset={dataset}", "--harbor-agent-option=x=1", "--co")
    assert oracle.ret == pytest.ExitCode.USAGE_ERROR
    oracle.stderr.fnmatch_lines(
        ["*--harbor-agent-option: the oracle harness takes no options, got: x*"]
    )
    shell = pytester.runpytest(
        f"--harbor-dataset={dataset}",
        "--harbor-agent=shell-agent",
        "--harbor-agent-option=max_steps=zero",
        "--co",
    )
    assert shell.ret == pytest.ExitCode.USAGE_ERROR
    shell.stderr.fnmatch_lines(["*shell-agent option max_steps: Input should be a valid integer*"])
    malformed = pytester.runpytest(
        f"--harbor-dataset={dataset}", "--harbor-model-param=oops", "--co"
    )
    malformed.stderr.fnmatch_lines(
        ["*--harbor-model-param / harbor_model_param: expected KEY=VALUE*"]
    )


def test_harnesses_from_the_hook_are_listed_and_a_duplicate_is_refused(
    pytester: pytest.Pytester, dataset: Path
) -> None:
    pytester.makeconftest(
        """
        from pytest_harbor.harnesses import NopHarness

        def pytest_harbor_harnesses():
            return {"quiet": NopHarness}
        """
    )
    unknown = pytester.runpytest(f"--harbor-dataset={dataset}", "--harbor-agent=loud", "--co")
    unknown.stderr.fnmatch_lines(["*unknown harness 'loud'; available: *quiet*"])
    pytester.makeconftest(
        """
        from pytest_harbor.harnesses import NopHarness

        def pytest_harbor_harnesses():
            return {"oracle": NopHarness}
        """
    )
    twice = pytester.runpytest(f"--harbor-dataset={dataset}", "--co")
    assert twice.ret == pytest.ExitCode.USAGE_ERROR
    twice.stderr.fnmatch_lines(["*the harness name 'oracle' is registered twice*"])


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="the message is for Python 3.11")
def test_harbors_agents_on_python_3_11_are_a_usage_error_saying_why(
    pytester: pytest.Pytester, dataset: Path
) -> None:
    result = pytester.runpytest(f"--harbor-dataset={dataset}", "--harbor-agent=harbor:terminus-2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--harbor-agent harbor:terminus-2: Harbor's agents need Python 3.12 or newer*"]
    )
    assert "harbor" not in {name.split(".")[0] for name in sys.modules}
