"""The Python example of docs/python-api.md runs as written."""

from __future__ import annotations

import re

import pytest

from tests.fixtures import REPO_ROOT

pytestmark = pytest.mark.docker

PAGE = REPO_ROOT / "docs" / "python-api.md"


def test_python_example_runs(
    docker_client: object, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (example,) = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.DOTALL)
    monkeypatch.chdir(REPO_ROOT)
    exec(compile(example, str(PAGE), "exec"), {})
    printed = capsys.readouterr().out
    assert '"reward": 1.0' in printed
