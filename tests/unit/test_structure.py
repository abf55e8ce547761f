"""Structural guarantees: what the plugin loads at import, where names are registered,
that whatever writes text must be given the run's redactor, and that logs go through the
logger that escapes them."""

from __future__ import annotations

import inspect
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import pytest_harbor
from pytest_harbor import registry
from pytest_harbor.engine.harness_calls import call_harness
from pytest_harbor.registry import NameTaken, Registry
from pytest_harbor.writers import RolloutsWriter
from pytest_harbor.writers.manifest import RunManifest
from pytest_harbor.writers.summary import write_run_summary

#: Loaded only when a run needs them: a harness's trajectory, a model client, the HTML
#: report, Compose, the docker provider, the CLI agents' recipes, check mode, YAML, the
#: model endpoint's check.
NOT_AT_IMPORT = [
    "pytest_harbor.harnesses.atif",
    "httpx",
    "pytest_harbor.report",
    "pytest_harbor.sandboxes.compose.project",  # (compose.tasks only asks whether a
    "pytest_harbor.sandboxes.compose.model",  # task is one)
    "pytest_harbor.sandboxes.compose.source",
    "pytest_harbor.sandboxes.docker",  # at pytest_configure, by the run's provider
    "pytest_harbor.harnesses.recipes",
    "pytest_harbor.plugin.checks",
    "yaml",  # settings given as text, a config file
    "urllib.request",  # the model endpoint's check, a registry
    "pytest_harbor.datasets.resolve",  # datasets by reference
    "pytest_harbor.datasets.git",
]


def test_importing_the_plugin_loads_only_what_every_run_needs() -> None:
    code = (
        "import sys, pytest_harbor.plugin\n"
        f"print([name for name in {NOT_AT_IMPORT!r} if name in sys.modules])"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == "[]"


def _no_entry_points(**_: Any) -> Any:
    raise AssertionError("entry points were read")


def test_a_registry_reads_entry_points_only_when_a_name_needs_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(registry, "entry_points", _no_entry_points)
    names: Registry[int] = Registry("thing", "pytest_harbor.things", {"one": 1})
    assert names.admit([], "pytest_things") == {}
    assert names.find("one") == 1
    assert names.find("two", {"two": 2}) == 2
    with pytest.raises(NameTaken, match="the thing name 'one' is registered twice"):
        names.admit([{"one": 3}], "pytest_things")
    with pytest.raises(NameTaken, match="'two' is registered twice"):
        names.admit([{"two": 2}, {"two": 2}], "pytest_things")
    with pytest.raises(AssertionError, match="entry points were read"):
        names.find("three")  # neither built in nor given: only an installed package is left


def test_a_built_in_table_is_made_on_first_use() -> None:
    made: list[int] = []

    def table() -> dict[str, int]:
        made.append(1)
        return {"one": 1}

    names: Registry[int] = Registry("thing", "pytest_harbor.things", table)
    assert made == []
    assert names.find("one") == names.find("one") == 1
    assert made == [1]


@pytest.mark.parametrize(
    "function",
    [RolloutsWriter.__init__, write_run_summary, RunManifest.write, call_harness],
    ids=["RolloutsWriter", "write_run_summary", "RunManifest.write", "call_harness"],
)
def test_whatever_writes_text_must_be_given_the_redactor(function: Callable[..., Any]) -> None:
    """A forgotten redactor is a TypeError (and a mypy error), never "mask nothing"."""
    parameter = inspect.signature(function).parameters["redactor"]
    assert parameter.default is inspect.Parameter.empty


def test_the_docker_provider_of_one_engine_loads_no_fleet_and_no_compose() -> None:
    code = (
        "import sys\n"
        "from pytest_harbor.sandboxes import make_provider\n"
        "make_provider('docker', {})\n"
        "print([name for name in ('pytest_harbor.sandboxes.docker.fleet', "
        "'pytest_harbor.sandboxes.compose.project', 'pytest_harbor.sandboxes.compose.model', "
        "'pytest_harbor.sandboxes.compose.source') if name in sys.modules])"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == "[]"


def test_every_module_logs_through_the_logger_that_escapes() -> None:
    """A logger of its own would print what a sandbox said raw (display.harbor_logger)."""
    package = Path(pytest_harbor.__file__).parent
    own = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if "getLogger(" in path.read_text() and path.name != "display.py"
    ]
    assert own == []
