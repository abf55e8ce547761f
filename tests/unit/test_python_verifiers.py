"""Python verifiers without a sandbox: which grader a turn gets, the task's fields, the
dataset's shared files and their digests, the files shipped, and the runner's rules for
calling verify() and writing its reward (run here on this machine's Python)."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from pytest_harbor.engine.python_verifiers import contract_error, verifier_files
from pytest_harbor.tasks import load_task
from pytest_harbor.tasks.dataset import DatasetFiles
from pytest_harbor.tasks.digest import task_digest
from pytest_harbor.tasks.errors import TaskLoadError
from pytest_harbor.writers.manifest import dataset_digest
from tests.fixtures import REPO_ROOT, write_task

RUNNER = REPO_ROOT / "pytest_harbor" / "engine" / "sandbox_python" / "run_verifier.py"


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("run_verifier_under_test", RUNNER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "LOGS", tmp_path)
    monkeypatch.setattr(module, "HERE", tmp_path)
    return module


def python_only(tmp_path: Path, name: str = "py", **files: str) -> Path:
    task = write_task(tmp_path, name, test_sh="")
    (task / "tests" / "test.sh").unlink()
    for relative, text in {"tests/verifier.py": "def verify():\n    return 1\n", **files}.items():
        (task / relative.replace("__", "/")).parent.mkdir(parents=True, exist_ok=True)
        (task / relative.replace("__", "/")).write_text(text)
    return task


# ---------------------------------------------------------------------------- graders


def test_test_sh_wins_then_verifier_py_then_the_datasets_for_a_task_without_tests(
    tmp_path: Path,
) -> None:
    shared = DatasetFiles(verifier=b"def verify():\n    return 1\n", task_data_model=b"x = 1\n")
    both = python_only(tmp_path, "both", **{"tests/test.sh": "echo 1\n"})
    assert load_task(both, dataset_files=shared).turns[0].python_verifier is None
    own = load_task(python_only(tmp_path, "own"), dataset_files=shared).turns[0].python_verifier
    assert own is not None and own.module == "/tests/verifier.py"
    assert dict(own.files) == {"task_data.py": b"x = 1\n"}
    bare = write_task(tmp_path, "bare")
    for entry in (bare / "tests").iterdir():
        entry.unlink()
    (bare / "tests").rmdir()
    (bare / "task_data.json").write_text('{"expected": 42}')
    loaded = load_task(bare, dataset_files=shared)
    shared_verifier = loaded.turns[0].python_verifier
    assert shared_verifier is not None and shared_verifier.module == "/tests/.harbor/verifier.py"
    assert shared_verifier.files["verifier.py"] == shared.verifier
    assert shared_verifier.task_data == {"expected": 42}
    # Without the dataset's verifier, a task without tests/ has no grader.
    with pytest.raises(TaskLoadError, match="missing: the verifier script is required"):
        load_task(bare)


def test_a_step_is_graded_by_a_verifier_py_in_its_tests_or_the_tasks(tmp_path: Path) -> None:
    task = write_task(
        tmp_path,
        "stepped",
        toml=(
            '[environment]\ndocker_image = "debian"\n[[steps]]\nname = "a"\n[[steps]]\nname = "b"\n'
        ),
        test_sh="",
        extra_files={
            "steps/a/instruction.md": "a\n",
            "steps/a/tests/verifier.py": "def verify():\n    return 1\n",
            "steps/b/instruction.md": "b\n",
            "steps/b/tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
        },
    )
    (task / "tests" / "test.sh").unlink()
    first, second = load_task(task).turns
    assert first.python_verifier is not None and second.python_verifier is None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[1, 2]", "must hold a JSON object, not list"),
        ("{nope", "not valid JSON"),
        ("\udcff", "not valid JSON"),
    ],
)
def test_task_data_that_is_not_a_json_object_is_refused_naming_the_file(
    tmp_path: Path, content: str, message: str
) -> None:
    task = python_only(tmp_path)
    (task / "task_data.json").write_bytes(content.encode("utf-8", "surrogateescape"))
    with pytest.raises(TaskLoadError) as caught:
        load_task(task)
    assert str(caught.value).startswith(f"{task / 'task_data.json'}: {message}")


def test_task_data_counts_in_the_task_digest_and_shared_files_in_the_datasets(
    tmp_path: Path,
) -> None:
    task = python_only(tmp_path)
    before = task_digest(task)
    (task / "task_data.json").write_text('{"expected": 1}')
    assert task_digest(task) != before
    assert DatasetFiles().digest is None
    one = DatasetFiles(verifier=b"a").digest
    assert one is not None and one != DatasetFiles(verifier=b"b").digest
    assert one != DatasetFiles(task_data_model=b"a").digest
    assert dataset_digest({"t": "d"}) != dataset_digest({"t": "d"}, one)


def test_a_shared_file_that_is_a_link_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.py"
    outside.write_text("def verify():\n    return 1\n")
    root = tmp_path / "dataset"
    root.mkdir()
    os.symlink(outside, root / "verifier.py")
    with pytest.raises(TaskLoadError) as caught:
        DatasetFiles.read(root)
    assert str(caught.value) == (
        f"{root / 'verifier.py'}: must not be a symlink: it is shipped into sandboxes"
    )


# ---------------------------------------------------------------------------- shipped files


def test_the_files_shipped_hold_the_runner_the_settings_and_the_response(tmp_path: Path) -> None:
    task = python_only(tmp_path)
    (task / "task_data.json").write_text('{"n": 1}')
    turn = load_task(task, dataset_files=DatasetFiles(task_data_model=b"m\n")).turns[0]
    files = verifier_files(turn, "Paris.")
    assert sorted(files) == [
        "tests/.harbor/harbor_verifiers/__init__.py",
        "tests/.harbor/response.json",
        "tests/.harbor/run_verifier.py",
        "tests/.harbor/task_data.py",
        "tests/.harbor/verifier.json",
        "tests/test.sh",
    ]
    assert json.loads(files["tests/.harbor/verifier.json"]) == {
        "verifier": "/tests/verifier.py",
        "task_data": {"n": 1},
    }
    assert json.loads(files["tests/.harbor/response.json"])["output_text"] == "Paris."
    assert "tests/.harbor/response.json" not in verifier_files(turn, None)
    plain = load_task(write_task(tmp_path, "plain")).turns[0]
    assert verifier_files(plain, "x") == {}


def test_a_contract_error_is_read_from_the_copied_folder(tmp_path: Path) -> None:
    assert contract_error(tmp_path) is None
    (tmp_path / "contract-error.txt").write_text("verify() requires 'x'\n")
    assert contract_error(tmp_path) == "verify() requires 'x'"


# ---------------------------------------------------------------------------- the runner


def test_verify_gets_only_what_it_declares_positional_only_by_position(
    runner: ModuleType,
) -> None:
    given = {"workspace": "W", "task_data": {"a": 1}, "response": {"r": 1}, "state": {}}

    def keyword(workspace: str, task_data: Any) -> None: ...

    assert runner._arguments(keyword, given, True) == (
        [],
        {"workspace": "W", "task_data": {"a": 1}},
    )

    def positional(workspace: str, /, state: Any) -> None: ...

    assert runner._arguments(positional, given, True) == (["W"], {"state": {}})

    def extra(workspace: str, **rest: Any) -> None: ...

    assert runner._arguments(extra, given, True) == ([], {"workspace": "W"})


def test_what_verify_cannot_be_given_is_a_contract_error(runner: ModuleType) -> None:
    given = {"workspace": "W", "task_data": {}, "response": None, "state": {}}

    def needs_response(response: Any) -> None: ...

    with pytest.raises(runner.ContractError, match="requires `response`, and this turn has none"):
        runner._arguments(needs_response, given, False)

    def optional_response(response: Any = "default") -> None: ...

    assert runner._arguments(optional_response, given, False) == ([], {})

    def unknown(workspace: str, config: Any) -> None: ...

    with pytest.raises(runner.ContractError, match="requires 'config'; it may declare only"):
        runner._arguments(unknown, given, True)

    def gap(response: Any = None, /, workspace: str = "") -> None: ...

    assert runner._arguments(gap, given, False) == ([], {"workspace": "W"})

    def gap_by_position(response: Any = None, workspace: str = "", /) -> None: ...

    with pytest.raises(runner.ContractError, match="by position after one it lacks"):
        runner._arguments(gap_by_position, given, False)


@pytest.mark.parametrize(
    ("returned", "file", "content"),
    [
        (1, "reward.txt", "1.0\n"),
        (0.25, "reward.txt", "0.25\n"),
        (True, "reward.txt", "1.0\n"),
        ({"reward": 1, "style": 0.5}, "reward.json", '{"reward": 1.0, "style": 0.5}\n'),
    ],
)
def test_a_number_becomes_reward_txt_and_a_dict_reward_json(
    runner: ModuleType, tmp_path: Path, returned: object, file: str, content: str
) -> None:
    runner._write_reward(returned)
    assert (tmp_path / file).read_text() == content


@pytest.mark.parametrize(
    "returned", ["1", None, float("nan"), float("inf"), {}, {"reward": "1"}, {1: 1.0}, [1.0]]
)
def test_a_return_that_is_no_reward_is_a_contract_error(
    runner: ModuleType, tmp_path: Path, returned: object
) -> None:
    with pytest.raises(runner.ContractError):
        runner._write_reward(returned)
    assert not list(tmp_path.glob("reward.*"))


def test_task_data_is_typed_by_the_datasets_model_and_unknown_fields_fail(
    runner: ModuleType, tmp_path: Path
) -> None:
    assert runner._task_data({"n": "1"}) == {"n": "1"}  # no task_data.py: as read
    (tmp_path / "task_data.py").write_text(
        "from pydantic import BaseModel\n\n\nclass TaskData(BaseModel):\n    n: int\n"
    )
    assert runner._task_data({"n": "1"}) == {"n": 1}
    with pytest.raises(runner.ContractError, match="fields TaskData lacks: extra"):
        runner._task_data({"n": 1, "extra": 2})
    with pytest.raises(runner.ContractError, match="does not fit TaskData"):
        runner._task_data({"n": "many"})
    (tmp_path / "task_data.py").write_text("import not_installed_anywhere\n")
    assert runner._task_data({"n": "1"}) == {"n": "1"}  # not applied where it cannot be
