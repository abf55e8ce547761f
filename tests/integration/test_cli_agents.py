"""CLI agents inside the sandbox, installed by their recipes and run against scripted model
servers on 127.0.0.1 (the sandboxes on the host network): the shipped mini-swe-agent and
codex recipes end to end, and recipes written here for the contract's edges (timeouts that
leave processes behind, crashes, silence, install failures, the install cache)."""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.anthropic_server import MODEL as CLAUDE_MODEL
from tests.anthropic_server import MessagesRequest, ScriptedMessages, bash, text
from tests.fixtures import BASE_IMAGE, REPO_ROOT, Dataset, run_harbor
from tests.model_server import ChatRequest, Reply, ScriptedModel, answer, tool_call
from tests.responses_server import MODEL as RESPONSES_MODEL
from tests.responses_server import ResponsesRequest, ScriptedResponses, message, shell_call

pytestmark = pytest.mark.docker

HOST_NETWORK = "--harbor-set=sandbox_provider_options.network=host"
ANSWER_TEST = (
    "cat /tmp/answer > /logs/verifier/reward.txt 2>/dev/null "
    "|| echo 0 > /logs/verifier/reward.txt\n"
)


@pytest.fixture
def dataset(harbor_dataset: Dataset) -> Dataset:
    return harbor_dataset


@pytest.fixture
def install_images(docker_client: docker.DockerClient) -> Iterator[list[str]]:
    """Install images a test makes for recipes of its own: removed afterwards (the shipped
    recipes' images stay, as the cache later tests and runs use)."""
    made: list[str] = []
    yield made
    for image in made:
        for found in docker_client.images.list(filters={"label": f"pytest-harbor.agent={image}"}):
            with contextlib.suppress(docker.errors.APIError):
                docker_client.images.remove(found.id, force=True)


def task_toml(agent: float = 120, extra: str = "") -> str:
    return (
        f"[agent]\ntimeout_sec = {agent}\n[verifier]\ntimeout_sec = 60\n"
        f'[environment]\ndocker_image = "{BASE_IMAGE}"\n{extra}'
    )


def agent_args(server: ScriptedModel, agent: str, *extra: str) -> list[str]:
    return [
        f"--harbor-agent={agent}",
        "--harbor-model=scripted-model",
        f"--harbor-model-url={server.url}",
        *extra,
    ]


def results(pytester: pytest.Pytester, dataset: Dataset) -> Path:
    return dataset.results_folder(pytester.path / "out", validation=False)


def every_file(folder: Path) -> Iterator[Path]:
    return (path for path in folder.rglob("*") if path.is_file())


def solved(
    pytester: pytest.Pytester, dataset: Dataset, api_key: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """After a run in which the agent wrote the answer and said so: its row, checked, and
    the first tool call of its converted trajectory; the key is in no file of the run."""
    row = dataset.rows(pytester.path / "out", validation=False)[0]
    assert row["reward"] == 1.0 and row["failure_cause"] is None
    assert row["response"] == "The answer is written."
    document = json.loads(next(results(pytester, dataset).rglob("trajectory.json")).read_text())
    calls = [c for step in document["steps"] for c in step.get("tool_calls") or []]
    for path in every_file(pytester.path / "out"):
        assert api_key.encode() not in path.read_bytes(), path
    return row, calls[0]


# ---------------------------------------------------------------- mini-swe-agent, end to end


def mini_solving(command: str) -> Callable[[ChatRequest], Reply]:
    """mini-swe-agent's loop: run the command, then submit (its signal to stop)."""

    def script(request: ChatRequest) -> Reply:
        done = len(request.tool_results)
        if done == 0:
            return tool_call(command)
        if done == 1:
            return tool_call("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
        return answer("done")

    return script


def test_mini_swe_agent_solves_a_task_from_inside_the_sandbox(
    pytester: pytest.Pytester, dataset: Dataset, model_server: Callable[..., ScriptedModel]
) -> None:
    dataset.task(
        "write-answer",
        toml=task_toml(),
        test_sh=ANSWER_TEST,
        instruction="Write 1 to /tmp/answer.\n",
    )
    server = model_server(mini_solving("echo 1 > /tmp/answer"))
    run_harbor(pytester, dataset, *agent_args(server, "mini-swe-agent")).assert_outcomes(passed=1)

    assert "Write 1 to /tmp/answer." in json.dumps(server.requests[0].body["messages"])
    row = dataset.rows(pytester.path / "out", validation=False)[0]
    assert row["reward"] == 1.0
    assert row["usage"]["prompt_tokens"] == 200 and row["usage"]["requests"] == 2
    folder = results(pytester, dataset)
    kept = list(folder.rglob("mini-swe-agent.traj.json"))
    assert kept, "the recipe keeps the agent's own trajectory"
    trajectories = [p for p in folder.rglob("trajectory.json") if "mini" not in p.name]
    converted = [json.loads(p.read_text()) for p in trajectories]
    calls = [
        call["arguments"]
        for document in converted
        for step in document["steps"]
        for call in step.get("tool_calls") or []
    ]
    assert {"command": "echo 1 > /tmp/answer"} in calls
    for path in every_file(pytester.path / "out"):
        assert server.api_key.encode() not in path.read_bytes(), path


# ---------------------------------------------------------------- claude-code, end to end


def test_claude_code_solves_a_task_over_the_messages_api(
    pytester: pytest.Pytester, dataset: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset.task(
        "write-answer",
        toml=task_toml(),
        test_sh=ANSWER_TEST,
        instruction="Write 1 to /tmp/answer.\n",
    )

    def script(request: MessagesRequest) -> tuple[list[dict[str, object]], str]:
        if "Bash" not in request.tools:
            return text("ok")
        if not request.tool_results:
            return bash("echo 1 > /tmp/answer")
        return text("The answer is written.")

    with ScriptedMessages(script) as server:
        monkeypatch.setenv("HARBOR_MODEL_API_KEY", server.api_key)
        run_harbor(
            pytester,
            dataset,
            "--harbor-agent=claude-code",
            f"--harbor-model={CLAUDE_MODEL}",
            f"--harbor-model-url={server.url}",
        ).assert_outcomes(passed=1)
    assert any("Write 1 to /tmp/answer." in request.text for request in server.requests)
    row, call = solved(pytester, dataset, server.api_key)
    assert row["usage"]["prompt_tokens"] >= 200
    assert call["function_name"] == "Bash"
    assert call["arguments"]["command"] == "echo 1 > /tmp/answer"


# ---------------------------------------------------------------- codex and opencode, end to end


def test_codex_solves_a_task_over_the_responses_api(
    pytester: pytest.Pytester, dataset: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset.task("write-answer", toml=task_toml(), test_sh=ANSWER_TEST)

    def script(request: ResponsesRequest) -> dict[str, object]:
        if not request.outputs:
            return shell_call(request, "echo 1 > /tmp/answer")
        return message("The answer is written.")

    with ScriptedResponses(script) as server:
        monkeypatch.setenv("HARBOR_MODEL_API_KEY", server.api_key)
        run_harbor(
            pytester,
            dataset,
            "--harbor-agent=codex",
            f"--harbor-model={RESPONSES_MODEL}",
            f"--harbor-model-url={server.url}",
        ).assert_outcomes(passed=1)
    assert any("Write 1 to /tmp/answer." in request.text for request in server.requests)
    row, call = solved(pytester, dataset, server.api_key)
    assert row["usage"]["prompt_tokens"] == 200
    assert "echo 1 > /tmp/answer" in call["arguments"]["command"]


def test_opencode_solves_a_task_over_streamed_chat_completions(
    pytester: pytest.Pytester, dataset: Dataset, model_server: Callable[..., ScriptedModel]
) -> None:
    dataset.task("write-answer", toml=task_toml(), test_sh=ANSWER_TEST)

    def script(request: ChatRequest) -> Reply:
        if not request.body.get("tools"):
            return answer("A title")
        if not request.tool_results:
            return tool_call("echo 1 > /tmp/answer")
        return answer("The answer is written.")

    server = model_server(script)
    run_harbor(pytester, dataset, *agent_args(server, "opencode")).assert_outcomes(passed=1)
    assert all(request.body.get("stream") for request in server.requests)
    _, call = solved(pytester, dataset, server.api_key)
    assert call["function_name"] == "bash"
    assert call["arguments"]["command"] == "echo 1 > /tmp/answer"


# ---------------------------------------------------------------- the documented example

CURL_AGENT = REPO_ROOT / "docs" / "examples" / "curl-agent.toml"


def test_the_recipe_written_from_scratch_in_the_docs_solves_a_task(
    pytester: pytest.Pytester,
    dataset: Dataset,
    model_server: Callable[..., ScriptedModel],
    install_images: list[str],
) -> None:
    dataset.task("write-answer", toml=task_toml(), test_sh=ANSWER_TEST)
    install_images.append("curl-agent@1.0")

    def script(request: ChatRequest) -> Reply:
        if not request.tool_results:
            return tool_call("echo 1 > /tmp/answer")
        return answer("Written.")

    server = model_server(script)
    run_harbor(pytester, dataset, *agent_args(server, str(CURL_AGENT))).assert_outcomes(passed=1)
    row = dataset.rows(pytester.path / "out", validation=False)[0]
    assert row["reward"] == 1.0 and row["response"] == "Written."
    assert row["usage"]["prompt_tokens"] == 220
    folder = results(pytester, dataset)
    assert next(folder.rglob("curl-agent.messages.json"))
    document = json.loads(next(folder.rglob("trajectory.json")).read_text())
    sources = [step["source"] for step in document["steps"]]
    assert sources == ["user", "agent", "agent"]
    assert document["steps"][1]["observation"]["results"][0]["content"] == ""


def test_the_docs_show_the_example_recipe_as_it_is() -> None:
    page = (REPO_ROOT / "docs" / "run-a-cli-agent.md").read_text()
    assert CURL_AGENT.read_text().strip() in page


# ---------------------------------------------------------------- recipes written here

#: A fake CLI agent: what it does depends on the instruction's first word.
FAKE_AGENT = r"""#!/bin/sh
case "$(head -n 1 "$1")" in
  solve) echo "solving"; echo 1 > /tmp/answer ;;
  crash) echo "something broke" >&2; exit 3 ;;
  silent) exit 0 ;;
  ratelimit) echo "RateLimitError: 429 from the endpoint" >&2; exit 1 ;;
  key) echo "my key is $AGENT_KEY"; [ "$AGENT_KEY" = "$2" ] && echo 1 > /tmp/answer ;;
  linger)
    # Leaves a detached loop behind that forges the answer, then hangs.
    setsid sh -c 'while true; do echo 1 > /tmp/answer; sleep 0.1; done' </dev/null >/dev/null 2>&1 &
    sleep 300 ;;
esac
"""


def write_recipe(
    folder: Path,
    name: str,
    *,
    install: str | None = None,
    command: str = "fake-agent {{ instruction_file }} sk-scripted-test-key",
) -> Path:
    """A recipe file for the fake agent (or for `install`, when given)."""
    if install is None:
        install = (
            "cat > /usr/local/bin/fake-agent <<'AGENT'\n"
            + FAKE_AGENT
            + "AGENT\nchmod 755 /usr/local/bin/fake-agent\n"
            + "date +%s%N > /usr/local/share/fake-agent-installed\n"
        )
    path = folder / f"{name}.toml"
    lines = [
        f'name = "{name}"',
        'api = "chat-completions"',
        'version = "1.0"',
        "[install]",
        f"script = '''\n{install}'''",
        "timeout_sec = 120",
        "[run]",
        f"command = '''{command}'''",
        "[run.env]",
        'AGENT_KEY = "{{ api_key }}"',
        "[causes]",
        'rate_limited = ["RateLimitError"]',
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def fake_run(
    pytester: pytest.Pytester,
    dataset: Dataset,
    server: ScriptedModel,
    recipe: Path,
    *extra: str,
) -> pytest.RunResult:
    return run_harbor(pytester, dataset, *agent_args(server, str(recipe), *extra))


def rows_by_task(pytester: pytest.Pytester, dataset: Dataset) -> dict[str, dict[str, object]]:
    return {
        str(row["task_id"]): row for row in dataset.rows(pytester.path / "out", validation=False)
    }


def test_failures_of_a_cli_agent_have_their_causes(
    pytester: pytest.Pytester,
    dataset: Dataset,
    model_server: Callable[..., ScriptedModel],
    install_images: list[str],
) -> None:
    """Non-zero exit: agent_crashed (or the recipe's pattern's cause); no output at all:
    agent_crashed; the agent's environment holds the episode's token, never the key,
    which no file of the results holds either; the default policy verifies what the
    agent left."""
    for word in ("solve", "crash", "silent", "key"):
        dataset.task(word, toml=task_toml(), test_sh=ANSWER_TEST, instruction=f"{word}\n")
    recipe = write_recipe(pytester.path, "fake-causes")
    install_images.append("fake-causes@1.0")
    server = model_server(lambda request: answer("unused"))
    fake_run(pytester, dataset, server, recipe).assert_outcomes(passed=1, failed=3)

    rows = rows_by_task(pytester, dataset)
    assert rows["solve"]["reward"] == 1.0 and rows["solve"]["failure_cause"] is None
    # The agent holds the episode's token, never the endpoint's key.
    assert rows["key"]["reward"] == 0.0
    assert rows["crash"]["failure_cause"] == "agent_crashed"
    assert "exited 3: something broke" in str(
        rows["crash"]["turns"][0]["failure_reason"] or ""
    ) or (rows["crash"]["turns"][0]["agent_exit_code"] == 3)
    assert rows["silent"]["failure_cause"] == "agent_crashed"
    for path in every_file(pytester.path / "out"):
        assert server.api_key.encode() not in path.read_bytes(), path
    stdout = next((pytester.path / "out").rglob("key__r0/stdout.txt")).read_text()
    assert "my key is hbr-" in stdout


def test_a_cause_the_agents_output_claims_is_recorded_but_scored(
    pytester: pytest.Pytester,
    dataset: Dataset,
    model_server: Callable[..., ScriptedModel],
    install_images: list[str],
) -> None:
    """The CLI's output carries what the agent's commands print: an agent that prints a
    rate-limit error and makes its CLI exit non-zero must neither get a fresh try (a
    retry) nor leave the score (no result), whatever the policy says."""
    dataset.task("limited", toml=task_toml(), test_sh=ANSWER_TEST, instruction="ratelimit\n")
    recipe = write_recipe(pytester.path, "fake-limited")
    install_images.append("fake-limited@1.0")
    server = model_server(lambda request: answer("unused"))
    for policy in ("fail", "retry"):
        fake_run(
            pytester,
            dataset,
            server,
            recipe,
            f"--harbor-set=agent_outcome_policy.rate_limited={policy}",
        ).assert_outcomes(failed=1)
        (row,) = dataset.rows(pytester.path / "out", validation=False)
        assert (row["reward"], row["mask_sample"], row["attempts"]) == (0.0, False, 1)
        # No answer the relay passed on showed a rate limit: the claim is a crash.
        assert row["failure_cause"] == "agent_crashed"
        assert "which no answer the model relay passed on showed" in str(
            row["turns"][0]["failure_reason"]
        )
        assert dataset.failures(pytester.path / "out", validation=False) == []
        shutil.rmtree(pytester.path / "out")


def test_an_agent_out_of_time_loses_every_process_it_started(
    pytester: pytest.Pytester,
    dataset: Dataset,
    model_server: Callable[..., ScriptedModel],
    install_images: list[str],
) -> None:
    """The attack: the CLI leaves a detached root loop forging the answer and hangs. At
    its timeout the CLI and the loop are killed, then the verifier (which removes the
    answer and looks again) runs; without the kill the loop would write it back."""
    test_sh = (
        "rm -f /tmp/answer; sleep 1\n"
        "if [ -e /tmp/answer ]; then echo forged; echo 0; else echo 1; fi "
        "> /logs/verifier/reward.txt\n"
    )
    dataset.task("linger", toml=task_toml(agent=3), test_sh=test_sh, instruction="linger\n")
    recipe = write_recipe(pytester.path, "fake-linger")
    install_images.append("fake-linger@1.0")
    server = model_server(lambda request: answer("unused"))
    fake_run(pytester, dataset, server, recipe).assert_outcomes(passed=1)
    row = rows_by_task(pytester, dataset)["linger"]
    assert row["reward"] == 1.0
    assert row["failure_cause"] == "timeout"
    assert row["turns"][0]["agent_timed_out"] is True


def test_an_install_that_fails_is_the_agents_failure(
    pytester: pytest.Pytester,
    dataset: Dataset,
    model_server: Callable[..., ScriptedModel],
    install_images: list[str],
) -> None:
    dataset.task("any", toml=task_toml(), test_sh=ANSWER_TEST, instruction="solve\n")
    recipe = write_recipe(
        pytester.path, "fake-broken", install="echo 'no route to the registry' >&2\nexit 7\n"
    )
    install_images.append("fake-broken@1.0")
    server = model_server(lambda request: answer("unused"))
    fake_run(
        pytester, dataset, server, recipe, "--harbor-set=agent_outcome_policy.agent_crashed=fail"
    ).assert_outcomes(errors=1)
    failure = dataset.failures(pytester.path / "out", validation=False)[0]
    assert failure["failure_kind"] == "agent_crashed"
    assert "cannot install the agent" in str(failure["failure_reason"])
    assert "no route to the registry" in str(failure["failure_reason"])


def test_the_install_image_is_made_once_and_again_on_request(
    pytester: pytest.Pytester,
    dataset: Dataset,
    model_server: Callable[..., ScriptedModel],
    install_images: list[str],
    docker_client: docker.DockerClient,
) -> None:
    dataset.task("solve", toml=task_toml(), test_sh=ANSWER_TEST, instruction="solve\n")
    recipe = write_recipe(pytester.path, "fake-cached")
    install_images.append("fake-cached@1.0")
    server = model_server(lambda request: answer("unused"))

    def install_image() -> docker.models.images.Image:
        (found,) = docker_client.images.list(
            filters={"label": "pytest-harbor.agent=fake-cached@1.0"}
        )
        return found

    fake_run(pytester, dataset, server, recipe).assert_outcomes(passed=1)
    first = install_image()
    assert first.labels["pytest-harbor.cache"] == "layer"
    assert len(first.labels["pytest-harbor.content-hash"]) == 64
    assert all(server.api_key not in entry for entry in first.attrs["Config"].get("Env") or [])
    fake_run(pytester, dataset, server, recipe).assert_outcomes(passed=1)
    assert install_image().id == first.id, "a second run uses the cached install"
    fake_run(
        pytester, dataset, server, recipe, "--harbor-agent-option=rebuild=true"
    ).assert_outcomes(passed=1)
    again = install_image()
    assert again.id != first.id, "rebuild=true makes it again"
    assert again.attrs["RootFS"]["Layers"] != first.attrs["RootFS"]["Layers"], (
        "the install ran again (not the builder's cached step)"
    )
    timings = dataset.rows(pytester.path / "out", validation=False)[0]["timings"]
    assert timings["agent_install_s"] is not None


def test_a_broken_recipe_is_named_with_its_field(
    pytester: pytest.Pytester, dataset: Dataset, model_server: Callable[..., ScriptedModel]
) -> None:
    dataset.task("any", toml=task_toml(), test_sh=ANSWER_TEST)
    recipe = write_recipe(
        pytester.path, "fake-leaky", command="fake-agent {{ instruction_file }} {{ api_key }}"
    )
    server = model_server(lambda request: answer("unused"))
    result = fake_run(pytester, dataset, server, recipe)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{recipe}: run.command: unknown placeholder {{{{ api_key }}}}*"])


# ---------------------------------------------------------------- the sandboxes' network


def test_the_host_network_refuses_a_task_that_must_go_without_it(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task(
        "offline",
        toml='[environment]\ndocker_image = "debian:bookworm-slim"\nnetwork_mode = "no-network"\n',
    )
    dataset.task("online")
    result = run_harbor(pytester, dataset, HOST_NETWORK)
    result.assert_outcomes(passed=1, errors=1)
    (failure,) = dataset.failures(pytester.path / "out")
    assert failure["failure_kind"] == "harbor:task_refused"
    assert "sandbox_provider_options.network" in str(failure["failure_reason"])


def test_an_unknown_provider_option_is_refused(pytester: pytest.Pytester, dataset: Dataset) -> None:
    dataset.task("any")
    result = run_harbor(pytester, dataset, "--harbor-set=sandbox_provider_options.colour=red")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*sandbox_provider_options*network*not: colour*"])


def test_a_retry_after_a_failed_install_installs_again(
    pytester: pytest.Pytester,
    dataset: Dataset,
    model_server: Callable[..., ScriptedModel],
    install_images: list[str],
) -> None:
    """The install image cannot be made the first time only (a registry hiccup, played by
    the provider refusing once): the policy's retry asks for it again, and the episode
    passes on its second attempt."""
    marker = pytester.path / "failed-once"
    dataset.task("any", toml=task_toml(), test_sh=ANSWER_TEST, instruction="solve\n")
    flaky = (
        "cat > /usr/local/bin/fake-agent <<'AGENT'\n" + FAKE_AGENT + "AGENT\n"
        "chmod 755 /usr/local/bin/fake-agent\n"
    )
    recipe = write_recipe(pytester.path, "fake-flaky", install=flaky)
    install_images.append("fake-flaky@1.0")
    server = model_server(lambda request: answer("unused"))
    from pytest_harbor.sandboxes import docker as docker_provider

    real = docker_provider.DockerProvider.prepare_layer

    def once_broken(self: object, layer: object) -> str:
        if not marker.exists():
            marker.write_text("1")
            from pytest_harbor.sandboxes import SandboxStartError

            raise SandboxStartError("the registry did not answer")
        return real(self, layer)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(docker_provider.DockerProvider, "prepare_layer", once_broken)
        fake_run(
            pytester,
            dataset,
            server,
            recipe,
            "--harbor-set=agent_outcome_policy.agent_crashed="
            "{action: retry, retries: 1, backoff_s: 0}",
            # The episode makes the install itself (no pool making it ahead).
            "--harbor-set=image_build_concurrency=0",
        ).assert_outcomes(passed=1)
    row = dataset.rows(pytester.path / "out", validation=False)[0]
    assert row["reward"] == 1.0 and row["attempts"] == 2


def test_each_task_image_gets_its_own_install(
    pytester: pytest.Pytester,
    dataset: Dataset,
    model_server: Callable[..., ScriptedModel],
    install_images: list[str],
    built_images: list[Path],
) -> None:
    """One recipe on two task images: each episode runs on its own image with the agent
    installed (the install image of one is never taken for the other)."""
    check = (
        "if [ {test} /marker ] && [ -x /usr/local/bin/fake-agent ]; then echo 1; else echo 0; fi"
        " > /logs/verifier/reward.txt\n"
    )
    dataset.task(
        "plain", toml=task_toml(), test_sh=check.format(test="! -e"), instruction="solve\n"
    )
    marked = dataset.task(
        "marked",
        toml="[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = 60\n",
        dockerfile=f"FROM {BASE_IMAGE}\nRUN echo {dataset.name} > /marker\n",
        test_sh=check.format(test="-e"),
        instruction="solve\n",
    )
    built_images.append(marked / "environment")
    recipe = write_recipe(pytester.path, "fake-two-images")
    install_images.append("fake-two-images@1.0")
    server = model_server(lambda request: answer("unused"))
    fake_run(pytester, dataset, server, recipe).assert_outcomes(passed=2)
