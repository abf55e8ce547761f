"""run_config_<agent>.yaml in real runs: written by every run, run again with
`--harbor-config`, the API key never in it, and what would make rows incomparable named."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures import Dataset, Server, run_harbor, write_task
from tests.git_repos import TaskRepo, git_daemon, write_registry
from tests.model_server import answer, tool_call

pytestmark = pytest.mark.docker


@pytest.fixture
def dataset(harbor_dataset: Dataset) -> Dataset:
    return harbor_dataset


def _rows(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "rollouts.jsonl").read_text().splitlines()]


def _comparable(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["task_id"], row["repeat"], row.get("digest"), row["agent"], row["reward"])


def test_a_run_is_run_again_from_its_run_config(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    for name in ("hello", "world", "other"):
        dataset.task(name)
    first = run_harbor(
        pytester,
        dataset,
        "--harbor-repeats=2",
        "--harbor-exclude-tasks=other",
        "-k",
        "not world",
        "--harbor-set=verifier_grace_s=10",
    )
    first.assert_outcomes(passed=2)
    folder = dataset.results_folder(pytester.path / "out")
    record = folder / "run_config_oracle.yaml"
    text = record.read_text()
    assert f"harbor_{dataset.name.replace('-', '-')}_environment:" in text
    assert "verifier_grace_s: 10.0" in text

    again = pytester.runpytest(f"--harbor-config={record}", "--harbor-results-dir=again")
    again.assert_outcomes(passed=2)
    second = pytester.path / "again/harbor/validation" / dataset.name / "latest"
    assert sorted(map(_comparable, _rows(second))) == sorted(map(_comparable, _rows(folder)))
    manifest = json.loads((second / "rollouts_manifest.json").read_text())
    assert manifest["settings"]["verifier_grace_s"] == 10.0
    assert manifest["repeats"] == 2


def test_what_would_make_rows_incomparable_is_named(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task("hello")
    run_harbor(pytester, dataset).assert_outcomes(passed=1)
    record = dataset.results_folder(pytester.path / "out") / "run_config_oracle.yaml"
    for args, named in (
        (
            ["--harbor-agent=nop"],
            "--harbor-agent: 'nop' (from command line), but *records 'oracle'",
        ),
        (["--harbor-repeats=3"], "--harbor-repeats: 3 *records 1*"),
        (["--harbor-set=verifier_grace_s=5"], "setting verifier_grace_s: 5.0 *records 30.0*"),
        (["-k", "world"], "-k 'world', but *records -k ''*"),
    ):
        refused = pytester.runpytest(f"--harbor-config={record}", "--harbor-results-dir=x", *args)
        assert refused.ret == pytest.ExitCode.USAGE_ERROR
        refused.stderr.fnmatch_lines([f"*{named}*"])
    (dataset.path / "hello" / "instruction.md").write_text("Write 1 to /tmp/answer, now.\n")
    changed = pytester.runpytest(f"--harbor-config={record}", "--harbor-results-dir=x")
    assert changed.ret == pytest.ExitCode.USAGE_ERROR
    changed.stderr.fnmatch_lines(
        ["*the tasks of * are not those of the recorded run*", "*task hello: digest * then, * now*"]
    )


def test_the_api_key_is_never_written_and_the_model_is_run_again(
    pytester: pytest.Pytester, dataset: Dataset, model_server: Server
) -> None:
    dataset.task("hello")
    server = model_server(
        lambda request: (
            tool_call("echo 1 > /tmp/answer") if request.last["role"] == "user" else answer("Done.")
        )
    )
    key = server.api_key
    first = run_harbor(
        pytester,
        dataset,
        *server.options(f"--harbor-model-api-key={key}", "--harbor-model-param=temperature=0.25"),
    )
    first.assert_outcomes(passed=1)
    folder = dataset.results_folder(pytester.path / "out", validation=False)
    record = folder / "run_config_shell-agent.yaml"
    text = record.read_text()
    assert key not in text and key[-12:] not in text
    assert "temperature: 0.25" in text and server.url in text
    assert "--harbor-model-api-key: command line" in text
    again = pytester.runpytest(
        f"--harbor-config={record}", "--harbor-results-dir=again", f"--harbor-model-api-key={key}"
    )
    again.assert_outcomes(passed=1)
    assert all(request.body.get("temperature") == 0.25 for request in server.requests)
    other = pytester.runpytest(
        f"--harbor-config={record}", "--harbor-results-dir=x", "--harbor-model=another-model"
    )
    assert other.ret == pytest.ExitCode.USAGE_ERROR
    other.stderr.fnmatch_lines(
        ["*--harbor-model: 'another-model', but * records the model's name*"]
    )


def test_a_dataset_by_reference_is_run_again_from_its_commits_offline(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    served = pytester.path / "served"
    served.mkdir()
    repo = TaskRepo(served / "repo")
    write_task(repo.path / "tasks", "hello")
    commit = repo.commit()
    name = f"ref-{uuid.uuid4().hex[:8]}"
    registry = write_registry(
        pytester.path / "registry.json",
        [
            {
                "name": name,
                "version": "head",
                "tasks": [
                    {"name": "hello", "git_url": "", "git_commit_id": "main", "path": "tasks/hello"}
                ],
            }
        ],
    )
    cache = pytester.path / "cache"
    with git_daemon(served) as url:
        data = json.loads(registry.read_text())
        data[0]["tasks"][0]["git_url"] = f"{url}/repo"
        registry.write_text(json.dumps(data))
        pytester.runpytest(
            f"--harbor-dataset=harbor:{name}",
            f"--harbor-registry={registry}",
            f"--harbor-cache-dir={cache}",
            "--harbor-results-dir=out",
        ).assert_outcomes(passed=1)
    record = pytester.path / "out/harbor/validation" / name / "latest" / "run_config_oracle.yaml"
    assert commit in record.read_text()
    # The branch moves, the registry is gone and no server answers: the recorded
    # commits are what runs.
    (repo.path / "tasks" / "hello" / "instruction.md").write_text("Changed.\n")
    repo.commit()
    registry.unlink()
    again = pytester.runpytest(
        f"--harbor-config={record}", f"--harbor-cache-dir={cache}", "--harbor-results-dir=again"
    )
    again.assert_outcomes(passed=1)
    manifest = json.loads(
        (
            pytester.path / "again/harbor/validation" / name / "latest" / "rollouts_manifest.json"
        ).read_text()
    )
    assert manifest["reference"]["tasks"][0]["git_commit_id"] == commit


def test_secrets_are_named_never_written_and_must_be_given_again(
    pytester: pytest.Pytester, dataset: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = f"s3cret-{uuid.uuid4().hex}"
    monkeypatch.setenv("RUN_CONFIG_TOKEN", secret)
    dataset.task("hello")
    run_harbor(
        pytester, dataset, "--harbor-set=secrets.TOKEN=env:RUN_CONFIG_TOKEN"
    ).assert_outcomes(passed=1)
    record = dataset.results_folder(pytester.path / "out") / "run_config_oracle.yaml"
    text = record.read_text()
    assert secret not in text and "- TOKEN" in text
    missing = pytester.runpytest(f"--harbor-config={record}", "--harbor-results-dir=x")
    assert missing.ret == pytest.ExitCode.USAGE_ERROR
    missing.stderr.fnmatch_lines(["*the recorded run had the secrets TOKEN*give them again*"])
    pytester.runpytest(
        f"--harbor-config={record}",
        "--harbor-results-dir=again",
        "--harbor-set=secrets.TOKEN=env:RUN_CONFIG_TOKEN",
    ).assert_outcomes(passed=1)
