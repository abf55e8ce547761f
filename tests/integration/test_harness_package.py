"""A harness from a separately installed package, end to end: the example of
docs/write-a-harness.md, installed with pip and found through its entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures import REPO_ROOT, Dataset, install_example

pytestmark = pytest.mark.docker

PACKAGE = REPO_ROOT / "docs" / "examples" / "fenced-bash-harness"

INSTRUCTION = """\
Write 1 to /tmp/answer.

```bash
echo 1 > /tmp/answer
```
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example package installed with pip (its own folder, not this virtualenv)."""
    target = install_example(PACKAGE, tmp_path_factory)
    assert list(target.glob("harbor_fenced_bash-1.0.0.dist-info/entry_points.txt"))
    return target


def test_a_harness_from_an_installed_package_runs_end_to_end(
    installed: Path, tmp_path: Path, docker_client: object
) -> None:
    dataset = Dataset(tmp_path / "fenced")
    dataset.path.mkdir()
    dataset.task("hello", instruction=INSTRUCTION)
    dataset.task("no-blocks", instruction="Do it somehow.\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            f"--harbor-dataset={dataset.path}",
            "--harbor-agent=fenced-bash",
            "-rA",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(installed)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SKIPPED" in done.stdout and "the instruction has no ```bash block" in done.stdout
    (row,) = dataset.rows(tmp_path / "results", validation=False)
    assert (row["agent"], row["reward"], row["response"]) == ("fenced-bash", 1.0, "ran 1 block(s)")
    trajectory = json.loads((Path(row["verifier_logs_dir"]) / "trajectory.json").read_text())
    assert trajectory["agent"]["name"] == "fenced-bash"
    assert trajectory["steps"][1]["tool_calls"][0]["arguments"] == {
        "command": "echo 1 > /tmp/answer\n"
    }
    log = tmp_path / "results/harbor/fenced/latest/agent/hello__r0/fenced-bash.log"
    assert log.read_text() == "$ block 1 exited 0\n"
