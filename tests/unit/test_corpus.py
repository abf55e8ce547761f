"""The malformed corpus: one broken task or dataset folder per rule, each with the exact
message a user gets (`expected.txt`, with `{task}` / `{dataset}` for the folder)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_harbor.engine.admission import refuse_unrunnable
from pytest_harbor.engine.planning import plan_taskset
from pytest_harbor.sandboxes.docker import DockerProvider
from pytest_harbor.tasks import TaskLoadError, load_task
from tests.fixtures import write_task

CORPUS = Path(__file__).parent.parent / "corpus"
TASKS = sorted((CORPUS / "malformed").iterdir())
DATASETS = sorted((CORPUS / "datasets").iterdir())


def expected(folder: Path, placeholder: str) -> str:
    return (folder / "expected.txt").read_text().strip().replace(placeholder, str(folder))


@pytest.mark.parametrize("folder", TASKS, ids=[folder.name for folder in TASKS])
def test_malformed_task_is_refused_with_its_message(folder: Path) -> None:
    with pytest.raises(TaskLoadError) as caught:
        task = load_task(folder, environ={})
        refuse_unrunnable(task, DockerProvider.capabilities, "docker")
    assert str(caught.value) == expected(folder, "{task}")


@pytest.mark.parametrize("folder", DATASETS, ids=[folder.name for folder in DATASETS])
def test_malformed_dataset_is_refused_with_its_message(folder: Path) -> None:
    with pytest.raises(TaskLoadError) as caught:
        plan = plan_taskset(
            folder, harness="nop", capabilities=DockerProvider.capabilities, provider="docker"
        )
        for failure in plan.failures.values():
            raise failure
    assert str(caught.value) == expected(folder, "{dataset}")


def test_a_symlinked_task_folder_is_refused(tmp_path: Path) -> None:
    real = write_task(tmp_path / "real", "task")
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(TaskLoadError) as caught:
        load_task(tmp_path / "link")
    assert str(caught.value) == f"{tmp_path / 'link'}: a task folder must not be a symlink"


@pytest.mark.parametrize("where", ["tests/data", "deep/er/data", "solution/lib"])
def test_a_folder_symlink_inside_a_task_is_refused(tmp_path: Path, where: str) -> None:
    task = write_task(tmp_path, "task")
    outside = tmp_path / "outside"
    outside.mkdir()
    link = task / where
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(outside, link)
    with pytest.raises(TaskLoadError) as caught:
        load_task(task)
    assert str(caught.value) == f"{link}: a task folder must not hold a symlink to a folder"
