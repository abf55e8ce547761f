"""The README's Python example runs as written."""

from __future__ import annotations

import re

import pytest

from tests.fixtures import REPO_ROOT

pytestmark = pytest.mark.docker


def test_python_example_runs(
    docker_client: object, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    (example,) = re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
    monkeypatch.chdir(REPO_ROOT)
    exec(compile(example, "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert '"reward": 1.0' in printed
