"""Discovery and loading of task folders, and the errors that name file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_harbor.settings import HarborSettings
from pytest_harbor.tasks import discover_task_dirs, is_dataset_dir, load_task
from pytest_harbor.tasks.errors import TaskLoadError
from pytest_harbor.tasks.loader import strip_canary
from pytest_harbor.templates import TemplateSources
from tests.fixtures import write_task


def test_a_task_folder_is_its_own_only_task(tmp_path: Path) -> None:
    task = write_task(tmp_path, "alone")
    assert discover_task_dirs(task) == [task]


def test_discovery_goes_six_levels_deep_sorted(tmp_path: Path) -> None:
    deep = tmp_path / "a" / "b" / "c" / "d" / "e"
    write_task(deep, "sixth")  # tmp_path/a/b/c/d/e/sixth: six levels below tmp_path
    write_task(deep / "f", "seventh")
    write_task(tmp_path, "top")
    write_task(tmp_path / "a", "second")
    found = [path.relative_to(tmp_path).as_posix() for path in discover_task_dirs(tmp_path)]
    assert found == ["a/b/c/d/e/sixth", "a/second", "top"]


def test_discovery_skips_hidden_folders_and_never_enters_a_task(tmp_path: Path) -> None:
    write_task(tmp_path / ".cache", "hidden")
    outer = write_task(tmp_path, "outer")
    write_task(outer / "tests", "inner")
    assert discover_task_dirs(tmp_path) == [outer]


def test_dataset_dir_needs_tasks_and_no_test_modules(tmp_path: Path) -> None:
    assert not is_dataset_dir(tmp_path, ["test_*.py"])
    write_task(tmp_path / "tasks", "one")
    (tmp_path / "README.md").write_text("readme")
    assert is_dataset_dir(tmp_path, ["test_*.py"])
    # Python test files inside a task folder are the sandbox's business.
    (tmp_path / "tasks" / "one" / "tests" / "test_inside.py").write_text("")
    assert is_dataset_dir(tmp_path, ["test_*.py"])
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_project.py").write_text("")
    assert not is_dataset_dir(tmp_path, ["test_*.py"])


def test_load_reads_config_turn_and_strips_canary(tmp_path: Path) -> None:
    task = write_task(
        tmp_path,
        "hello",
        toml="""
            [agent]
            timeout_sec = 30
            user = "agent"
            [verifier]
            timeout_sec = 20
            env = { MODE = "strict" }
            [environment]
            docker_image = "img"
            [solution]
            env = { TOKEN = "x" }
        """,
        instruction="<!-- harbor-canary GUID 123 -->\n\nDo the thing.\n",
    )
    loaded = load_task(task)
    assert loaded.id == "hello"
    (turn,) = loaded.turns
    assert turn.name == "episode"
    assert turn.instruction == "Do the thing.\n"
    assert (turn.agent_timeout_sec, turn.agent_user) == (30.0, "agent")
    assert (turn.verifier_timeout_sec, turn.verifier_env) == (20.0, {"MODE": "strict"})
    assert turn.solution_env == {"TOKEN": "x"}
    assert turn.tests_dirs == (task / "tests",)
    assert turn.solve_script == task / "solution" / "solve.sh"
    assert loaded.is_validatable


def test_a_task_without_solution_is_not_validatable(tmp_path: Path) -> None:
    assert not load_task(write_task(tmp_path, "open", solve_sh=None)).is_validatable


def test_numeric_user_is_passed_as_text(tmp_path: Path) -> None:
    task = write_task(
        tmp_path, "uid", toml='[agent]\nuser = 1000\n[environment]\ndocker_image = "i"\n'
    )
    assert load_task(task).turns[0].agent_user == "1000"


def test_canary_lines_only_at_the_start() -> None:
    text = "# This file carries a CANARY string\n\nBody\n# canary later stays\n"
    assert strip_canary(text) == "Body\n# canary later stays\n"


def test_env_templates_are_filled_from_the_environment(tmp_path: Path) -> None:
    task = write_task(
        tmp_path,
        "env",
        toml="""
            [environment]
            docker_image = "img"
            [environment.env]
            PLAIN = "x"
            FROM_HOST = "${HARBOR_T_VALUE}"
            DEFAULTED = "${HARBOR_T_UNSET:-fallback}"
        """,
    )
    loaded = load_task(task, variables=TemplateSources(host={"HARBOR_T_VALUE": "host"}))
    assert loaded.config.environment.env == {
        "PLAIN": "x",
        "FROM_HOST": "host",
        "DEFAULTED": "fallback",
    }


def test_dockerfile_task_needs_no_image(tmp_path: Path) -> None:
    task = write_task(tmp_path, "built", toml="[agent]\n", dockerfile="FROM scratch\n")
    loaded = load_task(task)
    assert loaded.dockerfile == task / "environment" / "Dockerfile"


def test_unknown_keys_are_listed(tmp_path: Path) -> None:
    task = write_task(
        tmp_path, "extra", toml='colour = "red"\n[environment]\ndocker_image = "i"\nsize = 3\n'
    )
    assert load_task(task).unknown_keys == ("colour", "environment.size")


@pytest.mark.parametrize(
    ("line", "notes"),
    [
        ("", ()),
        ('multi_step_reward_mode = "aggregate"', ()),
        (
            'multi_step_reward_mode = "max"',
            (
                "multi_step_reward_mode = 'max' is a pre-1.3 key and was dropped; the task "
                "rolls up with multi_step_reward_strategy = 'mean'",
            ),
        ),
    ],
)
def test_legacy_reward_mode_is_dropped_with_a_note_unless_aggregate(
    tmp_path: Path, line: str, notes: tuple[str, ...]
) -> None:
    task = write_task(tmp_path, "legacy", toml=f'{line}\n[environment]\ndocker_image = "i"\n')
    loaded = load_task(task)
    assert loaded.notes == notes
    assert loaded.config.multi_step_reward_strategy is None
    assert "multi_step_reward_mode" not in loaded.config.model_dump()


def test_a_task_reads_no_host_variable_unless_given_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A template reads only the host variables handed to load_task (a run hands it those
    the host_env setting names): a dataset from elsewhere cannot copy the host's."""
    monkeypatch.setenv("HARBOR_T_HOST_ONLY", "from the host")
    task = write_task(
        tmp_path,
        "copier",
        toml="""
            [environment]
            docker_image = "img"
            env = { COPIED = "${HARBOR_T_HOST_ONLY:-not given}" }
            [verifier]
            env = { ALSO = "${HARBOR_T_HOST_ONLY:-not given}" }
        """,
    )
    loaded = load_task(task)
    assert loaded.config.environment.env == {"COPIED": "not given"}
    assert loaded.config.verifier.env == {"ALSO": "not given"}
    given = load_task(task, variables=TemplateSources(host={"HARBOR_T_HOST_ONLY": "allowed"}))
    assert given.config.environment.env == {"COPIED": "allowed"}


@pytest.mark.parametrize("table", ["environment", "solution", "verifier.environment"])
def test_a_secrets_value_never_reaches_a_table_of_the_agents(tmp_path: Path, table: str) -> None:
    """By its name as a host variable or however else: a value that holds a secret's, in a
    table the agent's sandbox (or a separate verifier's image) gets, is refused."""
    image = '[environment]\ndocker_image = "img"\n'
    tables = {
        "environment": image + 'env = { K = "${MY_VAR}" }\n',
        "solution": image + '[solution]\nenv = { K = "${MY_VAR}" }\n',
        "verifier.environment": (
            image + '[verifier.environment]\ndocker_image = "img"\nenv = { K = "${MY_VAR}" }\n'
        ),
    }
    task = write_task(tmp_path, "leaker", toml=tables[table])
    settings = HarborSettings(secrets={"API_TOKEN": "s3cret-value"}, host_env=["MY_VAR"])
    with pytest.raises(TaskLoadError, match=r"would give the secret API_TOKEN") as raised:
        load_task(task, variables=settings.template_sources({"MY_VAR": "s3cret-value"}))
    assert raised.value.key == f"{table}.env.K"


@pytest.mark.parametrize(
    ("table", "user", "words"),
    [
        ("agent", "65533", "keep-alive"),
        ("verifier", "nobody:65533", "keep-alive"),
        ("agent", "a user", "user name or uid"),
        ("verifier", "a:b:c", "user name or uid"),
        ("agent", "4294967295", "at most"),
    ],
)
def test_a_user_the_engine_will_not_run_as_is_refused_by_file_and_key(
    tmp_path: Path, table: str, user: str, words: str
) -> None:
    """An allow-list of names and numbers; never the id of the sandbox's keep-alive."""
    toml = f'[{table}]\nuser = "{user}"\n[environment]\ndocker_image = "img"\n'
    task = write_task(tmp_path, "users", toml=toml)
    with pytest.raises(TaskLoadError, match=words) as raised:
        load_task(task)
    assert raised.value.key == f"{table}.user"
    assert "task.toml" in str(raised.value)


def test_a_steps_workdir_healthcheck_and_artifacts_reach_its_turn(tmp_path: Path) -> None:
    task_dir = write_task(
        tmp_path,
        "stepped",
        toml=(
            'artifacts = ["/app/all.txt"]\n[environment]\ndocker_image = "debian"\n'
            '[[steps]]\nname = "a"\nartifacts = ["/app/a.txt"]\n'
            '[steps.healthcheck]\ncommand = "true"\n'
            '[[steps]]\nname = "b"\n'
        ),
        extra_files={
            "steps/a/instruction.md": "a\n",
            "steps/a/workdir/setup.sh": "true\n",
            "steps/b/instruction.md": "b\n",
            "steps/b/setup.sh": "true\n",  # beside workdir/: not run, as in Harbor
        },
    )
    task = load_task(task_dir)
    first, second = task.turns
    assert first.workdir_dir == task_dir / "steps" / "a" / "workdir"
    assert first.setup_script == task_dir / "steps" / "a" / "workdir" / "setup.sh"
    assert first.healthcheck is not None and first.healthcheck.command == "true"
    assert [artifact.source for artifact in first.artifacts] == ["/app/all.txt", "/app/a.txt"]
    assert second.workdir_dir is None and second.setup_script is None
    assert [artifact.source for artifact in second.artifacts] == ["/app/all.txt"]
    assert task.notes == (
        "steps/b/setup.sh is not run: a step's set-up script is steps/b/workdir/setup.sh",
    )
