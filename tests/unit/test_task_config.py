"""task.toml models: Harbor's defaults, legacy spellings, unknown keys."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pytest_harbor.tasks.config import TaskConfig, unknown_keys


def test_defaults_are_harbors() -> None:
    config = TaskConfig.model_validate({})
    assert config.schema_version == "1.4"
    assert config.agent.timeout_sec is None
    assert config.agent.user is None
    assert config.verifier.timeout_sec == 600.0
    assert config.verifier.env == {}
    assert config.verifier.user is None
    assert config.environment.build_timeout_sec == 600.0
    assert config.environment.docker_image is None
    assert config.environment.workdir is None
    assert config.environment.env == {}
    assert config.environment.cpus is None
    assert config.environment.memory_mb is None
    assert config.environment.network_mode == "public"
    assert config.solution.env == {}
    assert config.steps is None


def test_every_first_cut_field_is_read() -> None:
    config = TaskConfig.model_validate(
        {
            "schema_version": "1.3",
            "agent": {"timeout_sec": 30, "user": "agent"},
            "verifier": {"timeout_sec": 12.5, "env": {"A": "1"}, "user": 1000},
            "environment": {
                "docker_image": "img:1",
                "build_timeout_sec": 60,
                "workdir": "/app",
                "env": {"B": "2"},
                "cpus": 1.5,
                "memory_mb": 512,
            },
            "solution": {"env": {"C": "3"}},
        }
    )
    assert config.schema_version == "1.3"
    assert (config.agent.timeout_sec, config.agent.user) == (30.0, "agent")
    assert (config.verifier.timeout_sec, config.verifier.env) == (12.5, {"A": "1"})
    assert config.verifier.user == 1000
    environment = config.environment
    assert environment.docker_image == "img:1"
    assert environment.build_timeout_sec == 60.0
    assert environment.workdir == "/app"
    assert environment.env == {"B": "2"}
    assert (environment.cpus, environment.memory_mb) == (1.5, 512)
    assert config.solution.env == {"C": "3"}


def test_legacy_version_is_schema_version() -> None:
    assert TaskConfig.model_validate({"version": "1.0"}).schema_version == "1.0"
    both = TaskConfig.model_validate({"version": "1.0", "schema_version": "1.4"})
    assert both.schema_version == "1.4"


@pytest.mark.parametrize(
    ("memory", "megabytes"), [("2G", 2048), ("512M", 512), ("2048K", 2), ("1.5G", 1536)]
)
def test_legacy_memory_sizes(memory: str, megabytes: int) -> None:
    config = TaskConfig.model_validate({"environment": {"memory": memory}})
    assert config.environment.memory_mb == megabytes


def test_legacy_memory_conflicting_with_memory_mb_is_refused() -> None:
    with pytest.raises(ValidationError, match="conflicts with memory_mb"):
        TaskConfig.model_validate({"environment": {"memory": "1G", "memory_mb": 512}})


def test_bad_size_suffix_is_refused() -> None:
    with pytest.raises(ValidationError, match="'2X'"):
        TaskConfig.model_validate({"environment": {"memory": "2X"}})


def test_whole_cpus_collapse_to_int() -> None:
    assert TaskConfig.model_validate({"environment": {"cpus": 2.0}}).environment.cpus == 2


@pytest.mark.parametrize(
    "table",
    [
        {"agent": {"timeout_sec": 0}},
        {"agent": {"timeout_sec": "soon"}},
        {"verifier": {"timeout_sec": -1}},
        {"verifier": {"env": {"A": 1}}},
        {"environment": {"cpus": float("inf")}},
        {"environment": {"workdir": "relative/dir"}},
        {"environment": {"os": "macos"}},
        {"environment": {"allowed_hosts": ["example.com"]}},
    ],
)
def test_bad_values_are_refused(table: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        TaskConfig.model_validate(table)


def test_allow_internet_maps_to_network_mode() -> None:
    off = TaskConfig.model_validate({"environment": {"allow_internet": False}})
    assert off.environment.network_mode == "no-network"
    explicit = TaskConfig.model_validate(
        {"environment": {"allow_internet": False, "network_mode": "public"}}
    )
    assert explicit.environment.network_mode == "public"


def test_os_is_case_insensitive() -> None:
    assert TaskConfig.model_validate({"environment": {"os": "Linux"}}).environment.os == "linux"


def test_unknown_keys_are_kept_aside_and_listed() -> None:
    config = TaskConfig.model_validate(
        {
            "surprise": 1,
            "environment": {"docker_image": "x", "colour": "blue"},
            "verifier": {"retries": 2},
            "metadata": {"anything": "goes"},
            "steps": [{"name": "one", "extra": True}],
        }
    )
    assert unknown_keys(config) == [
        "surprise",
        "verifier.retries",
        "environment.colour",
        "steps[0].extra",
    ]


@pytest.mark.parametrize(("storage", "megabytes"), [("10G", 10240), ("300M", 300), (512, 512)])
def test_legacy_storage_sizes(storage: object, megabytes: int) -> None:
    config = TaskConfig.model_validate({"environment": {"storage": storage}})
    assert config.environment.storage_mb == megabytes


def test_legacy_spellings_inside_the_verifier_environment() -> None:
    config = TaskConfig.model_validate(
        {"verifier": {"environment": {"memory": "1G", "allow_internet": False}}}
    )
    assert config.verifier.environment is not None
    assert config.verifier.environment.memory_mb == 1024
    assert config.verifier.environment.network_mode == "no-network"
    assert config.verifier.mode == "separate"


def test_hosts_are_normalised() -> None:
    config = TaskConfig.model_validate(
        {
            "environment": {
                "network_mode": "allowlist",
                "allowed_hosts": ["PyPI.org.", "*.Example.com", "10.0.0.0/8", "::1"],
            }
        }
    )
    assert config.environment.allowed_hosts == ["pypi.org", "*.example.com", "10.0.0.0/8", "::1"]


def test_artifacts_accept_strings_and_tables() -> None:
    config = TaskConfig.model_validate(
        {
            "artifacts": [
                "/app/out",
                {"source": "/var/log", "destination": "logs", "exclude": ["*.gz"]},
            ]
        }
    )
    assert [(a.source, a.destination, a.exclude) for a in config.artifacts] == [
        ("/app/out", None, []),
        ("/var/log", "logs", ["*.gz"]),
    ]


def test_mcp_http_is_streamable_http() -> None:
    config = TaskConfig.model_validate(
        {"environment": {"mcp_servers": [{"name": "t", "transport": "http", "url": "http://t"}]}}
    )
    assert config.environment.mcp_servers[0].transport == "streamable-http"


def test_steps_fall_back_to_the_task() -> None:
    config = TaskConfig.model_validate(
        {
            "steps": [
                {"name": "one", "min_reward": {"correctness": 1}},
                {"name": "two", "min_reward": 0.5},
            ]
        }
    )
    assert config.steps is not None
    assert config.steps[0].agent.timeout_sec is None
    assert config.steps[0].verifier.timeout_sec is None
    assert config.steps[0].min_reward == {"correctness": 1.0}
    assert config.steps[1].min_reward == 0.5
