"""A hostile CLI agent against the model relay in whole runs on the real engine, from a
sandbox without the network (it reaches the relay through its egress, by the relay's
name): it tries to call another model with the run's key, to get calls served that the
relay does not count or that the run's budget should have stopped.

The agent is a recipe written here, a shell script using the trusted busybox's wget."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fixtures import Dataset, run_harbor
from tests.integration.test_model_relay import (
    ANSWER_TEST,
    agent_args,
    rows,
    script_recipe,
    task_toml,
)
from tests.model_server import ScriptedModel, answer

pytestmark = pytest.mark.docker

#: `slash`: three calls of another model at `chat/completions/`, the answer's command
#: run. `expect`: three calls of the run's model sent with `Expect: 100-continue`, each
#: answer collected by a `GET models` after it, the last answer's command run.
HOSTILE_AGENT = r"""#!/bin/sh
BB=/.pytest-harbor/busybox
word=$(head -n 1 "$1")
get() {
  $BB wget -q -Y off -O "$1" --header "Authorization: Bearer $API_KEY" "$2" 2>/dev/null
}
post() {
  $BB wget -q -Y off -O "$1" --header "Authorization: Bearer $API_KEY" \
    --header "Content-Type: application/json" $3 --post-file /tmp/request.json "$2" 2>/dev/null
}
case "$word" in
  slash)
    printf '{"model":"gpt-5-expensive","messages":[{"role":"user","content":"solve"}]}' \
      > /tmp/request.json
    for i in 1 2 3; do post /tmp/reply "$BASE_URL/chat/completions/"; done ;;
  expect)
    printf '{"model":"%s","messages":[{"role":"user","content":"solve"}]}' "$MODEL" \
      > /tmp/request.json
    for i in 1 2 3; do
      post /tmp/ignored "$BASE_URL/chat/completions" "--header Expect:100-continue"
      get /tmp/reply "$BASE_URL/models"
    done ;;
esac
cat /tmp/reply
command=$(sed -n 's/.*"content": *"\([^"]*\)".*/\1/p' /tmp/reply)
sh -c "$command"
"""


def hostile_recipe(folder: Path) -> Path:
    return script_recipe(folder, "hostile-agent", HOSTILE_AGENT)


OFFLINE = task_toml().replace("[environment]\n", '[environment]\nnetwork_mode = "no-network"\n')


@pytest.mark.parametrize("word", ["slash", "expect"])
def test_an_offline_agent_gets_no_call_past_the_relay_s_model_check_books_and_budget(
    pytester: pytest.Pytester,
    dataset: Dataset,
    model_server: Callable[..., ScriptedModel],
    word: str,
) -> None:
    """Each answer costs 1100 tokens and the run's cap is 1000: the first call may be
    served, no other. `slash` names another model at a path the relay does not take for
    a model call; `expect` has the relay take the endpoint's `100 Continue` for the
    answer and collects the real one on an uncounted `GET models`."""
    dataset.task(word, toml=OFFLINE, test_sh=ANSWER_TEST, instruction=f"{word}\n")
    server = model_server(lambda request: answer("echo 1 > /tmp/answer", usage=(600, 500)))
    recipe = hostile_recipe(pytester.path)
    run_harbor(pytester, dataset, *agent_args(server, recipe), "--harbor-max-tokens=1000")
    row = rows(pytester, dataset).get(word, {})
    served = [request.body.get("model") for request in server.requests]
    usage = row.get("usage") or {}
    assert set(served) <= {server.model}, f"the endpoint served {served}; the row: {usage}"
    assert len(served) <= 1, f"{len(served)} calls served under a 1000-token cap: {usage}"
    if not row:
        # A call refused for the budget leaves the episode without a result.
        (failure,) = dataset.failures(pytester.path / "out", validation=False)
        assert failure["failure_kind"] == "harbor:budget_spent", failure
        return
    counted = int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0))
    assert counted == 1100 * len(served), f"served {served}, the row counted {usage}"
