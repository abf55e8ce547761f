"""Recipes: the shipped ones load, broken ones are named with their field, placeholders are
quoted where they must be, other packages register recipes; the converters turn real logs
of each CLI (captured from the real programs) into valid ATIF trajectories."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from pytest_harbor.engine.admission import model_route_refusal
from pytest_harbor.harnesses import harness_names, make_harness
from pytest_harbor.harnesses.cli_agent import CliAgentHarness
from pytest_harbor.harnesses.converters import ConverterInput, convert
from pytest_harbor.harnesses.recipes import (
    RecipeError,
    find_recipe,
    load_recipe,
    recipe_names,
    render,
)
from pytest_harbor.sandboxes.docker import DockerProvider
from pytest_harbor.tasks import load_task
from tests.fake_provider import FakeProvider

DATA = Path(__file__).parent / "data"

MINIMAL = """\
name = "tiny"
api = "chat-completions"
version = "1.0"
[install]
script = "true"
[run]
command = "tiny-agent {{ instruction_file }}"
"""


def write(tmp_path: Path, text: str, name: str = "tiny.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_shipped_recipes_load_and_say_which_api_they_speak() -> None:
    apis = {name: find_recipe(name).api for name in recipe_names()}  # type: ignore[union-attr]
    assert apis == {
        "claude-code": "anthropic-messages",
        "codex": "responses",
        "mini-swe-agent": "chat-completions",
        "opencode": "chat-completions",
    }
    assert set(apis) <= set(harness_names())
    harness = make_harness("codex")
    assert isinstance(harness, CliAgentHarness) and harness.needs_model


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("1.0", "1 0"), "tiny.toml: version: String should match pattern"),
        (('api = "chat-completions"', 'api = "grpc"'), "tiny.toml: api: Input should be"),
        (("[run]", "[run]\nshell = 'zsh'"), "tiny.toml: run.shell: Extra inputs"),
        (
            ("{{ instruction_file }}", "{{ api_key }}"),
            "tiny.toml: run.command: unknown placeholder {{ api_key }} (the API key reaches "
            "the agent only through its environment",
        ),
        (("{{ instruction_file }}", "{{ istruction }}"), "unknown placeholder {{ istruction }}"),
        (('script = "true"', 'script = "echo {{ model }}"'), "install.script: unknown"),
        (("[run]", "[causes]\nbored = ['x']\n[run]"), "tiny.toml: causes: unknown cause 'bored'"),
        (("[run]", "[causes]\napi_error = ['(']\n[run]"), "api_error: bad pattern"),
        (('name = "tiny"', "name = "), "not valid TOML"),
    ],
)
def test_a_broken_recipe_is_named_with_its_file_and_field(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    path = write(tmp_path, MINIMAL.replace(*change))
    with pytest.raises(RecipeError) as raised:
        load_recipe(path)
    assert str(path) in str(raised.value)
    assert message in str(raised.value)


def test_placeholders_are_quoted_for_the_shell_in_the_command() -> None:
    nasty = "gpt'; rm -rf / #"
    command = render("run -m {{ model }} -t {{model}}", {"model": nasty}, quote=True)
    assert shlex.split(command) == ["run", "-m", nasty, "-t", nasty]
    assert render("{{ model }}", {"model": nasty}, quote=False) == nasty
    # Shell's own braces are left alone.
    assert render("${HOME} {a,b}", {}, quote=True) == "${HOME} {a,b}"


def test_recipe_options_are_checked_and_a_version_makes_its_own_install(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL)
    plain = make_harness(str(path))
    assert isinstance(plain, CliAgentHarness)
    other = make_harness(str(path), {"version": "2.0"})
    assert isinstance(other, CliAgentHarness)
    assert other.recipe.version == "2.0" and other.install_key != plain.install_key
    with pytest.raises(ValueError, match="tiny has no option rebuilt; did you mean rebuild"):
        make_harness(str(path), {"rebuilt": True})


def test_a_recipe_from_another_package_is_found_by_its_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = write(tmp_path, MINIMAL.replace("tiny", "packaged"), "packaged.toml")
    site = tmp_path / "site"
    info = site / "agent_recipes-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: agent-recipes\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[pytest_harbor.recipes]\npackaged = agent_recipes:PATH\n"
    )
    (site / "agent_recipes.py").write_text(f"PATH = {str(recipe)!r}\n")
    monkeypatch.syspath_prepend(str(site))
    assert "packaged" in recipe_names()
    found = find_recipe("packaged")
    assert found is not None and found.name == "packaged"


def test_a_task_without_network_for_its_agent_needs_the_relay(tmp_path: Path) -> None:
    """An in-sandbox agent reaches its model through the relay alone: a phase without the
    network runs it when a relay carries its calls (the plugin always starts one), on a
    provider that can route a sandbox to it; otherwise it is refused, saying why."""
    task = tmp_path / "offline"
    (task / "tests").mkdir(parents=True)
    (task / "instruction.md").write_text("x")
    (task / "tests" / "test.sh").write_text("true")
    (task / "task.toml").write_text(
        '[environment]\ndocker_image = "x"\nnetwork_mode = "no-network"\n'
    )
    harness = make_harness("mini-swe-agent")
    offline = load_task(task)
    assert harness.unavailable_reason(offline) is None
    docker, elsewhere = DockerProvider(), FakeProvider()
    assert model_route_refusal(offline, harness, docker, relayed=True) is None
    reason = model_route_refusal(offline, harness, docker, relayed=False)
    assert reason is not None and "no network" in reason and "relay" in reason
    reason = model_route_refusal(offline, harness, elsewhere, relayed=True)
    assert reason is not None and "cannot reach" in reason
    # A harness that calls its model from this machine needs no route.
    assert model_route_refusal(offline, make_harness("nop"), elsewhere, relayed=True) is None


@pytest.mark.parametrize(
    ("converter", "sample", "call", "answer"),
    [
        ("claude-code", "claude-code-stream.jsonl", "Bash", "done"),
        ("codex", "codex-events.jsonl", "exec_command", "done"),
        ("opencode", "opencode-events.jsonl", "bash", "done"),
    ],
)
def test_real_logs_convert_to_atif(converter: str, sample: str, call: str, answer: str) -> None:
    source = ConverterInput(
        files={},
        stdout=(DATA / sample).read_text(),
        agent=converter,
        version="1",
        model="m",
        session_id="ep/main",
        instruction="Write hello to /app/hello.txt",
    )
    trajectory, note = convert(converter, source)
    assert note is None and trajectory is not None
    steps = trajectory.steps
    assert steps[0].source == "user"
    (first,) = [step for step in steps if step.tool_calls]
    assert first.tool_calls is not None and first.tool_calls[0].function_name == call
    assert "hello" in json.dumps(first.tool_calls[0].arguments)
    assert first.observation is not None
    assert steps[-1].message == answer
    assert trajectory.final_metrics is not None
    assert (trajectory.final_metrics.total_prompt_tokens or 0) > 0


def codex_source(*events: dict[str, object]) -> ConverterInput:
    stdout = "\n".join(json.dumps(event) for event in events)
    return ConverterInput({}, stdout, "codex", "1", "m", "ep/main", "Do it")


def completed(item: object) -> dict[str, object]:
    return {"type": "item.completed", "item": item}


def test_codex_events_become_steps_with_their_reasoning_errors_and_tokens() -> None:
    source = codex_source(
        {"type": "thread.started", "thread_id": "t"},
        completed({"id": "r0", "type": "reasoning", "text": "look first"}),
        completed(
            {
                "id": "c0",
                "type": "command_execution",
                "command": "ls",
                "aggregated_output": "a.txt\n",
                "exit_code": 0,
                "status": "completed",
            }
        ),
        {"type": "item.started", "item": {"id": "c1", "type": "command_execution"}},
        completed("not an item"),
        completed({"type": "reasoning", "text": "now edit"}),
        completed({"type": "file_change", "changes": [{"path": "a.txt"}], "status": "completed"}),
        completed({"id": "e0", "type": "error", "message": "stream disconnected"}),
        {"type": "turn.completed", "usage": {"input_tokens": 100, "cached_input_tokens": 40}},
        completed({"type": "reasoning", "text": "say so"}),
        completed({"id": "m0", "type": "agent_message", "text": "edited"}),
        completed({"id": "x0", "status": "done", "extra": 1}),
        completed({"id": "e1", "type": "error", "message": "retrying"}),
        {"type": "turn.completed", "usage": {"input_tokens": 50, "output_tokens": 5}},
    )
    trajectory, note = convert("codex", source)
    assert note is None and trajectory is not None
    steps = [
        (
            step.source,
            step.message,
            step.reasoning_content,
            [(c.tool_call_id, c.function_name, c.arguments) for c in step.tool_calls or []],
            [result.content for result in (step.observation.results if step.observation else [])],
        )
        for step in trajectory.steps
    ]
    assert steps == [
        ("user", "Do it", None, [], []),
        (
            "agent",
            "",
            "look first",
            [("c0", "exec_command", {"command": "ls"})],
            ["exit code 0\na.txt\n"],
        ),
        (
            "agent",
            "",
            "now edit",
            [("item_2", "file_change", {"changes": [{"path": "a.txt"}], "status": "completed"})],
            ["completed"],
        ),
        ("agent", "edited", "say so", [], []),
        ("agent", "", None, [("x0", "tool", {"status": "done", "extra": 1})], ["done"]),
    ]
    assert trajectory.notes == "stream disconnected; retrying"
    metrics = trajectory.final_metrics
    assert metrics is not None
    assert (metrics.total_prompt_tokens, metrics.total_completion_tokens) == (150, 5)
    assert metrics.total_cached_tokens == 40


def test_codex_events_without_an_item_convert_to_nothing() -> None:
    source = codex_source({"type": "turn.completed", "usage": {"input_tokens": 5}})
    assert convert("codex", source) == (None, "the codex converter found no log to convert")


def test_mini_swe_agent_trajectory_converts_with_tool_results() -> None:
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "task"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"command": "ls"}'},
                }
            ],
            "extra": {"response": {"usage": {"prompt_tokens": 7, "completion_tokens": 3}}},
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
        {"role": "exit", "content": "", "extra": {"exit_status": "Submitted"}},
    ]
    document = {
        "info": {"exit_status": "Submitted", "model_stats": {"instance_cost": 0.5}},
        "messages": messages,
    }
    source = ConverterInput(
        files={"mini-swe-agent.traj.json": json.dumps(document).encode()},
        stdout="",
        agent="mini-swe-agent",
        version="2.4.6",
        model="m",
        session_id="s",
        instruction="task",
    )
    trajectory, note = convert("mini-swe-agent", source)
    assert trajectory is not None and note is None
    assert [step.source for step in trajectory.steps] == ["system", "user", "agent"]
    agent = trajectory.steps[2]
    assert agent.observation is not None and agent.observation.results[0].content == "a.txt"
    assert trajectory.final_metrics is not None
    assert trajectory.final_metrics.total_prompt_tokens == 7
    assert trajectory.final_metrics.total_cost_usd == 0.5
    assert trajectory.notes == "exit status: Submitted"


def test_a_converter_that_fails_leaves_a_note_not_a_crash() -> None:
    source = ConverterInput({}, "not json at all", "x", "1", "m", "s", "task")
    assert convert("claude-code", source) == (
        None,
        "the claude-code converter found no log to convert",
    )
    trajectory, note = convert("no.such.module:convert", source)
    assert trajectory is None and note is not None and "no.such" in note
    trajectory, note = convert("unknown", source)
    assert trajectory is None and note is not None and "built in are" in note


def test_the_shipped_install_scripts_are_valid_sh() -> None:
    for name in recipe_names():
        recipe = find_recipe(name)
        assert recipe is not None
        script = render(recipe.install.script, {"version": recipe.version}, quote=True)
        checked = subprocess.run(["sh", "-n"], input=script, text=True, capture_output=True)
        assert checked.returncode == 0, (name, checked.stderr)
