"""Run settings: defaults, sources and precedence, and what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from pytest_harbor.redaction import run_redactor
from pytest_harbor.settings import (
    HarborSettings,
    SettingsError,
    literal_secrets,
    load_settings,
    parse_assignments,
)


def config_file(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(
        "harbor_environment_server:\n  environment_servers:\n    harbor:\n"
        + "".join(f"      {line}\n" for line in body.splitlines())
    )
    return path


def test_defaults_are_the_seeds() -> None:
    settings = HarborSettings()
    assert settings.sandbox_ready_timeout_s == 900
    assert settings.image_pull_retries == 2
    assert settings.sandbox_metadata == {"benchmark": "harbor"}
    assert settings.enforce_task_timeouts is True
    assert settings.harness_setup_allowance_s == 300
    assert settings.verifier_grace_s == 30
    assert settings.default_episode_timeout_seconds == 21600
    assert settings.cleanup_timeout_seconds == 180
    assert settings.sandbox_ttl_slack_s == 900
    assert settings.max_concurrent_episodes is None
    assert settings.queue_timeout_seconds is None
    assert settings.separate_verifier_for_artifacts is False
    assert settings.secrets == {}
    assert settings.turn_sessions == "fresh"
    assert settings.task_mcp_grants == "off"


def test_precedence_ini_then_files_in_order_then_set(tmp_path: Path) -> None:
    first = config_file(
        tmp_path,
        "a.yaml",
        "verifier_grace_s: 5\nimage_pull_retries: 1\ncleanup_timeout_seconds: 60",
    )
    second = config_file(tmp_path, "b.yaml", "verifier_grace_s: 6")
    settings = load_settings(
        {"verifier_grace_s": "4", "sandbox_ttl_slack_s": "10", "image_pull_retries": "0"},
        [first, second],
        parse_assignments(
            [
                "cleanup_timeout_seconds=7",
                "cleanup_timeout_seconds=8",
                "enforce_task_timeouts=false",
            ]
        ),
    )
    assert settings.verifier_grace_s == 6  # second file over first file over ini
    assert settings.image_pull_retries == 1  # file over ini
    assert settings.sandbox_ttl_slack_s == 10  # ini over default
    assert settings.cleanup_timeout_seconds == 8  # last --harbor-set wins
    assert settings.enforce_task_timeouts is False


def test_set_reaches_into_mappings_keeping_defaults() -> None:
    settings = load_settings(
        {}, [], parse_assignments(["sandbox_metadata.team=evals", "secrets.API_TOKEN=s3cret"])
    )
    assert settings.sandbox_metadata == {"benchmark": "harbor", "team": "evals"}
    assert settings.revealed_secrets() == {"API_TOKEN": "s3cret"}
    assert settings.redacted()["secrets"] == {"API_TOKEN": "***"}


def test_values_are_yaml(tmp_path: Path) -> None:
    settings = load_settings(
        {"sandbox_resources_override": "{cpu: 1.5, memory_mib: 512}"},
        [],
        parse_assignments(["secrets={A: b}"]),
    )
    assert settings.sandbox_resources_override is not None
    assert (
        settings.sandbox_resources_override.cpu,
        settings.sandbox_resources_override.memory_mib,
    ) == (1.5, 512)
    assert settings.revealed_secrets() == {"A": "b"}


@pytest.mark.parametrize(
    ("ini", "files", "assignments", "message"),
    [
        (
            {},
            [],
            ["max_concurent_episodes=4"],
            "unknown setting 'max_concurent_episodes' (from --harbor-set max_concurent_episodes=4)"
            "; did you mean 'max_concurrent_episodes'?",
        ),
        ({"no_such": "1"}, [], [], "unknown setting 'no_such' (from ini key harbor_no_such)"),
        (
            {},
            [],
            ["verifier_grace_s=soon"],
            "setting verifier_grace_s (from --harbor-set verifier_grace_s=soon): "
            "Input should be a valid number",
        ),
        (
            {},
            [],
            ["max_concurrent_episodes=2"],
            # A rule between settings names where they came from, not "(settings)".
            "settings (from --harbor-set max_concurrent_episodes=2): max_concurrent_episodes "
            "requires queue_timeout_seconds",
        ),
        (
            {},
            [],
            ["agent_outcome_policy.timeut.action=fail"],
            # A nested key: the nearest of the keys its table takes, in our words.
            "setting agent_outcome_policy.timeut (from --harbor-set "
            "agent_outcome_policy.timeut.action=fail): no such key; did you mean 'timeout'? "
            "(it takes agent_crashed, api_error, context_length_exceeded, rate_limited, "
            "timeout, tools_unavailable)",
        ),
        (
            {},
            [],
            ["gpu_sandbox_provider.sandboxx=docker"],
            # The misspelling is said, not the required key it left out.
            "setting gpu_sandbox_provider.sandboxx (from --harbor-set "
            "gpu_sandbox_provider.sandboxx=docker): no such key; did you mean 'sandbox'? "
            "(it takes options, sandbox)",
        ),
        (
            {},
            [],
            ["gpu_sandbox_provider.options={}"],
            "setting gpu_sandbox_provider.sandbox (from --harbor-set "
            "gpu_sandbox_provider.options={}): required, and not given",
        ),
        ({}, [], ["task_mcp_grants=always"], "task_mcp_grants"),
        (
            {},
            [],
            ["gpu_sandbox_provider={sandbox: docker, engine: x}"],
            "gpu_sandbox_provider.engine",
        ),
        ({}, [], ["tasksets=[a]"], "set by the run itself, not by settings: tasksets"),
        ({}, [], ["no-equals-sign"], "--harbor-set 'no-equals-sign': expected KEY=VALUE"),
        ({}, [], ["sandbox_resources_override={gpu: 1}"], "sandbox_resources_override.gpu"),
        ({}, [], ["sandbox_metadata={pytest-harbor.run: x}"], "reserved"),
    ],
)
def test_refused(
    ini: dict[str, str], files: list[Path], assignments: list[str], message: str
) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(ini, files, parse_assignments(assignments))
    assert message in str(caught.value)


def test_an_unimplemented_key_is_refused_unless_at_its_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("pytest_harbor.settings.NOT_IMPLEMENTED", frozenset({"task_mcp_grants"}))
    assert (
        load_settings({}, [], parse_assignments(["task_mcp_grants=off"])).task_mcp_grants == "off"
    )
    with pytest.raises(SettingsError, match="not implemented in this release"):
        load_settings({}, [], parse_assignments(["task_mcp_grants=optional"]))


def test_mcp_grants_are_taken() -> None:
    assert (
        load_settings({}, [], parse_assignments(["task_mcp_grants=required"])).task_mcp_grants
        == "required"
    )


def test_config_file_needs_the_harbor_block(tmp_path: Path) -> None:
    flat = tmp_path / "flat.yaml"
    flat.write_text("verifier_grace_s: 3\n")
    with pytest.raises(
        SettingsError,
        match=r"expected the block harbor_environment_server\.environment_servers\.harbor",
    ):
        load_settings({}, [flat], [])
    unknown = config_file(tmp_path, "u.yaml", "colour: red")
    with pytest.raises(SettingsError, match=f"unknown setting 'colour' \\(from {unknown}\\)"):
        load_settings({}, [unknown], [])


def test_secrets_are_held_as_secret_strings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given as env:, file: or literally, a secret's value is in no repr or dump of the
    settings; revealed_secrets() is the one way to it."""
    monkeypatch.setenv("HARBOR_T_SECRET", "from-the-env")
    (tmp_path / "token").write_text("from-a-file\n")
    assignments = parse_assignments(
        [
            "secrets.A=env:HARBOR_T_SECRET",
            f"secrets.B=file:{tmp_path / 'token'}",
            "secrets.C=given-literally",
        ]
    )
    settings = load_settings({}, [], assignments)
    assert all(isinstance(value, SecretStr) for value in settings.secrets.values())
    assert settings.revealed_secrets() == {
        "A": "from-the-env",
        "B": "from-a-file",
        "C": "given-literally",
    }
    shown = repr(settings) + str(settings.model_dump()) + str(settings.model_dump(mode="json"))
    assert not any(value in shown for value in settings.revealed_secrets().values())
    assert run_redactor(settings, None).text("from-the-env, from-a-file") == "***, ***"


def test_one_parse_of_harbor_set_gives_the_settings_and_the_literal_secrets() -> None:
    assignments = parse_assignments(
        ["secrets.A=typed", "secrets.B=env:HARBOR_T_B", "secrets={C: typed, D: 'file:x'}"]
    )
    assert [assignment.keys for assignment in assignments] == [
        ("secrets", "A"),
        ("secrets", "B"),
        ("secrets",),
    ]
    assert literal_secrets(assignments) == ["A", "C"]
    settings = load_settings({}, [], parse_assignments(["verifier_grace_s=5", "secrets.A=x"]))
    assert (settings.verifier_grace_s, settings.revealed_secrets()) == (5, {"A": "x"})


def test_host_env_names_the_host_variables_a_task_may_see() -> None:
    settings = HarborSettings(secrets={"API_TOKEN": "s3cret"}, host_env=["A", "B", "C"])
    environ = {"A": "a", "B": "Bearer s3cret", "OTHER": "o"}
    assert settings.host_variables(environ) == {"A": "a", "B": "Bearer s3cret"}
    sources = settings.template_sources(environ)
    # A host variable that holds a secret's text is handed on by name, never by value.
    assert sources.host == {"A": "a"}
    assert sources.carriers == {"B": ("API_TOKEN",)}
    assert sources.secrets == frozenset({"API_TOKEN"})
    assert "s3cret" not in repr(sources)
