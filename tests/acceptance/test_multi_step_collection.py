"""Multi-step tasks as pytest sees them: ids, order, selection that brings earlier steps,
the skip reasons and the xdist modes refused. No sandbox starts here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

STEPS = ("01-first", "02-second", "03-third")


def multi_step_task(root: Path, name: str = "story", solutions: tuple[str, ...] = STEPS) -> Path:
    task = root / "tasks" / name
    (task / "tests").mkdir(parents=True)
    (task / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (task / "instruction.md").write_text("Never sent.\n")
    steps = "".join(f'[[steps]]\nname = "{step}"\n' for step in STEPS)
    (task / "task.toml").write_text(f'{steps}[environment]\ndocker_image = "img"\n')
    for step in STEPS:
        (task / "steps" / step).mkdir(parents=True)
        (task / "steps" / step / "instruction.md").write_text(f"Do {step}.\n")
        if step in solutions:
            (task / "steps" / step / "solution").mkdir()
            (task / "steps" / step / "solution" / "solve.sh").write_text("true\n")
    return task.parent


def test_one_item_per_step_in_declared_order(pytester: pytest.Pytester) -> None:
    dataset = multi_step_task(pytester.path)
    result = pytester.runpytest(f"--harbor-dataset={dataset}", "--co", "-q")
    result.stdout.fnmatch_lines(
        [f"tasks/story::r0::{step}" for step in STEPS] + ["3 tests collected*"]
    )


def test_selecting_a_later_step_brings_the_earlier_ones(pytester: pytest.Pytester) -> None:
    dataset = multi_step_task(pytester.path)
    multi_step_task(pytester.path, "other")
    result = pytester.runpytest(
        f"--harbor-dataset={dataset}", "-k", "story and 02-second", "--co", "-q"
    )
    result.stdout.fnmatch_lines(
        [
            "tasks/story::r0::01-first",
            "tasks/story::r0::02-second",
            "2/6 tests collected (4 deselected)*",
        ]
    )
    result.stdout.no_fnmatch_line("*03-third*")


def test_random_order_cannot_split_or_reorder_a_trial(pytester: pytest.Pytester) -> None:
    dataset = multi_step_task(pytester.path)
    pytester.makeconftest(
        """
        import pytest

        @pytest.hookimpl(trylast=True)
        def pytest_collection_modifyitems(items):
            items.reverse()  # as a shuffling plugin might
        """
    )
    result = pytester.runpytest(f"--harbor-dataset={dataset}", "--harbor-repeats=2", "--co", "-q")
    lines = [line for line in result.stdout.lines if "::r" in line]
    assert lines == [f"tasks/story::r1::{step}" for step in STEPS] + [
        f"tasks/story::r0::{step}" for step in STEPS
    ]


def test_a_step_without_a_solution_leaves_every_step_unvalidated(pytester: pytest.Pytester) -> None:
    dataset = multi_step_task(pytester.path, solutions=("01-first", "03-third"))
    result = pytester.runpytest(f"--harbor-dataset={dataset}", "-rs")
    result.assert_outcomes(skipped=3)
    result.stdout.fnmatch_lines(
        ["*SKIPPED [[]3[]] tasks/story/task.toml: unvalidated: step '02-second' has no solve.sh*"]
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # nothing validated


def test_the_top_level_solution_covers_steps_without_a_folder(pytester: pytest.Pytester) -> None:
    dataset = multi_step_task(pytester.path, solutions=("01-first",))
    story = dataset / "story"
    (story / "solution").mkdir()
    (story / "solution" / "solve.sh").write_text("true\n")
    # A step folder's own solution/ without solve.sh is that step's missing answer.
    (story / "steps" / "03-third" / "solution").mkdir()
    result = pytester.runpytest(f"--harbor-dataset={dataset}", "-rs")
    result.stdout.fnmatch_lines(["*unvalidated: step '03-third' has no solve.sh*"])


def test_materialized_row_has_one_instruction_per_turn(pytester: pytest.Pytester) -> None:
    dataset = multi_step_task(pytester.path, solutions=())
    pytester.runpytest(f"--harbor-dataset={dataset}")
    (row,) = [
        json.loads(line)
        for line in (pytester.path / "results/harbor/validation/tasks/latest/tasks_oracle.jsonl")
        .read_text()
        .splitlines()
    ]
    assert "instruction" not in row
    assert row["turns"] == [{"step": step, "instruction": f"Do {step}.\n"} for step in STEPS]


@pytest.mark.parametrize("mode", ["worksteal", "loadgroup"])
def test_xdist_modes_that_could_split_a_trial_are_refused(
    pytester: pytest.Pytester, mode: str
) -> None:
    dataset = multi_step_task(pytester.path)
    result = pytester.runpytest(f"--harbor-dataset={dataset}", "-n", "2", "--dist", mode)
    result.stderr.fnmatch_lines([f"*--dist {mode} may split the turns of a trial across workers*"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR
