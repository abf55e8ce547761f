"""shell-agent against a scripted Chat Completions server on 127.0.0.1, in real sandboxes:
solving, failing, rate limits, malformed tool calls, an agent that never stops, an endpoint
that hangs, a context overflow, history across steps, and the key never shown."""

from __future__ import annotations

import json
import shlex
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_harbor import load_task
from pytest_harbor.harnesses.atif import Trajectory
from tests.fixtures import BASE_IMAGE, QUICKSTART, Dataset, Server, multi_step, run_harbor
from tests.model_server import ChatRequest, Reply, ScriptedModel, answer, error, tool_call

pytestmark = pytest.mark.docker


@pytest.fixture
def dataset(harbor_dataset: Dataset) -> Dataset:
    return harbor_dataset


def solving(commands: dict[str, str], final: str = "Done.") -> Callable[[ChatRequest], Reply]:
    """Answers a task's instruction with the command for it, then ends the turn."""

    def script(request: ChatRequest) -> Reply:
        if request.last["role"] == "user":
            return tool_call(commands.get(request.last["content"], "echo 'no idea'"))
        return answer(final)

    return script


def agent_run(
    pytester: pytest.Pytester, dataset: Dataset, server: ScriptedModel, *args: str
) -> pytest.RunResult:
    return run_harbor(pytester, dataset, *server.options(*args))


def rows(pytester: pytest.Pytester, dataset: Dataset) -> list[dict[str, object]]:
    return dataset.rows(pytester.path / "out", validation=False)


def toml(agent: float = 60, extra: str = "") -> str:
    return (
        f"[agent]\ntimeout_sec = {agent}\n[verifier]\ntimeout_sec = 30\n"
        f'[environment]\ndocker_image = "{BASE_IMAGE}"\n{extra}'
    )


def test_shell_agent_solves_every_quickstart_task(
    pytester: pytest.Pytester, model_server: Server
) -> None:
    folder = pytester.path / "quickstart"
    shutil.copytree(QUICKSTART, folder)
    commands = {}
    for task_dir in sorted(path for path in folder.iterdir() if (path / "task.toml").exists()):
        turn = load_task(task_dir).turns[0]
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in turn.solution_env.items())
        commands[turn.instruction] = exports + (task_dir / "solution" / "solve.sh").read_text()
    server = model_server(solving(commands, final="All done: the task is complete."))
    result = agent_run(pytester, Dataset(folder), server, "-n", "2")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(
        [
            "*quickstart: 4 episodes, mean reward 1.000*",
            "*model usage: 880 prompt + 120 completion tokens in 8 requests*",
        ]
    )
    found = rows(pytester, Dataset(folder))
    assert len(found) == 4
    for row in found:
        assert (row["agent"], row["model"], row["reward"]) == ("shell-agent", "scripted-model", 1.0)
        assert row["response"] == "All done: the task is complete."
        assert row["usage"] == {
            "prompt_tokens": 220,
            "completion_tokens": 30,
            "requests": 2,
            "cost_usd": None,
        }
        assert row["timings"]["agent_s"] > 0
        # The agent's own trajectory reached the verifier: valid ATIF with the tool call
        # and what it printed.
        written = Path(str(row["verifier_logs_dir"])) / "trajectory.json"
        trajectory = Trajectory.model_validate_json(written.read_text())
        sources = [step.source for step in trajectory.steps]
        assert sources == ["system", "user", "agent", "agent"]
        # Kept with the agent's files too (the verifier's copy is the earlier place).
        agent_dir = Path(str(row["turns"][0]["agent_logs_dir"]))  # type: ignore[index]
        assert agent_dir.parent.parent.name == "agent" or agent_dir.parent.name == "agent"
        assert (agent_dir / "trajectory.json").read_bytes() == written.read_bytes()
        acting = trajectory.steps[2]
        assert acting.tool_calls is not None and acting.tool_calls[0].function_name == "bash"
        assert acting.observation is not None
        assert acting.observation.results[0].content.startswith("exit code: 0")  # type: ignore[union-attr]
        assert trajectory.final_metrics is not None
        assert trajectory.final_metrics.total_prompt_tokens == 220
    summary = Dataset(folder).summary(pytester.path / "out", validation=False)
    assert summary["model"]["name"] == "scripted-model"
    assert summary["usage"]["requests"] == 8
    # Every request offered exactly the one tool and reached the endpoint with the key
    # as a bearer token (the model relay's; the agent held a token of its episode).
    for request in server.requests:
        assert [tool["function"]["name"] for tool in request.body["tools"]] == ["bash"]
        headers = {name.lower(): value for name, value in request.headers.items()}
        assert headers["authorization"] == f"Bearer {server.api_key}"


def test_an_agent_that_does_nothing_scores_zero(
    pytester: pytest.Pytester, dataset: Dataset, model_server: Server
) -> None:
    dataset.task("hello")
    server = model_server(lambda request: answer("I would rather not."))
    result = agent_run(pytester, dataset, server)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*agent's answer: I would rather not.*"])
    (row,) = rows(pytester, dataset)
    assert (row["reward"], row["failure_kind"], row["failure_cause"]) == (
        0.0,
        "harbor:reward_invalid",
        None,
    )
    assert row["response"] == "I would rather not."


def test_rate_limits_are_waited_out_as_retry_after_says(
    pytester: pytest.Pytester, dataset: Dataset, model_server: Server
) -> None:
    dataset.task("hello")

    def script(request: ChatRequest) -> Reply:
        if request.number < 2:
            return error(429, "Rate limit reached", code="rate_limit_exceeded", retry_after="1")
        return solving({"Write 1 to /tmp/answer.\n": "echo 1 > /tmp/answer"})(request)

    server = model_server(script)
    agent_run(pytester, dataset, server).assert_outcomes(passed=1)
    (row,) = rows(pytester, dataset)
    assert (row["reward"], row["failure_kind"]) == (1.0, None)
    assert row["usage"]["requests"] == 4  # type: ignore[index]
    times = [request.at for request in server.requests]
    assert times[1] - times[0] >= 1.0 and times[2] - times[1] >= 1.0


def test_a_malformed_tool_call_is_answered_and_the_agent_recovers(
    pytester: pytest.Pytester, dataset: Dataset, model_server: Server
) -> None:
    dataset.task("hello")

    def script(request: ChatRequest) -> Reply:
        results = request.tool_results
        if not results:
            return tool_call(raw_arguments='{"command": "echo 1 > /tmp/answer"')  # cut short
        if len(results) == 1:
            return tool_call("echo 1 > /tmp/answer")
        return answer("Fixed it.")

    server = model_server(script)
    agent_run(pytester, dataset, server).assert_outcomes(passed=1)
    first_result = server.requests[1].tool_results[0]
    assert first_result.startswith("error: the arguments are not valid JSON")
    (row,) = rows(pytester, dataset)
    trajectory = json.loads((Path(str(row["verifier_logs_dir"])) / "trajectory.json").read_text())
    broken = trajectory["steps"][2]["tool_calls"][0]
    assert broken["arguments"] == {}
    assert broken["extra"]["raw_arguments"] == '{"command": "echo 1 > /tmp/answer"'


def test_an_agent_that_never_stops_is_cut_off_and_verified(
    pytester: pytest.Pytester, dataset: Dataset, model_server: Server
) -> None:
    dataset.task("busy", toml=toml(agent=3))
    server = model_server(lambda request: tool_call("echo 1 > /tmp/answer; sleep 0.2"))
    result = agent_run(pytester, dataset, server)
    result.assert_outcomes(passed=1)
    (row,) = rows(pytester, dataset)
    assert (row["reward"], row["failure_kind"], row["failure_cause"]) == (
        1.0,
        "agent_timeout",
        "timeout",
    )
    assert row["timings"]["agent_s"] < 15
    assert row["usage"]["requests"] >= 3  # type: ignore[index]


def test_an_endpoint_that_hangs_cannot_hold_the_episode(
    pytester: pytest.Pytester, dataset: Dataset, model_server: Server
) -> None:
    dataset.task("hello", toml=toml(agent=3))

    def script(request: ChatRequest) -> Reply:
        if request.tool_results:
            return Reply(delay_s=60, body=answer("late").body)
        return tool_call("echo 1 > /tmp/answer")

    server = model_server(script)
    agent_run(pytester, dataset, server).assert_outcomes(passed=1)
    (row,) = rows(pytester, dataset)
    assert row["failure_kind"] == "agent_timeout"
    assert row["timings"]["agent_s"] < 15


def test_a_context_overflow_is_classified_and_verified(
    pytester: pytest.Pytester, dataset: Dataset, model_server: Server
) -> None:
    dataset.task("long-talk")

    def script(request: ChatRequest) -> Reply:
        if len(request.tool_results) < 2:
            return tool_call("seq 1 100000")
        return error(
            400,
            "This model's maximum context length is 8192 tokens. However, you requested "
            "9100 tokens in the messages. Please reduce the length of the messages.",
        )

    server = model_server(script)
    result = agent_run(pytester, dataset, server, "--harbor-agent-option=max_output_bytes=1000")
    result.assert_outcomes(failed=1)
    (row,) = rows(pytester, dataset)
    assert (row["failure_cause"], row["failure_kind"]) == (
        "context_length_exceeded",
        "harbor:reward_invalid",  # verified: the verifier's own finding comes first
    )
    # The agent's own failure is kept beside the verifier's finding.
    (note,) = row["turns"][0]["notes"]  # type: ignore[index]
    assert note.startswith("the agent failed (context_length_exceeded): the context overflowed")
    assert "maximum context length is 8192 tokens" in note
    # The long output was cut to the cap, head and tail kept.
    output = server.requests[1].tool_results[0]
    assert "bytes cut ...]" in output
    assert output.startswith("exit code: 0\n1\n2\n") and output.rstrip().endswith("100000")
    assert len(output.encode()) < 1200


def test_a_context_overflow_with_a_sound_verifier_keeps_the_cause_as_the_kind(
    pytester: pytest.Pytester, dataset: Dataset, model_server: Server
) -> None:
    dataset.task(
        "overflow",
        test_sh="if [ -e /tmp/answer ]; then cat /tmp/answer; else echo 0; fi "
        "> /logs/verifier/reward.txt\n",
    )
    server = model_server(
        lambda request: error(
            400, "prompt too big", code="context_length_exceeded", kind="invalid_request_error"
        )
    )
    agent_run(pytester, dataset, server).assert_outcomes(failed=1)
    (row,) = rows(pytester, dataset)
    assert (row["reward"], row["failure_kind"], row["failure_cause"]) == (
        0.0,
        "agent_context_length_exceeded",
        "context_length_exceeded",
    )
    assert "prompt too big" in str(row["failure_reason"])
    assert len(server.requests) == 1  # not retried


def test_a_continued_session_carries_its_history_across_steps(
    pytester: pytest.Pytester, dataset: Dataset, model_server: Server
) -> None:
    multi_step(
        dataset,
        "two-steps",
        {"01-a": ("true", None), "02-b": ("true", None)},
    )

    def script(request: ChatRequest) -> Reply:
        if request.last["role"] == "user":
            return tool_call(f"echo '{request.last['content'].strip()}' >> /work/log")
        return answer("ok")

    server = model_server(script)
    agent_run(pytester, dataset, server, "--harbor-set=turn_sessions=continue").assert_outcomes(
        passed=2
    )
    second_turn = [r for r in server.requests if r.instructions[-1] == "Do 02-b.\n"]
    assert second_turn and all(r.instructions == ["Do 01-a.\n", "Do 02-b.\n"] for r in second_turn)
    # The first turn's whole exchange is in the history the second turn sends.
    assert [m["role"] for m in second_turn[0].messages][:5] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    # With fresh sessions (the default) each step starts over.
    server.requests.clear()
    agent_run(pytester, dataset, server).assert_outcomes(passed=2)
    assert all(len(r.instructions) == 1 for r in server.requests)


def test_the_api_key_never_appears_in_files_junit_or_terminal(
    pytester: pytest.Pytester, dataset: Dataset, model_server: Server
) -> None:
    """An adversarial endpoint puts the key everywhere it can: in commands, in the answer,
    in a file the verifier prints, in error bodies."""
    dataset.task(
        "leaky",
        test_sh="cat /logs/agent/key.txt; echo 0 > /logs/verifier/reward.txt\n",
    )
    dataset.task("erring")
    server: ScriptedModel

    def script(request: ChatRequest) -> Reply:
        key = server.api_key
        if request.instructions[0].startswith("Leak"):
            if request.last["role"] == "user":
                return tool_call(f"echo {key}; echo {key} > /logs/agent/key.txt")
            return answer(f"the key is {key}")
        return error(500, f"internal error for Bearer {key}")

    server = model_server(script)
    (dataset.path / "leaky" / "instruction.md").write_text("Leak what you can.\n")
    junit = pytester.path / "junit.xml"
    result = agent_run(
        pytester,
        dataset,
        server,
        f"--junitxml={junit}",
        "-rA",
        "--harbor-agent-option=max_request_attempts=1",
        "--harbor-set=agent_outcome_policy.api_error={action: retry, retries: 1, backoff_s: 0}",
    )
    result.assert_outcomes(failed=1, errors=1)
    key = server.api_key
    shown = result.stdout.str() + result.stderr.str()
    assert "***" in shown  # the failing report did show what the verifier printed
    assert key not in shown
    assert key not in junit.read_text()
    written = [path for path in (pytester.path / "out").rglob("*") if path.is_file()]
    assert written
    for path in written:
        assert key.encode() not in path.read_bytes(), path
    (failure,) = dataset.failures(pytester.path / "out", validation=False)
    assert failure["failure_kind"] == "agent_api_error"
    assert "internal error for Bearer ***" in str(failure["failure_reason"])


@pytest.mark.parametrize("cap", [1, 2])
def test_model_requests_in_flight_are_capped_across_workers(
    pytester: pytest.Pytester, dataset: Dataset, model_server: Server, cap: int
) -> None:
    for name in ("a", "b", "c", "d"):
        dataset.task(name)
    in_flight = most = 0
    lock = threading.Lock()
    solve = solving({"Write 1 to /tmp/answer.\n": "echo 1 > /tmp/answer"})

    def script(request: ChatRequest) -> Reply:
        nonlocal in_flight, most
        with lock:
            in_flight += 1
            most = max(most, in_flight)
        time.sleep(0.3)
        with lock:
            in_flight -= 1
        return solve(request)

    server = model_server(script)
    agent_run(
        pytester, dataset, server, "-n", "2", f"--harbor-model-concurrency={cap}"
    ).assert_outcomes(passed=4)
    assert most == cap


def test_the_key_never_enters_the_sandbox(
    pytester: pytest.Pytester, dataset: Dataset, model_server: Server
) -> None:
    """A model that goes looking for the key in the sandbox finds nothing: shell-agent
    calls the endpoint from the host and passes no credentials into the sandbox."""
    dataset.task("snoop")
    looking = (
        "env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; "
        "grep -rs Bearer /logs /tmp /root /etc 2>/dev/null | head; echo 1 > /tmp/answer"
    )
    server = model_server(solving({"Write 1 to /tmp/answer.\n": looking}))
    agent_run(pytester, dataset, server).assert_outcomes(passed=1)
    (seen,) = server.requests[1].tool_results
    assert "HOSTNAME=" in seen  # the command did print the environment
    assert server.api_key not in seen
    assert "HARBOR_MODEL_API_KEY" not in seen


def test_the_verifier_reads_the_agents_own_trajectory(
    pytester: pytest.Pytester, dataset: Dataset, model_server: Server
) -> None:
    dataset.task(
        "graded-on-process",
        test_sh=(
            'grep -q \'"schema_version": "ATIF-v1.7"\' /logs/agent/trajectory.json'
            ' && grep -q \'"function_name": "bash"\' /logs/agent/trajectory.json'
            " && grep -q 'echo 1 > /tmp/answer' /logs/agent/trajectory.json"
            " && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"
        ),
    )
    server = model_server(solving({"Write 1 to /tmp/answer.\n": "echo 1 > /tmp/answer"}))
    agent_run(pytester, dataset, server).assert_outcomes(passed=1)
