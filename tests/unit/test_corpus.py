"""The malformed corpus: one broken task or dataset folder per rule, each with the exact
message a user gets (`expected.txt`, with `{task}` / `{dataset}` for the folder)."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from pytest_harbor.engine.admission import refuse_unrunnable
from pytest_harbor.run.planning import plan_taskset
from pytest_harbor.sandboxes.archives import pack_folder
from pytest_harbor.sandboxes.docker import DockerProvider
from pytest_harbor.tasks import TaskLoadError, load_task
from pytest_harbor.templates import TemplateSources
from tests.fixtures import write_task

CORPUS = Path(__file__).parent.parent / "corpus"
TASKS = sorted((CORPUS / "malformed").iterdir())
DATASETS = sorted((CORPUS / "datasets").iterdir())


def expected(folder: Path, placeholder: str) -> str:
    return (folder / "expected.txt").read_text().strip().replace(placeholder, str(folder))


@pytest.mark.parametrize("folder", TASKS, ids=[folder.name for folder in TASKS])
def test_malformed_task_is_refused_with_its_message(folder: Path) -> None:
    with pytest.raises(TaskLoadError) as caught:
        task = load_task(folder, variables=TemplateSources())
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


@pytest.mark.parametrize(
    "where", ["instruction.md", "tests/test.sh", "solution/data.txt", "environment/secret"]
)
def test_a_file_symlink_leading_out_of_the_task_is_refused(tmp_path: Path, where: str) -> None:
    task = write_task(tmp_path, "task", dockerfile=None)
    outside = tmp_path / "host-secret"
    outside.write_text("do not read me\n")
    link = task / where
    link.parent.mkdir(parents=True, exist_ok=True)
    link.unlink(missing_ok=True)
    os.symlink(outside, link)
    with pytest.raises(TaskLoadError) as caught:
        load_task(task)
    assert str(caught.value) == (
        f"{link}: is a symlink to {outside}, outside the task folder: copy the file in"
    )


def test_a_dangling_file_symlink_is_refused(tmp_path: Path) -> None:
    task = write_task(tmp_path, "task")
    link = task / "tests" / "data.txt"
    os.symlink(task / "tests" / "nothing", link)
    with pytest.raises(TaskLoadError) as caught:
        load_task(task)
    assert str(caught.value) == (
        f"{link}: is a symlink to {task / 'tests' / 'nothing'}, which is not a file"
    )


def test_a_file_symlink_inside_the_task_is_its_target_for_digest_and_upload(
    tmp_path: Path,
) -> None:
    linked = write_task(tmp_path / "a", "task", test_sh="echo real\n")
    (linked / "tests" / "shared.sh").write_text("echo shared\n")
    (linked / "tests" / "alias.sh").symlink_to("shared.sh")
    copied = write_task(tmp_path / "b", "task", test_sh="echo real\n")
    (copied / "tests" / "shared.sh").write_text("echo shared\n")
    (copied / "tests" / "alias.sh").write_text("echo shared\n")
    assert load_task(linked).digest == load_task(copied).digest
    with tarfile.open(fileobj=io.BytesIO(pack_folder(linked / "tests"))) as archive:
        member = archive.getmember("alias.sh")
        assert member.isreg()
        extracted = archive.extractfile(member)
        assert extracted is not None and extracted.read() == b"echo shared\n"
