"""The model relay in whole runs on the real engine: a CLI agent inside the sandbox holds
a token, never the key (a snooping agent reads every environment, process and file it can
and sends it all to its model); a task without the network runs a CLI agent that reaches
the relay and nothing else; a rate limit's cause is what the relay saw; the budget stops
a run that a resume completes; a recorded run replays with the endpoint gone; a replay
miss fails loudly.

The agent is a recipe written here: a shell script that asks the model with the trusted
busybox's wget (no install from the network) and runs the command the answer gives."""

from __future__ import annotations

import base64
import json
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fixtures import BASE_IMAGE, Dataset, run_harbor
from tests.model_server import ChatRequest, Reply, ScriptedModel, answer, error

pytestmark = pytest.mark.docker

ANSWER_TEST = (
    "cat /tmp/answer > /logs/verifier/reward.txt 2>/dev/null "
    "|| echo 0 > /logs/verifier/reward.txt\n"
)

#: Asks the model once with the instruction's first line, prints the answer, and runs the
#: command its content holds. `snoop` first gathers every environment and command line
#: of the sandbox's processes and every file written since its install, and sends them to
#: the model in a second call. `direct URL` tries the URL without the relay.
RELAY_AGENT = r"""#!/bin/sh
BB=/.pytest-harbor/busybox
word=$(head -n 1 "$1")
ask() {
  $BB wget -q -Y off -O - --header "Authorization: Bearer $API_KEY" \
    --header "Content-Type: application/json" --post-file "$1" "$BASE_URL/chat/completions"
}
if [ "$word" = snoop ]; then
  dump=/tmp/dump.txt
  for p in /proc/[0-9]*; do
    cat "$p/environ" "$p/cmdline" 2>/dev/null | tr '\0' '\n'
  done > "$dump"
  env >> "$dump"
  find / \( -path /proc -o -path /sys -o -path /dev \) -prune -o -type f \
    -newer /usr/local/bin/relay-agent -size -2000k -print 2>/dev/null |
    while read -r f; do [ "$f" = "$dump" ] || cat "$f" 2>/dev/null; done >> "$dump"
  $BB base64 "$dump" | tr -d '\n' > /tmp/dump.b64
  { printf '{"model":"%s","messages":[{"role":"user","content":"' "$MODEL"
    cat /tmp/dump.b64; printf '"}]}'; } > /tmp/snoop.json
  ask /tmp/snoop.json > /dev/null || { echo "the snoop call failed" >&2; exit 1; }
fi
case "$word" in
  direct*)
    if $BB timeout 10 $BB wget -q -O - "${word#direct }" >/dev/null 2>&1; then
      echo "reached ${word#direct } without the relay"; exit 0
    fi ;;
esac
printf '{"model":"%s","messages":[{"role":"user","content":"%s"}]}' "$MODEL" "$word" \
  > /tmp/request.json
reply=$(ask /tmp/request.json) || { echo "the model call failed" >&2; exit 1; }
echo "$reply"
command=$(printf '%s' "$reply" | sed -n 's/.*"content": *"\([^"]*\)".*/\1/p')
sh -c "$command"
"""


def script_recipe(folder: Path, name: str, script: str, *, causes: str = "") -> Path:
    """A recipe whose agent is `script` (POSIX sh, installed as /usr/local/bin/NAME and run
    with the instruction file), given the relay's URL, the token and the model in its
    environment; `causes`, a `[causes]` table's lines."""
    path = folder / f"{name}.toml"
    install = (
        f"cat > /usr/local/bin/{name} <<'AGENT'\n"
        + script
        + f"AGENT\nchmod 755 /usr/local/bin/{name}\n"
    )
    lines = [
        f'name = "{name}"',
        'api = "chat-completions"',
        'version = "1.0"',
        "[install]",
        f"script = '''\n{install}'''",
        "timeout_sec = 120",
        "[run]",
        f"command = '{name} {{{{ instruction_file }}}}'",
        "[run.env]",
        'BASE_URL = "{{ model_url }}"',
        'API_KEY = "{{ api_key }}"',
        'MODEL = "{{ model }}"',
    ]
    if causes:
        lines += ["[causes]", causes]
    path.write_text("\n".join(lines) + "\n")
    return path


def relay_recipe(folder: Path, name: str = "relay-agent") -> Path:
    return script_recipe(
        folder, name, RELAY_AGENT, causes='rate_limited = ["the model call failed"]'
    )


def task_toml(extra: str = "") -> str:
    return (
        "[agent]\ntimeout_sec = 120\n[verifier]\ntimeout_sec = 60\n"
        f'[environment]\ndocker_image = "{BASE_IMAGE}"\n{extra}'
    )


@pytest.fixture
def recipe(pytester: pytest.Pytester) -> Path:
    return relay_recipe(pytester.path)


def agent_args(server: ScriptedModel, recipe: Path, *extra: str) -> list[str]:
    return [
        f"--harbor-agent={recipe}",
        f"--harbor-model={server.model}",
        f"--harbor-model-url={server.url}",
        *extra,
    ]


def solving(request: ChatRequest) -> Reply:
    return answer("echo 1 > /tmp/answer")


def rows(pytester: pytest.Pytester, dataset: Dataset) -> dict[str, dict[str, object]]:
    return {
        str(row["task_id"]): row for row in dataset.rows(pytester.path / "out", validation=False)
    }


def pieces(secret: str, size: int = 8) -> list[str]:
    return [secret[start : start + size] for start in range(len(secret) - size + 1)]


def test_a_cli_agent_holds_a_token_never_the_key(
    pytester: pytest.Pytester,
    dataset: Dataset,
    recipe: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The attack: a root agent reads every process's environment and command line, its
    own environment, and every file written in the sandbox since its install, during its
    turn, and sends all of it to the model. No piece of the key is in it, nor in any file
    of the run or its output; the token it holds works at the relay only."""
    dataset.task("snoop", toml=task_toml(), test_sh=ANSWER_TEST, instruction="snoop\n")
    key = "sk-" + secrets.token_hex(24)
    server = ScriptedModel(solving, api_key=key).__enter__()
    request.addfinalizer(lambda: server.__exit__(None, None, None))
    monkeypatch.setenv("HARBOR_MODEL_API_KEY", key)
    result = run_harbor(pytester, dataset, *agent_args(server, recipe))
    result.assert_outcomes(passed=1)
    snooped = [
        base64.b64decode(call.messages[0]["content"]).decode(errors="replace")
        for call in server.requests
        if len(call.messages[0]["content"]) > 100
    ]
    assert len(snooped) == 1
    assert "hbr-" in snooped[0], "the dump holds the agent's token (so it read its env)"
    assert "API_KEY=hbr-" in snooped[0]
    for piece in pieces(key):
        assert piece not in snooped[0], f"a piece of the key in the sandbox: {piece}"
        for path in (pytester.path / "out").rglob("*"):
            if path.is_file():
                assert piece.encode() not in path.read_bytes(), path
        assert piece not in result.stdout.str()
    # Every call reached the endpoint with the key, not the token.
    sent = {
        value
        for call in server.requests
        for name, value in call.headers.items()
        if name.lower() == "authorization"
    }
    assert sent == {f"Bearer {key}"}


def test_a_task_without_the_network_runs_a_cli_agent_through_the_relay_alone(
    pytester: pytest.Pytester,
    dataset: Dataset,
    model_server: Callable[..., ScriptedModel],
    recipe: Path,
) -> None:
    """no-network: the agent reaches its model (and solves the task), but not the
    endpoint itself on this machine, nor the relay's own address, nor the internet."""
    offline = '[environment]\nnetwork_mode = "no-network"\n'
    toml = task_toml().replace("[environment]\n", offline)
    dataset.task("offline", toml=toml, test_sh=ANSWER_TEST, instruction="solve\n")
    server = model_server(solving)
    for target in (f"{server.url}/models", "http://172.17.0.1/", "http://example.com/"):
        dataset.task(
            f"direct-{len(list(dataset.path.iterdir()))}",
            toml=toml,
            test_sh=ANSWER_TEST,
            instruction=f"direct {target}\n",
        )
    result = run_harbor(pytester, dataset, *agent_args(server, recipe))
    found = rows(pytester, dataset)
    assert found["offline"]["reward"] == 1.0, found["offline"]
    for name, row in found.items():
        if name.startswith("direct"):
            # Every direct try failed; the agent then asked the model through the relay.
            assert row["reward"] == 0.0 or "without the relay" not in str(row), row
            stdout = next((pytester.path / "out").rglob(f"{name}__r0/stdout.txt")).read_text()
            assert "without the relay" not in stdout
    assert "skipped" not in result.stdout.str()


def test_a_rate_limit_the_relay_saw_is_retried_and_a_claimed_one_is_scored(
    pytester: pytest.Pytester,
    dataset: Dataset,
    model_server: Callable[..., ScriptedModel],
    recipe: Path,
) -> None:
    """The endpoint answers the first call 429: the relay saw it, so the episode runs
    again (the default policy) and then passes, the given-up attempt's calls counted
    apart. An agent whose output claims a rate limit the relay never saw crashed."""
    dataset.task("limited", toml=task_toml(), test_sh=ANSWER_TEST, instruction="limited\n")
    calls: list[int] = []

    def script(request: ChatRequest) -> Reply:
        calls.append(1)
        if len(calls) == 1:
            return error(429, "slow down", kind="rate_limit_error")
        return solving(request)

    server = model_server(script)
    result = run_harbor(
        pytester,
        dataset,
        *agent_args(server, recipe),
        "--harbor-set=agent_outcome_policy.rate_limited={action: retry, backoff_s: 0}",
    )
    result.assert_outcomes(passed=1)
    # Shown as it happened: the answer the relay passed on, then the episode's retry.
    result.stdout.fnmatch_lines(
        [
            "harbor: limited__r0: model endpoint answered 429: slow down "
            "(passed on to the agent by the model relay)",
            "harbor: limited__r0: model endpoint answered 429: *(episode attempt 1 of 3, "
            "retrying in 0 s in a fresh sandbox)",
        ]
    )
    row = rows(pytester, dataset)["limited"]
    assert row["attempts"] == 2 and row["reward"] == 1.0
    assert row["usage"]["requests"] == 1
    assert row["retried_usage"]["requests"] == 1


def test_an_agent_cannot_claim_a_rate_limit_the_relay_did_not_see(
    pytester: pytest.Pytester,
    dataset: Dataset,
    model_server: Callable[..., ScriptedModel],
    recipe: Path,
) -> None:
    """The agent's call is refused by the relay as another model's (403), and its output
    says `the model call failed`, which the recipe reads as a rate limit: no answer
    showed one, so it is the agent's crash, scored, never retried or dropped."""
    dataset.task("claims", toml=task_toml(), test_sh=ANSWER_TEST, instruction="claims\n")
    server = model_server(solving)
    args = agent_args(server, recipe)
    # The run's model is another one than the server's: the endpoint check must pass,
    # so the agent is made to name a model of its own instead.
    recipe.write_text(recipe.read_text().replace('MODEL = "{{ model }}"', 'MODEL = "gpt-5"'))
    run_harbor(
        pytester, dataset, *args, "--harbor-set=agent_outcome_policy.rate_limited=fail"
    ).assert_outcomes(failed=1)
    row = rows(pytester, dataset)["claims"]
    assert row["failure_cause"] == "agent_crashed"
    assert row["attempts"] == 1
    assert server.requests == []


def test_the_budget_stops_the_run_and_a_resume_completes_it(
    pytester: pytest.Pytester,
    dataset: Dataset,
    model_server: Callable[..., ScriptedModel],
    recipe: Path,
) -> None:
    for name in ("a", "b", "c"):
        dataset.task(name, toml=task_toml(), test_sh=ANSWER_TEST, instruction="solve\n")
    server = model_server(lambda request: answer("echo 1 > /tmp/answer", usage=(900, 200)))
    stopped = run_harbor(pytester, dataset, *agent_args(server, recipe), "--harbor-max-tokens=1000")
    assert stopped.ret != 0
    stopped.stdout.fnmatch_lines(["*the run's budget stopped it: --harbor-max-tokens=1000*"])
    assert len(server.requests) == 1
    kept = dataset.rows(pytester.path / "out", validation=False)
    failures = dataset.failures(pytester.path / "out", validation=False)
    assert len(kept) == 1 and kept[0]["reward"] == 1.0
    assert sorted(str(f["failure_kind"]) for f in failures) == ["harbor:budget_spent"] * 2
    resumed = run_harbor(pytester, dataset, *agent_args(server, recipe), "--harbor-resume")
    resumed.assert_outcomes(passed=2)
    assert sorted(
        str(row["task_id"]) for row in dataset.rows(pytester.path / "out", validation=False)
    ) == ["a", "b", "c"]


def test_a_recorded_run_replays_with_the_endpoint_gone(
    pytester: pytest.Pytester,
    dataset: Dataset,
    model_server: Callable[..., ScriptedModel],
    recipe: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, word in (("one", "solve"), ("two", "fail")):
        dataset.task(name, toml=task_toml(), test_sh=ANSWER_TEST, instruction=f"{word}\n")

    def script(request: ChatRequest) -> Reply:
        said = request.messages[0]["content"]
        return answer("echo 1 > /tmp/answer" if said == "solve" else "echo 0 > /tmp/answer")

    server = model_server(script)
    cassettes = pytester.path / "cassettes"
    args = agent_args(server, recipe)
    run_harbor(pytester, dataset, *args, f"--harbor-record={cassettes}")
    recorded = rows(pytester, dataset)
    stdout = {
        name: next((pytester.path / "out").rglob(f"{name}__r0/stdout.txt")).read_text()
        for name in recorded
    }
    calls = len(server.requests)
    server.__exit__(None, None, None)  # the endpoint is gone
    monkeypatch.delenv("HARBOR_MODEL_API_KEY")
    shutil.rmtree(pytester.path / "out")
    replayed = run_harbor(pytester, dataset, *args, f"--harbor-replay={cassettes}")
    again = rows(pytester, dataset)
    assert {n: r["reward"] for n, r in again.items()} == {
        n: r["reward"] for n, r in recorded.items()
    }
    assert {n: r["usage"] for n, r in again.items()} == {n: r["usage"] for n, r in recorded.items()}
    for name in again:
        path = next((pytester.path / "out").rglob(f"{name}__r0/stdout.txt"))
        assert path.read_text() == stdout[name]
    assert len(server.requests) == calls
    replayed.assert_outcomes(passed=1, failed=1)
    # A changed instruction is a request never recorded: the episode fails loudly.
    (dataset.path / "two" / "instruction.md").write_text("something new\n")
    shutil.rmtree(pytester.path / "out")
    missed = run_harbor(pytester, dataset, *args, f"--harbor-replay={cassettes}", "-k", "two")
    (failure,) = dataset.failures(pytester.path / "out", validation=False)
    assert failure["failure_kind"] == "harbor:replay_miss"
    assert "POST /v1/chat/completions" in str(failure["failure_reason"])
    assert missed.ret != 0
    assert json.dumps(failure)


@pytest.mark.parametrize("network", ["public", "no-network"])
def test_a_compose_tasks_cli_agent_reaches_its_model_through_the_relay(
    pytester: pytest.Pytester,
    dataset: Dataset,
    model_server: Callable[..., ScriptedModel],
    recipe: Path,
    network: str,
) -> None:
    """A Compose task's main service reaches the relay as a lone sandbox does: at this
    machine's address on the project's network, or by the relay's name behind the
    project's egress."""
    mode = "" if network == "public" else 'network_mode = "no-network"\n'
    task = dataset.task(
        "composed",
        toml=task_toml(mode),
        test_sh=ANSWER_TEST,
        instruction="solve\n",
    )
    (task / "environment").mkdir()
    (task / "environment" / "docker-compose.yaml").write_text(
        "services:\n  main: {}\n  side:\n    image: busybox:musl\n"
        "    command: [/bin/busybox, sleep, '600']\n"
    )
    server = model_server(solving)
    run_harbor(pytester, dataset, *agent_args(server, recipe)).assert_outcomes(passed=1)
    assert len(server.requests) == 1
