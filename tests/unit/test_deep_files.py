"""Reading a task never fails the run: a task.toml, a dataset.toml or a task_data.json
nested past what a recursive parser survives is a refusal naming the file, decided before
any parser reads it; a loader that fails for another reason is a refusal of that task
alone; the bounded TOML reader is total."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_harbor.run import planning
from pytest_harbor.run.planning import plan_taskset
from pytest_harbor.sandboxes.docker import DockerProvider
from pytest_harbor.tasks import TaskLoadError, load_task
from pytest_harbor.untrusted import MOST_TOML_BYTES, load_toml
from tests.fixtures import write_task

DEEP_TOML = '[environment]\ndocker_image = "x"\n[metadata]\nx = ' + "[" * 20_000 + "]" * 20_000


def test_a_task_toml_nested_20000_deep_is_refused_naming_it(tmp_path: Path) -> None:
    task = write_task(tmp_path, "deep", toml=DEEP_TOML)
    with pytest.raises(TaskLoadError) as caught:
        load_task(task)
    assert str(caught.value).startswith(f"{task / 'task.toml'}: nests arrays or tables deeper")


def test_a_task_data_json_nested_100000_deep_is_refused_naming_it(tmp_path: Path) -> None:
    task = write_task(
        tmp_path, "deep", extra_files={"task_data.json": "[" * 100_000 + "]" * 100_000}
    )
    with pytest.raises(TaskLoadError) as caught:
        load_task(task)
    assert str(caught.value).startswith(f"{task / 'task_data.json'}: nests arrays or objects")


def test_a_dataset_toml_nested_20000_deep_is_refused_naming_it(tmp_path: Path) -> None:
    write_task(tmp_path, "canary")
    (tmp_path / "dataset.toml").write_text("[gym]\nx = " + "[" * 20_000 + "]" * 20_000)
    with pytest.raises(TaskLoadError) as caught:
        plan_taskset(
            tmp_path, harness="nop", capabilities=DockerProvider.capabilities, provider="docker"
        )
    assert str(caught.value).startswith(f"{tmp_path / 'dataset.toml'}: nests arrays or tables")


def test_a_task_that_fails_to_load_any_other_way_is_refused_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever a loader raises at the boundary is that task's refusal, naming its file;
    the dataset's other tasks are planned."""
    write_task(tmp_path, "canary")
    broken = write_task(tmp_path, "broken")
    real = planning.load_task

    def load(path: Path, **kwargs: object) -> object:
        if path.name == "broken":
            raise RecursionError("maximum recursion depth exceeded")
        return real(path, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(planning, "load_task", load)
    plan = plan_taskset(
        tmp_path, harness="nop", capabilities=DockerProvider.capabilities, provider="docker"
    )
    assert [task.id for task in plan.tasks] == ["canary"]
    assert str(plan.failures[broken]) == (
        f"{broken / 'task.toml'}: could not be loaded: RecursionError: maximum recursion "
        "depth exceeded"
    )


def test_toml_is_read_with_its_strings_and_comments_holding_brackets() -> None:
    text = (
        'a = "[[[[" # [[[[\nb = [[1], [2]]\nc = """\n[[[\\""""\n'
        "d = '''[[['''\ne = '[[['\n[t]\nx = {y = [1]}\n[[arr]]\nz = 1\n"
    )
    assert load_toml(text.encode()).value == {
        "a": "[[[[",
        "b": [[1], [2]],
        "c": '[[["',
        "d": "[[[",
        "e": "[[[",
        "t": {"x": {"y": [1]}},
        "arr": [{"z": 1}],
    }
    assert load_toml(b"x = " + b"[" * 100 + b"]" * 100).error is None
    assert load_toml(b"x = " + b"[" * 101 + b"]" * 101).error is not None
    assert load_toml(b"x = 1\n" + b"#" * MOST_TOML_BYTES).error == (
        f"is larger than {MOST_TOML_BYTES} bytes"
    )
    assert "not UTF-8" in str(load_toml(b"x = '\xff'").error)
    assert "not valid TOML" in str(load_toml(b"x = = 1").error)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000) | st.text(alphabet="[]{}\"'#=\n abc,.1", max_size=3000))
def test_toml_reading_is_total(data: bytes | str) -> None:
    raw = data.encode() if isinstance(data, str) else data
    parsed = load_toml(raw)
    assert (parsed.value is None) != (parsed.error is None)
    assert parsed.value is None or isinstance(parsed.value, dict)
