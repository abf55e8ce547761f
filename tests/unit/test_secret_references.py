"""A secret stays a reference, by name, from the loader to the verifier's exec: the loaded
task holds no secret's value, admission reads the names, the exec gets the value."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pytest_harbor.engine import EpisodeError
from pytest_harbor.engine.admission import secrets_given
from pytest_harbor.engine.verification import verifier_environment
from pytest_harbor.settings import HarborSettings
from pytest_harbor.tasks import Task, TaskLoadError, load_task
from pytest_harbor.templates import SecretReference
from tests.fake_provider import FakeProvider, SandboxScript
from tests.fixtures import BASE_IMAGE, write_task
from tests.unit.test_episode_turns import ScriptedHarness, episode_of, run_all

SECRET = "tok-9c41e27d0b5a3f86"
SETTINGS = HarborSettings(secrets={"API_TOKEN": SECRET}, host_env=["CARRIER", "PLAIN"])
#: The host's variables: CARRIER holds the secret's text (given as env:CARRIER, say).
ENVIRON = {"CARRIER": f"Bearer {SECRET}", "PLAIN": "plain"}

MULTI_STEP = f"""
    [agent]
    user = "1000"
    [environment]
    docker_image = "{BASE_IMAGE}"
    [verifier]
    env = {{ TOKEN = "${{API_TOKEN}}", AUTH = "${{CARRIER}}", OTHER = "${{PLAIN}}" }}
    [[steps]]
    name = "one"
    [[steps]]
    name = "two"
    [steps.verifier]
    env = {{ TOKEN = "step's own", LATER = "${{API_TOKEN:-unused}}" }}
"""


def multi_step(tmp_path: Path) -> Task:
    folder = write_task(
        tmp_path,
        "multi",
        toml=MULTI_STEP,
        extra_files={"steps/one/instruction.md": "one\n", "steps/two/instruction.md": "two\n"},
    )
    return load_task(folder, variables=SETTINGS.template_sources(ENVIRON))


def test_a_loaded_task_holds_no_secrets_value(tmp_path: Path) -> None:
    task = multi_step(tmp_path)
    assert SECRET not in repr(task)
    assert SECRET not in repr(task.config.model_dump())
    assert SECRET not in repr(task.turns)
    one, two = task.turns
    assert one.verifier_env == {
        "TOKEN": SecretReference("API_TOKEN", ("API_TOKEN",)),
        "AUTH": SecretReference("CARRIER", ("API_TOKEN",)),
        "OTHER": "plain",
    }
    # A step's own entry replaces the task's, reference or not.
    assert two.verifier_env["TOKEN"] == "step's own"
    assert two.verifier_env["LATER"] == SecretReference("API_TOKEN", ("API_TOKEN",))


def test_the_verifiers_environment_is_filled_where_it_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = multi_step(tmp_path).turns
    monkeypatch.setenv("CARRIER", ENVIRON["CARRIER"])
    assert verifier_environment(one, SETTINGS) == {
        "TOKEN": SECRET,
        "AUTH": f"Bearer {SECRET}",
        "OTHER": "plain",
    }
    assert verifier_environment(two, SETTINGS) == {
        "TOKEN": "step's own",
        "AUTH": f"Bearer {SECRET}",
        "OTHER": "plain",
        "LATER": SECRET,
    }


def test_secrets_given_are_read_from_the_references(tmp_path: Path) -> None:
    one, two = multi_step(tmp_path).turns
    assert secrets_given(one) == ["API_TOKEN"]
    assert secrets_given(two) == ["API_TOKEN"]
    # A value that merely spells the secret is the task's own text, not a secret given.
    assert secrets_given(dataclasses.replace(one, verifier_env={"X": SECRET})) == []


def test_the_verifiers_exec_gets_the_secret_and_the_task_never_did(tmp_path: Path) -> None:
    folder = write_task(
        tmp_path,
        "given",
        toml=f"""
            [agent]
            user = "1000"
            [environment]
            docker_image = "{BASE_IMAGE}"
            [verifier]
            env = {{ TOKEN = "${{API_TOKEN}}" }}
        """,
    )
    settings = HarborSettings(secrets={"API_TOKEN": SECRET})
    task = load_task(folder, variables=settings.template_sources({}))
    provider = FakeProvider(SandboxScript(users={"1000": "1000:1000"}))
    _, result = run_all(episode_of(task, tmp_path, provider, ScriptedHarness(), settings))
    assert result.reward == 1.0
    (verify,) = [call for call in provider.calls if call.kind in ("verify", "run_test")]
    assert verify.env == {"TOKEN": SECRET}


def test_a_reference_the_settings_cannot_fill_is_refused_at_the_seed(tmp_path: Path) -> None:
    task = multi_step(tmp_path)
    provider = FakeProvider(SandboxScript(users={"1000": "1000:1000"}))
    episode = episode_of(task, tmp_path, provider, ScriptedHarness(), HarborSettings())
    with pytest.raises(EpisodeError, match=r"the verifier's TOKEN reads \$\{API_TOKEN\}"):
        run_all(episode)


def test_a_table_the_agent_gets_reads_no_secret(tmp_path: Path) -> None:
    """A secret is not among what an agent's table reads (as before: unset, or its
    default); a host variable that carries one is refused by the secret's name."""
    toml = f'[environment]\ndocker_image = "{BASE_IMAGE}"\nenv = {{ K = "VALUE" }}\n'
    sources = SETTINGS.template_sources(ENVIRON)
    defaulted = write_task(tmp_path, "defaulted", toml=toml.replace("VALUE", "${API_TOKEN:-x}"))
    assert load_task(defaulted, variables=sources).config.environment.env == {"K": "x"}
    unset = write_task(tmp_path, "unset", toml=toml.replace("VALUE", "${API_TOKEN}"))
    with pytest.raises(TaskLoadError, match="names a variable that is not set"):
        load_task(unset, variables=sources)
    carried = write_task(tmp_path, "carried", toml=toml.replace("VALUE", "${CARRIER}"))
    with pytest.raises(TaskLoadError, match="would give the secret API_TOKEN") as raised:
        load_task(carried, variables=sources)
    assert raised.value.key == "environment.env.K"
