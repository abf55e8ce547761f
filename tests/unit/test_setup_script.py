""".ci/setup's Docker CLI plugins (Compose v2 and buildx) in each mode, run against a stand-in
docker CLI: the main set-up installs them where it can and goes on with a warning where it
cannot; the tests' set-up stops; and where both answer, nothing is installed."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.fixtures import REPO_ROOT

#: A docker CLI whose engine answers and has every image; its plugins answer when
#: FAKE_PLUGINS is set.
FAKE_DOCKER = """#!/bin/sh
case "$1 $2" in
  "info "*|"image inspect") exit 0 ;;
  "version --format") echo 20.10.24 ;;
  "buildx version") [ -n "$FAKE_PLUGINS" ] || exit 1; echo "github.com/docker/buildx 0.13.1 x" ;;
  "compose version") [ -n "$FAKE_PLUGINS" ] || exit 1; echo 2.26.1 ;;
  *) exit 1 ;;
esac
"""


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of the set-up script beside a virtualenv it takes as made (at either level)."""
    root = tmp_path / "checkout"
    (root / ".ci").mkdir(parents=True)
    shutil.copy(REPO_ROOT / ".ci" / "setup", root / ".ci" / "setup")
    shutil.copy(REPO_ROOT / "pyproject.toml", root / "pyproject.toml")
    digest = hashlib.sha256((root / "pyproject.toml").read_bytes()).hexdigest()
    _executable(root / ".venv" / "bin" / "python", "#!/bin/sh\nexit 0\n")
    (root / ".venv" / ".pytest-harbor-setup").write_text(f"{digest} tests\n")
    (root / ".venv-harbor").mkdir()
    (root / ".venv-harbor" / ".pytest-harbor-setup").write_text(f"{digest}\n")
    return root


def _setup(
    checkout: Path, *args: str, uid: int, plugins: bool = False
) -> subprocess.CompletedProcess[str]:
    tools = checkout / "bin"
    _executable(tools / "docker", FAKE_DOCKER)
    _executable(tools / "id", f"#!/bin/sh\necho {uid}\n")
    # No Debian mirror answers: trixie's packages cannot be fetched.
    _executable(tools / "apt-get", "#!/bin/sh\necho 'mirror unreachable' >&2\nexit 100\n")
    environment = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}"}
    environment.pop("FAKE_PLUGINS", None)
    if plugins:
        environment["FAKE_PLUGINS"] = "1"
    return subprocess.run(
        [str(checkout / ".ci" / "setup"), *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
    )


@pytest.mark.parametrize("uid", [1000, 0], ids=["not-root", "no-mirror"])
def test_the_main_set_up_goes_on_without_the_plugins_and_says_what_runs_lack(
    checkout: Path, uid: int
) -> None:
    done = _setup(checkout, uid=uid)
    assert done.returncode == 0, done.stderr
    why = "needs root" if uid else "cannot download trixie's docker-buildx"
    assert why in done.stderr
    assert "warning: no Docker Compose v2 (`docker compose`): Compose tasks will not start" in (
        done.stderr
    )
    assert "warning: no docker buildx: task images build with the classic builder only" in (
        done.stderr
    )
    assert "ready to run datasets: Docker 20.10.24, Compose absent, buildx absent" in done.stderr


@pytest.mark.parametrize("uid", [1000, 0], ids=["not-root", "no-mirror"])
def test_the_tests_set_up_stops_without_the_plugins(checkout: Path, uid: int) -> None:
    done = _setup(checkout, "--tests", uid=uid)
    assert done.returncode == 1
    assert "docker compose does not answer v2" in done.stderr
    assert "ready" not in done.stderr


def test_the_main_set_up_installs_nothing_where_both_plugins_answer(checkout: Path) -> None:
    done = _setup(checkout, uid=1000, plugins=True)
    assert done.returncode == 0, done.stderr
    assert "installing" not in done.stderr
    assert "warning" not in done.stderr
    assert "ready to run datasets: Docker 20.10.24, Compose 2.26.1, buildx 0.13.1," in done.stderr


def test_the_main_set_up_gives_the_virtualenv_the_agents_extra(checkout: Path) -> None:
    """shell-agent needs httpx and the MCP SDK: a virtualenv the main set-up made with the
    package alone (an earlier set-up's) is given the agents extra."""
    digest = hashlib.sha256((checkout / "pyproject.toml").read_bytes()).hexdigest()
    stamp = checkout / ".venv" / ".pytest-harbor-setup"
    stamp.write_text(f"{digest} core\n")
    asked = checkout / "pip-args"
    _executable(checkout / ".venv" / "bin" / "python", f'#!/bin/sh\necho "$@" >> {asked}\n')
    done = _setup(checkout, uid=1000, plugins=True)
    assert done.returncode == 0, done.stderr
    assert "-m pip install -q -e .[agents]" in asked.read_text()
    assert stamp.read_text() == f"{digest} run\n"
    # Made once: the next set-up installs nothing.
    asked.unlink()
    assert _setup(checkout, uid=1000, plugins=True).returncode == 0
    assert not asked.exists() or "pip install" not in asked.read_text()
