"""Sandbox providers from the `pytest_harbor_sandbox_providers` hook: the run makes its
provider from the factory a conftest.py registers, with the options and the run's context;
a name given twice is a usage error. None of these starts a container."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures import write_task
from tests.model_server import ScriptedModel, answer

#: A provider whose sandboxes never start: enough to see the run use it, without an engine.
PROVIDER = """
import json
from pathlib import Path

from pytest_harbor.sandboxes import ImageConfig, SandboxCapabilities, SandboxStartError


class Unstartable:
    name = "unstartable"
    capabilities = SandboxCapabilities()

    def prepare_image(self, source):
        return source.docker_image

    def image_config(self, image):
        return ImageConfig()

    def prepare_layer(self, layer):
        return layer.base

    def start(self, spec):
        raise SandboxStartError(f"unstartable sandboxes never start ({spec.image})")

    def remove_labelled(self, labels):
        return 0

    def labelled(self, key):
        return []

    def remove(self, sandbox_id):
        pass

    def remove_image(self, image):
        pass


def unstartable(*, options, context):
    made = {"options": dict(options), "run": context.run_id, "worker": context.is_worker}
    Path("made.json").write_text(json.dumps(made))
    return Unstartable()
"""


@pytest.fixture
def dataset(pytester: pytest.Pytester) -> Path:
    dataset = pytester.path / "tasks"
    write_task(dataset, "plain")
    write_task(
        dataset,
        "gpu",
        toml='[environment]\ndocker_image = "debian:bookworm-slim"\ngpus = 1\n',
    )
    return dataset


def test_a_provider_from_the_hook_is_made_with_its_options_and_used(
    pytester: pytest.Pytester, dataset: Path
) -> None:
    pytester.makeconftest(
        PROVIDER + "\n\ndef pytest_harbor_sandbox_providers():\n"
        '    return {"unstartable": unstartable}\n'
    )
    result = pytester.runpytest(
        f"--harbor-dataset={dataset}",
        "--harbor-sandbox=unstartable",
        "--harbor-set=sandbox_provider_options={colour: blue, size: 3}",
        "--harbor-results-dir=out",
        "--harbor-skip-unloadable",
        "-rA",
    )
    result.stdout.fnmatch_lines(["*unstartable sandboxes never start (debian:bookworm-slim)*"])
    made = json.loads((pytester.path / "made.json").read_text())
    manifest = json.loads(
        (pytester.path / "out/harbor/validation/tasks/latest/rollouts_manifest.json").read_text()
    )
    assert made == {
        "options": {"colour": "blue", "size": 3},
        "run": manifest["run_id"],
        "worker": False,
    }
    assert manifest["sandbox"] == "unstartable"
    # A task needing what the provider's capabilities lack is refused at collection.
    skipped = json.loads(
        (pytester.path / "out/harbor/validation/tasks/latest/skipped.json").read_text()
    )
    assert "the unstartable sandbox has no GPUs to give" in json.dumps(skipped)
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_an_unknown_provider_names_those_the_hook_registered(
    pytester: pytest.Pytester, dataset: Path
) -> None:
    pytester.makeconftest(
        PROVIDER + "\n\ndef pytest_harbor_sandbox_providers():\n"
        '    return {"unstartable": unstartable}\n'
    )
    result = pytester.runpytest(f"--harbor-dataset={dataset}", "--harbor-sandbox=nope", "--co")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*--harbor-sandbox: unknown sandbox provider 'nope'; "
            "available: docker, opensandbox, unstartable"
        ]
    )


@pytest.mark.parametrize("name", ["docker", "unstartable"])
def test_a_provider_name_registered_twice_is_a_usage_error(
    pytester: pytest.Pytester, dataset: Path, name: str
) -> None:
    pytester.makeconftest(
        PROVIDER + "\n\ndef pytest_harbor_sandbox_providers():\n"
        f"    return {{{name!r}: unstartable}}\n"
    )
    # A second plugin giving the conftest's name again.
    pytester.makepyfile(
        again=PROVIDER + "\n\ndef pytest_harbor_sandbox_providers():\n"
        '    return {"unstartable": unstartable}\n'
    )
    pytester.syspathinsert()
    result = pytester.runpytest("-p", "again", f"--harbor-dataset={dataset}", "--co")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"*the sandbox provider name {name!r} is registered twice "
            "(pytest_harbor_sandbox_providers, *"
        ]
    )
    assert not (pytester.path / "made.json").exists()


def test_an_agent_inside_a_sandbox_the_relay_cannot_reach_is_skipped_saying_why(
    pytester: pytest.Pytester, dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CLI agent calls its model from inside the sandbox, through the model relay on
    this machine: on a provider whose sandboxes cannot reach it, its items are skipped
    (before any sandbox starts), never run with the key inside."""
    pytester.makeconftest(
        PROVIDER + "\n\ndef pytest_harbor_sandbox_providers():\n"
        '    return {"unstartable": unstartable}\n'
    )
    with ScriptedModel(lambda request: answer("unused")) as server:
        monkeypatch.setenv("HARBOR_MODEL_API_KEY", server.api_key)
        result = pytester.runpytest(
            f"--harbor-dataset={dataset}",
            "--harbor-sandbox=unstartable",
            "--harbor-agent=mini-swe-agent",
            f"--harbor-model={server.model}",
            f"--harbor-model-url={server.url}",
            "--harbor-results-dir=out",
            "--harbor-skip-unloadable",
            "-rs",
        )
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        ["*mini-swe-agent calls its model from inside the sandbox, through the model relay*"]
    )
    assert server.requests == []
