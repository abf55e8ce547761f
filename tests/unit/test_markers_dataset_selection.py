"""Markers from [metadata], dataset.toml defaults and overrides, task selection."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_harbor.engine.verification import verifier_environment
from pytest_harbor.plugin.markers import metadata_markers
from pytest_harbor.run.planning import Selection, plan_taskset
from pytest_harbor.sandboxes.docker import DockerProvider
from pytest_harbor.settings import HarborSettings
from pytest_harbor.tasks import load_task, read_dataset_config
from tests.fixtures import BASE_IMAGE, write_task


@pytest.mark.parametrize(
    ("metadata", "markers"),
    [
        ({"difficulty": "easy"}, ["difficulty_easy"]),
        ({"difficulty": "Very Hard!"}, ["difficulty_very_hard"]),
        ({"category": "files"}, ["category_files"]),
        ({"category": ["a", "b-c"]}, ["category_a", "category_b_c"]),
        (
            {"tags": ["quickstart", "multi-key reward", "quickstart"]},
            ["tag_quickstart", "tag_multi_key_reward"],
        ),
        ({"difficulty": "easy", "tags": ["x"], "author": "me"}, ["difficulty_easy", "tag_x"]),
        ({"tags": ["!!"]}, []),
        ({}, []),
    ],
)
def test_metadata_markers(metadata: dict[str, object], markers: list[str]) -> None:
    assert metadata_markers(metadata) == markers


def dataset_folder(tmp_path: Path, gym: str, tasks: tuple[str, ...] = ("alpha", "beta")) -> Path:
    folder = tmp_path / "ds"
    for name in tasks:
        write_task(
            folder,
            name,
            toml=f"""
                [agent]
                timeout_sec = 100
                [verifier]
                timeout_sec = 50
                [environment]
                docker_image = "{BASE_IMAGE}"
                cpus = 1
                memory_mb = 1000
                build_timeout_sec = 200
            """,
        )
    (folder / "dataset.toml").write_text('[dataset]\nname = "org/ds"\n\n' + gym)
    return folder


def test_defaults_scale_every_timeout_and_resource(tmp_path: Path) -> None:
    folder = dataset_folder(
        tmp_path,
        "[gym.defaults]\nrepeats = 3\ntimeout_multiplier = 2\nverifier_timeout_multiplier = 3\n"
        "cpus_multiplier = 1.5\nmemory_multiplier = 0.5\n",
    )
    config = read_dataset_config(folder)
    task = load_task(folder / "alpha", dataset=config)
    assert task.config.agent.timeout_sec == 200  # timeout_multiplier
    assert task.config.verifier.timeout_sec == 150  # its own multiplier wins
    assert task.config.environment.build_timeout_sec == 400
    assert (task.config.environment.cpus, task.config.environment.memory_mb) == (1.5, 500)
    assert task.turns[0].agent_timeout_sec == 200
    assert config.defaults.repeats == 3


def test_overrides_apply_before_the_defaults(tmp_path: Path) -> None:
    folder = dataset_folder(
        tmp_path,
        '[gym.defaults]\ntimeout_multiplier = 2\n\n[gym.tasks."beta"]\n'
        'agent = { timeout_sec = 10, user = "nobody" }\nenvironment = { memory_mb = 64 }\n',
    )
    config = read_dataset_config(folder)
    beta = load_task(folder / "beta", dataset=config)
    alpha = load_task(folder / "alpha", dataset=config)
    assert (beta.config.agent.timeout_sec, beta.config.agent.user) == (20, "nobody")
    assert beta.config.environment.memory_mb == 64
    assert beta.config.environment.docker_image == BASE_IMAGE  # the rest of task.toml stays
    assert alpha.config.agent.timeout_sec == 200


def test_a_folder_without_dataset_toml_or_gym_table_has_empty_settings(tmp_path: Path) -> None:
    assert read_dataset_config(tmp_path).allowed_agents is None
    (tmp_path / "dataset.toml").write_text('[dataset]\nname = "org/x"\n')
    assert read_dataset_config(tmp_path).tasks == {}


def plan(folder: Path, **kwargs: object) -> list[str]:
    result = plan_taskset(
        folder,
        harness="oracle",
        capabilities=DockerProvider.capabilities,
        provider="docker",
        **kwargs,  # type: ignore[arg-type]
    )
    return [task.id for task in result.tasks]


def test_only_and_exclude_take_names_and_globs(tmp_path: Path) -> None:
    folder = dataset_folder(tmp_path, "", tasks=("build-a", "build-b", "check-a", "other"))
    assert plan(folder, selection=Selection(only=("build-*", "other"))) == [
        "build-a",
        "build-b",
        "other",
    ]
    assert plan(folder, selection=Selection(exclude=("*-a",))) == ["build-b", "other"]
    assert plan(folder, selection=Selection(only=("build-*",), exclude=("build-b",))) == ["build-a"]


def test_repeats_come_from_the_option_else_the_dataset(tmp_path: Path) -> None:
    folder = dataset_folder(tmp_path, "[gym.defaults]\nrepeats = 4\n")
    capabilities = DockerProvider.capabilities
    assert (
        plan_taskset(folder, harness="oracle", capabilities=capabilities, provider="d").repeats == 4
    )
    assert (
        plan_taskset(
            folder, harness="oracle", capabilities=capabilities, provider="d", repeats=2
        ).repeats
        == 2
    )


def test_allowed_agents_admit_the_oracle_and_the_listed(tmp_path: Path) -> None:
    folder = dataset_folder(tmp_path, '[gym]\nallowed_agents = ["nop"]\n')
    capabilities = DockerProvider.capabilities
    for harness in ("oracle", "nop"):
        assert plan_taskset(folder, harness=harness, capabilities=capabilities, provider="d").tasks
    admitted = plan_taskset(
        folder, harness="other", capabilities=capabilities, provider="d", admit_any_harness=True
    )
    assert admitted.tasks


def test_secrets_fill_verifier_env_only(tmp_path: Path) -> None:
    task = write_task(
        tmp_path,
        "secretive",
        toml=f"""
            [verifier]
            env = {{ TOKEN = "${{API_TOKEN}}", HOST_VALUE = "${{FROM_HOST}}" }}
            [environment]
            docker_image = "{BASE_IMAGE}"
            env = {{ TOKEN = "${{API_TOKEN:-no secrets here}}" }}
        """,
    )
    settings = HarborSettings(secrets={"API_TOKEN": "s3cret"}, host_env=["FROM_HOST", "API_TOKEN"])
    environ = {"FROM_HOST": "host", "API_TOKEN": "from-host"}
    loaded = load_task(task, variables=settings.template_sources(environ))
    # The task keeps the secret's template; the verifier's exec gets its value.
    assert loaded.config.verifier.env == {"TOKEN": "${API_TOKEN}", "HOST_VALUE": "host"}
    assert loaded.config.environment.env == {"TOKEN": "from-host"}
    assert verifier_environment(loaded.turns[0], settings) == {
        "TOKEN": "s3cret",
        "HOST_VALUE": "host",
    }
