"""What the `harbor:` harnesses take from Harbor by name: the private names they rely on
(private.py, the only module that reaches them) and the exception types that classify an
agent's failure (causes.py). Checked against the installed Harbor in `.venv-harbor` (a
Harbor release that renames one fails here, not in a run), and, where Harbor is absent,
the rules that need no Harbor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import pytest_harbor
from pytest_harbor.agent_outcomes import AGENT_CAUSES
from pytest_harbor.harnesses.harbor_agents import HARBOR_VERSIONS
from pytest_harbor.harnesses.harbor_agents.causes import CAUSES, CRASHED, cause_of
from pytest_harbor.harnesses.harbor_agents.private import (
    RELIED_ON,
    HarborApiMissing,
    PrivateName,
)
from tests.harbor_agents import HARBOR_PYTHON, needs_harbor

PACKAGE = Path(pytest_harbor.__file__).parent

#: Run by Harbor's Python: every name of private.py and of causes.py looked up in the
#: installed Harbor, and the model's key variable for the agents the suite runs. LiteLLM's
#: exceptions are read from its source: importing LiteLLM takes seconds.
PROBE = """
import ast, importlib, importlib.util, json
from pathlib import Path
from pytest_harbor.harnesses.harbor_agents import private
from pytest_harbor.harnesses.harbor_agents.causes import CAUSES
from pytest_harbor.harnesses.harbor_agents.harness import _model_env

missing = []
for name in private.RELIED_ON:
    try:
        name.resolve()
    except private.HarborApiMissing as error:
        missing.append(str(error))
litellm = Path(importlib.util.find_spec("litellm").origin).parent
defined = {
    node.name
    for node in ast.walk(ast.parse((litellm / "exceptions.py").read_text()))
    if isinstance(node, ast.ClassDef)
}
for path in CAUSES:
    module, _, name = path.partition(":")
    if module == "litellm.exceptions":
        found = name in defined
    else:
        kind = getattr(importlib.import_module(module), name, None)
        found = isinstance(kind, type) and issubclass(kind, BaseException)
    if not found:
        missing.append(path)
print(json.dumps({
    "missing": missing,
    "openai": _model_env("openai", "KEY", "http://model/v1"),
    "anthropic": _model_env("anthropic", "KEY", "http://model/v1"),
    "unnamed": private.key_variable("no-such-provider"),
}))
"""


@pytest.fixture(scope="module")
def installed() -> dict[str, Any]:
    done = subprocess.run(
        [str(HARBOR_PYTHON), "-c", PROBE],
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return found


@needs_harbor()
def test_the_installed_harbor_has_every_name_the_adapter_relies_on(
    installed: dict[str, Any],
) -> None:
    assert installed["missing"] == []


@needs_harbor()
def test_the_models_key_goes_only_to_the_variable_of_the_agents_provider(
    installed: dict[str, Any],
) -> None:
    # terminus-2 and agents by import path: OpenAI's; claude-code: Anthropic's.
    assert installed["openai"] == {"OPENAI_API_KEY": "KEY", "OPENAI_BASE_URL": "http://model/v1"}
    assert installed["anthropic"] == {"ANTHROPIC_API_KEY": "KEY"}
    assert installed["unnamed"] == "OPENAI_API_KEY"


def test_a_name_harbor_lacks_is_an_error_that_names_it() -> None:
    gone = PrivateName("harbor_gone.agents", "Factory._load", "load an agent")
    with pytest.raises(HarborApiMissing) as raised:
        gone.resolve()
    assert isinstance(raised.value, ImportError)  # a usage error for --harbor-agent
    assert "has no harbor_gone.agents.Factory._load" in str(raised.value)
    assert "to load an agent" in str(raised.value)
    assert f"install Harbor {HARBOR_VERSIONS}" in str(raised.value)


def test_only_private_py_reaches_harbors_private_names() -> None:
    needles = {
        name.path.rsplit(".", 1)[-1] if "._" in f".{name.path}" else name.module
        for name in RELIED_ON
    }
    assert "_merge_env" in needles and "harbor.agents.agent_auth_resolution" in needles
    private = PACKAGE / "harnesses" / "harbor_agents" / "private.py"
    reaching = [
        (str(path.relative_to(PACKAGE)), needle)
        for path in PACKAGE.rglob("*.py")
        if path != private
        for needle in needles
        if needle in path.read_text()
    ]
    assert reaching == []


def test_the_causes_are_the_engines() -> None:
    assert set(CAUSES.values()) <= set(AGENT_CAUSES)
    assert CRASHED in AGENT_CAUSES
    assert all(path.count(":") == 1 for path in CAUSES)


def test_an_exception_is_classified_by_its_exact_type(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand-ins for LiteLLM's module, as loaded by an agent that raised from it."""

    class RateLimitError(Exception):
        pass

    class APIError(Exception):
        pass

    class Narrower(RateLimitError):
        pass

    module = types.ModuleType("litellm.exceptions")
    module.RateLimitError = RateLimitError  # type: ignore[attr-defined]
    module.APIError = APIError  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "litellm.exceptions", module)
    assert cause_of(RateLimitError()) == "rate_limited"
    assert cause_of(APIError()) == "api_error"
    assert cause_of(Narrower()) == CRASHED  # a type the table does not name
    assert cause_of(RuntimeError("the probe agent broke down")) == CRASHED

    class OtherRateLimitError(Exception):
        """Another library's error of the same kind: no name matching."""

    assert cause_of(OtherRateLimitError()) == CRASHED
