"""run_config_<agent>.yaml without a run: names, the round trip of a record, and edits."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_harbor.redaction import Redactor
from pytest_harbor.settings import load_settings
from pytest_harbor.writers.run_config import (
    RunConfigError,
    RunRecord,
    encode_name,
    read_run_config,
    run_config_name,
)


def test_taskset_names_are_encoded_as_the_seed_does() -> None:
    assert encode_name("terminal_bench_2_1") == "terminal_5fbench_5f2_5f1"
    assert encode_name("quick-start") == "quick-start"
    assert encode_name("é.x") == "_c3_a9_2ex"
    assert run_config_name("oracle") == "run_config_oracle.yaml"
    assert run_config_name("recipes/my agent.toml") == "run_config_recipes_2fmy_20agent_2etoml.yaml"


RECORD = RunRecord(
    taskset="terminal_bench",
    run_id="r1",
    pytest_harbor_version="0.1.0",
    dataset="harbor:terminal-bench@2.0",
    reference={"given": "harbor:terminal-bench@2.0", "kind": "registry", "tasks": []},
    dataset_digest="d" * 64,
    task_digests={"hello": "sha256:" + "a" * 64},
    agent="shell-agent",
    agent_options={"max_turns": 5},
    model={"name": "m", "base_url": "http://127.0.0.1:1/v1", "params": {}, "api_key_env": "K"},
    repeats=2,
    sandbox="docker",
    pass_reward=1.0,
    settings={"verifier_grace_s": 10.0},
    secrets=["API_TOKEN"],
    sources={"setting verifier_grace_s": "--harbor-set verifier_grace_s=10"},
)


def test_a_record_reads_back_as_written(tmp_path: Path) -> None:
    path = tmp_path / run_config_name("shell-agent")
    RECORD.write(path, Redactor())
    assert read_run_config(path) == RECORD
    text = path.read_text()
    assert "harbor_terminal_5fbench_environment:" in text
    assert "harbor_terminal_5fbench_agent:" in text
    # Its settings block is a settings file's: a plain --harbor-config reads it the same.
    assert load_settings({}, [path], []).verifier_grace_s == 10.0


@pytest.mark.parametrize(
    ("old", "new", "named"),
    [
        ("repeats: 2", "repeats: 1", "harbor_terminal_5fbench_environment.repeats (changed)"),
        ("  harness: shell-agent", "  harness: nop", "harbor_terminal_5fbench_agent.harness"),
        (
            "      verifier_grace_s: 10.0",
            "      verifier_grace_s: 10.0\n      image_pull_retries: 9",
            "harbor.image_pull_retries (added)",
        ),
        ("  - API_TOKEN\n", "", "pytest_harbor.secrets (changed)"),
        ("  check: false\n", "", "harbor_terminal_5fbench_agent.check (removed)"),
    ],
)
def test_an_edited_entry_is_refused_by_name(tmp_path: Path, old: str, new: str, named: str) -> None:
    path = tmp_path / "run_config_shell-agent.yaml"
    RECORD.write(path, Redactor())
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    pattern = "edited after the run wrote it: .*" + re.escape(named)
    with pytest.raises(RunConfigError, match=pattern):
        read_run_config(path)


def test_a_settings_file_is_not_a_run_config(tmp_path: Path) -> None:
    path = tmp_path / "settings.yaml"
    path.write_text("harbor_environment_server:\n  environment_servers:\n    harbor: {}\n")
    assert read_run_config(path) is None


def test_secret_values_never_reach_the_file(tmp_path: Path) -> None:
    path = tmp_path / "run_config.yaml"
    record = RECORD.model_copy(update={"agent_options": {"note": "uses hunter2-secret"}})
    record.write(path, Redactor(["hunter2-secret"]))
    assert "hunter2-secret" not in path.read_text()
