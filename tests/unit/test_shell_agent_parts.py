"""shell-agent's pure parts: output cut to its cap, tool-call arguments checked."""

from __future__ import annotations

import pytest

from pytest_harbor.harnesses import HarnessOptionsError
from pytest_harbor.harnesses.shell_agent import ShellAgentHarness, _arguments, cut_output


def test_output_within_the_cap_is_whole() -> None:
    assert cut_output(b"abc", 3) == "abc"


def test_longer_output_keeps_head_and_tail() -> None:
    text = cut_output(b"0123456789" * 10, 20)
    assert text == "0123456789\n[... 80 bytes cut ...]\n0123456789"


@pytest.mark.parametrize(
    ("name", "raw", "problem"),
    [
        ("bash", '{"command": "ls"}', None),
        ("bash", {"command": "ls", "timeout_sec": 5}, None),
        ("python", '{"command": "ls"}', "there is no tool 'python'"),
        ("bash", "{broken", "the arguments are not valid JSON"),
        ("bash", "[1, 2]", "the arguments must be a JSON object"),
        ("bash", '{"command": ""}', "`command` is required"),
        ("bash", '{"command": "ls", "timeout_sec": true}', "`timeout_sec` must be a positive"),
        ("bash", '{"command": "ls", "timeout_sec": -1}', "`timeout_sec` must be a positive"),
        ("bash", '{"command": "ls", "cwd": "/"}', "unknown argument(s) cwd"),
    ],
)
def test_tool_call_arguments(name: str, raw: object, problem: str | None) -> None:
    _, found = _arguments(name, raw)
    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert found.startswith(problem)


def test_unknown_options_are_refused_by_name() -> None:
    with pytest.raises(
        HarnessOptionsError,
        match=r"^shell-agent has no option max_stepz; did you mean max_steps\?$",
    ):
        ShellAgentHarness({"max_stepz": 3})
    # Nothing near: the options it takes are named.
    with pytest.raises(
        HarnessOptionsError,
        match=r"^shell-agent has no option turns; it takes backoff_base_s, backoff_max_s, ",
    ):
        ShellAgentHarness({"turns": 3})
    assert ShellAgentHarness({"max_steps": 3}).options.max_steps == 3
