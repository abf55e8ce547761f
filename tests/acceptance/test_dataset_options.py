"""Selection, markers, dataset.toml, settings and the files written before any episode.

Nothing here starts a sandbox: runs collect only, or every item is skipped or refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures import write_task


def make_dataset(root: Path, gym: str = "", tasks: tuple[str, ...] = ("alpha", "beta")) -> Path:
    dataset = root / "tasks"
    dataset.mkdir()
    for task in tasks:
        write_task(dataset, task)
    if gym:
        (dataset / "dataset.toml").write_text(gym)
    return dataset


def test_only_and_exclude_tasks(pytester: pytest.Pytester) -> None:
    dataset = make_dataset(pytester.path, tasks=("build-a", "build-b", "check-a"))
    only = pytester.runpytest(
        f"--harbor-dataset={dataset}",
        "--harbor-only-tasks=build-*,check-a",
        "--harbor-exclude-tasks=*-b",
        "--co",
        "-q",
    )
    only.stdout.fnmatch_lines(
        ["tasks/build-a::r0::episode", "tasks/check-a::r0::episode", "2 tests collected*"]
    )


def test_metadata_markers_are_registered_for_strict_markers(pytester: pytest.Pytester) -> None:
    dataset = pytester.path / "tasks"
    write_task(
        dataset,
        "easy-one",
        toml='[metadata]\ndifficulty = "easy"\ntags = ["files", "quick start"]\n'
        '[environment]\ndocker_image = "img"\n',
    )
    write_task(
        dataset,
        "hard-one",
        toml='[metadata]\ndifficulty = "hard"\n[environment]\ndocker_image = "img"\n',
    )
    result = pytester.runpytest(
        f"--harbor-dataset={dataset}",
        "--strict-markers",
        "-m",
        "difficulty_easy and tag_quick_start",
        "--co",
        "-q",
    )
    result.stdout.fnmatch_lines(
        ["tasks/easy-one::r0::episode", "1/2 tests collected (1 deselected)*"]
    )
    assert result.ret == pytest.ExitCode.OK


def test_dataset_repeats_unless_the_option_says_otherwise(pytester: pytest.Pytester) -> None:
    dataset = make_dataset(pytester.path, gym="[gym.defaults]\nrepeats = 3\n", tasks=("alpha",))
    from_dataset = pytester.runpytest(f"--harbor-dataset={dataset}", "--co", "-q")
    from_dataset.stdout.fnmatch_lines(["tasks/alpha::r2::episode", "3 tests collected*"])
    from_option = pytester.runpytest(
        f"--harbor-dataset={dataset}", "--harbor-repeats=1", "--co", "-q"
    )
    from_option.stdout.fnmatch_lines(["1 test collected*"])


def test_a_harness_the_dataset_does_not_admit_is_refused(pytester: pytest.Pytester) -> None:
    dataset = make_dataset(pytester.path, gym='[gym]\nallowed_agents = ["hermes_agent"]\n')
    refused = pytester.runpytest(f"--harbor-dataset={dataset}", "--harbor-agent=nop", "--co")
    refused.stdout.fnmatch_lines(
        [f"*{dataset / 'dataset.toml'}: gym.allowed_agents: does not admit the harness 'nop'*"]
    )
    assert refused.ret == pytest.ExitCode.INTERRUPTED
    waived = pytester.runpytest(
        f"--harbor-dataset={dataset}",
        "--harbor-agent=nop",
        "--harbor-allow-unsupported-pairing",
        "--co",
        "-q",
    )
    waived.stdout.fnmatch_lines(["2 tests collected*"])
    oracle = pytester.runpytest(f"--harbor-dataset={dataset}", "--co", "-q")
    oracle.stdout.fnmatch_lines(["2 tests collected*"])


def test_skip_unloadable_leaves_a_broken_task_out_and_lists_it(pytester: pytest.Pytester) -> None:
    dataset = make_dataset(pytester.path, tasks=())
    write_task(
        dataset, "broken", toml='[agent]\ntimeout_sec = "x"\n[environment]\ndocker_image = "i"\n'
    )
    write_task(dataset, "open", solve_sh=None)
    stopped = pytester.runpytest(f"--harbor-dataset={dataset}")
    assert stopped.ret == pytest.ExitCode.INTERRUPTED
    # Stopped at collection, the run ran nothing: it keeps no folder.
    assert not (pytester.path / "results/harbor/validation/tasks/runs").exists()
    skipped_file = pytester.path / "results/harbor/validation/tasks/latest/skipped.json"
    going = pytester.runpytest(f"--harbor-dataset={dataset}", "--harbor-skip-unloadable", "-rs")
    going.assert_outcomes(skipped=1)
    assert json.loads(skipped_file.read_text()) == {
        "broken": f"{dataset / 'broken' / 'task.toml'}: agent.timeout_sec: Input should be a "
        "valid number, unable to parse string as a number, got 'x'"
    }


def test_materialized_rows_carry_instruction_and_digest(pytester: pytest.Pytester) -> None:
    dataset = make_dataset(pytester.path, gym="[gym.defaults]\nrepeats = 2\n", tasks=())
    write_task(
        dataset, "open", solve_sh=None, instruction="<!-- canary GUID x -->\nDo the thing.\n"
    )
    result = pytester.runpytest(f"--harbor-dataset={dataset}", "--harbor-agent=oracle")
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # nothing had a solution
    rows_file = pytester.path / "results/harbor/validation/tasks/latest/tasks_oracle.jsonl"
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert [(row["task_id"], row["repeat"]) for row in rows] == [("open", 0), ("open", 1)]
    assert rows[0]["instruction"] == "Do the thing.\n"
    assert rows[0]["digest"].startswith("sha256:") and len(rows[0]["digest"]) == 71


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--harbor-set=no_such_key=1"],
            "*unknown setting 'no_such_key' (from --harbor-set no_such_key=1)*",
        ),
        (
            ["--harbor-set=task_mcp_grants=sometimes"],
            "*setting task_mcp_grants*",
        ),
        (
            ["--harbor-set=compose_overlay={prompt_template: no placeholder}"],
            "*setting compose_overlay*prompt_template must contain {instruction}*",
        ),
        (
            ["--harbor-config=missing.yaml"],
            "*--harbor-config */missing.yaml: cannot be read as YAML*",
        ),
    ],
)
def test_bad_settings_are_usage_errors(
    pytester: pytest.Pytester, args: list[str], message: str
) -> None:
    result = pytester.runpytest(*args)
    result.stderr.fnmatch_lines([message])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_settings_come_from_ini_keys_and_config_files(pytester: pytest.Pytester) -> None:
    (pytester.path / "server.yaml").write_text(
        "harbor_environment_server:\n  environment_servers:\n    harbor:\n"
        "      image_pull_retries: 7\n"
    )
    pytester.makeini("[pytest]\nharbor_verifier_grace_s = 3\nharbor_config = server.yaml\n")
    pytester.makeconftest(
        """
        def pytest_collection_finish(session):
            from pytest_harbor.plugin.run import HARBOR_RUN
            settings = session.config.stash[HARBOR_RUN].settings
            print(f"grace={settings.verifier_grace_s} retries={settings.image_pull_retries}")
        """
    )
    result = pytester.runpytest("-s", "--co", "--harbor-set=image_pull_retries=8")
    result.stdout.fnmatch_lines(["grace=3.0 retries=8"])
