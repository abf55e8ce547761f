"""Check mode's findings from test reports: each problem kind, grouped and worded for the
table, check.json, and the items `--lf` runs again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_harbor.engine import EpisodeResult
from pytest_harbor.engine.results import TurnResult, TurnTimings
from pytest_harbor.plugin.checks import Problem, TaskCheck
from pytest_harbor.tasks import Task
from pytest_harbor.tasks.loader import load_task
from tests.fixtures import write_task

SET = "demo"


def _row(task: str, repeat: int, rewards: list[float], **extra: Any) -> dict[str, Any]:
    timings = extra.pop("timings", {})
    turns = [
        TurnResult(
            step=f"s{index}" if len(rewards) > 1 else "episode",
            reward=reward,
            timings=TurnTimings(**timings),
        )
        for index, reward in enumerate(rewards)
    ]
    fields: dict[str, Any] = {"solution_exit_code": 0}
    fields.update(extra)
    return EpisodeResult(
        task_id=task,
        taskset=SET,
        repeat=repeat,
        agent="oracle",
        reward=rewards[-1],
        turns=turns,
        **fields,
    ).model_dump(mode="json")


def _report(nodeid: str, when: str, outcome: str = "passed", **data: Any) -> pytest.TestReport:
    report = pytest.TestReport(nodeid, ("x", 0, nodeid), {}, outcome, None, when)  # type: ignore[arg-type]
    report.harbor = {"taskset": SET, **data}  # type: ignore[attr-defined]
    return report


def _episode(
    check: TaskCheck, task: str, trial: str, row: dict[str, Any] | None = None, **data: Any
) -> None:
    nodeid = f"{SET}/{task}::{trial}::episode"
    check.add(_report(nodeid, "setup"))
    if row is not None:
        check.add(_report(nodeid, "call", result=row, status="passed"))
    else:
        check.add(_report(nodeid, "call", "failed", **data))


@pytest.fixture
def task(tmp_path: Path) -> Task:
    folder = write_task(
        tmp_path,
        "t",
        toml="[agent]\ntimeout_sec = 10\n[verifier]\ntimeout_sec = 20\n"
        '[environment]\ndocker_image = "img"\n',
    )
    return load_task(folder)


def _problems(check: TaskCheck, task: Task | None = None, name: str = "t") -> list[Problem]:
    tasks = {(SET, name): task} if task is not None else {}
    return check.problems(tasks)[(SET, name)]  # type: ignore[arg-type]


def test_a_sound_task_has_no_problem(task: Task) -> None:
    check = TaskCheck(repeats=2)
    _episode(check, "t", "r0", _row("t", 0, [1.0]))
    _episode(check, "t", "r1", _row("t", 1, [1.0]))
    _episode(check, "t", "nop", _row("t", 0, [0.0]))
    assert _problems(check, task) == []


def test_failed_oracle_runs_are_grouped_by_what_they_scored(task: Task) -> None:
    check = TaskCheck(repeats=3)
    _episode(check, "t", "r0", _row("t", 0, [0.0]))
    _episode(check, "t", "r1", _row("t", 1, [1.0], solution_exit_code=2))
    _episode(check, "t", "r2", _row("t", 2, [0.0]))
    found = _problems(check, task)
    assert Problem("oracle-failed", "2 of 3 runs (r0, r2): reward 0, solve.sh exit 0") in found
    assert Problem("oracle-failed", "1 of 3 runs (r1): reward 1, solve.sh exit 2") in found


def test_rewards_that_differ_across_repeats_are_a_flaky_verifier(task: Task) -> None:
    check = TaskCheck(repeats=3)
    for repeat, reward in enumerate([1.0, 0.5, 1.0]):
        _episode(check, "t", f"r{repeat}", _row("t", repeat, [reward]))
    assert Problem("flaky-verifier", "rewards differ across 3 oracle runs: 1, 0.5, 1") in _problems(
        check, task
    )


def test_a_multi_step_task_names_its_flaky_step() -> None:
    check = TaskCheck(repeats=2)
    _episode(check, "m", "r0", _row("m", 0, [1.0, 1.0]))
    _episode(check, "m", "r1", _row("m", 1, [1.0, 0.0]))
    found = _problems(check, name="m")
    assert Problem("flaky-verifier", "step s1: rewards differ across 2 oracle runs: 1, 0") in found
    assert not any(problem.detail.startswith("step s0") for problem in found)


def test_one_repeat_cannot_be_flaky(task: Task) -> None:
    check = TaskCheck(repeats=1)
    _episode(check, "t", "r0", _row("t", 0, [0.0]))
    assert [p.kind for p in _problems(check, task)] == ["oracle-failed"]


def test_an_empty_agent_that_passes_is_named(task: Task) -> None:
    check = TaskCheck(repeats=1)
    _episode(check, "t", "r0", _row("t", 0, [1.0]))
    _episode(check, "t", "nop", _row("t", 0, [1.0]))
    assert _problems(check, task) == [
        Problem(
            "nop-passes",
            "an agent that does nothing scores 1: the verifier accepts the sandbox as the task "
            "leaves it",
        )
    ]


def test_slow_oracle_runs_against_each_timeout(task: Task) -> None:
    check = TaskCheck(repeats=2)
    _episode(check, "t", "r0", _row("t", 0, [1.0], timings={"agent_s": 4.0, "verify_s": 11.0}))
    _episode(check, "t", "r1", _row("t", 1, [1.0], timings={"agent_s": 6.5, "verify_s": 2.0}))
    assert _problems(check, task) == [
        Problem("slow-oracle", "solve.sh took 6.5 s of its 10 s timeout"),
        Problem("slow-oracle", "the verifier took 11.0 s of its 20 s timeout"),
    ]


def test_no_solution_no_result_and_load_warnings(tmp_path: Path) -> None:
    folder = write_task(
        tmp_path, "w", toml='[environment]\ndocker_image = "img"\ncpu = 1\n', solve_sh=None
    )
    task = load_task(folder)
    check = TaskCheck(repeats=1)
    nodeid = f"{SET}/w::r0::episode"
    check.add(
        _report(
            nodeid,
            "setup",
            "skipped",
            unvalidated=True,
            skip_reason="unvalidated: the task has no solution/solve.sh",
        )
    )
    _episode(
        check,
        "w",
        "nop",
        None,
        status="error",
        failure={"kind": "sandbox_error", "reason": "the engine went away"},
    )
    found = check.problems({(SET, "w"): task})[(SET, "w")]
    assert found == [
        Problem(
            "load-warning",
            "task.toml: unknown key ignored: environment.cpu (line 3): did you mean "
            "environment.cpus?",
        ),
        Problem("no-solution", "unvalidated: the task has no solution/solve.sh"),
        Problem("no-result", "nop: sandbox_error: the engine went away"),
    ]


def test_a_worker_that_died_leaves_no_result(task: Task) -> None:
    check = TaskCheck(repeats=1)
    nodeid = f"{SET}/t::r0::episode"
    check.add(_report(nodeid, "setup"))
    check.add(
        pytest.TestReport(nodeid, ("x", 0, nodeid), {}, "failed", "worker 'gw0' crashed", "???")
    )  # type: ignore[arg-type]
    assert [p.kind for p in _problems(check, task)] == ["no-result"]


def test_check_json_and_the_items_lf_runs_again(tmp_path: Path, task: Task) -> None:
    check = TaskCheck(repeats=2)
    _episode(check, "t", "r0", _row("t", 0, [1.0]))
    _episode(check, "t", "r1", _row("t", 1, [1.0]))
    _episode(check, "t", "nop", _row("t", 0, [1.0]))
    _episode(check, "ok", "r0", _row("ok", 0, [1.0]))
    _episode(check, "ok", "r1", _row("ok", 1, [1.0]))
    _episode(check, "ok", "nop", _row("ok", 0, [0.0]))
    problems = check.problems({(SET, "t"): task})
    path = check.write(tmp_path / "check.json", SET, problems)
    data = json.loads(path.read_text())
    assert data["schema_version"] == 1 and data["repeats"] == 2
    assert data["tasks"]["ok"] == {
        "problems": [],
        "oracle_rewards": [1.0, 1.0],
        "nop_reward": 0.0,
        "probe_reward": None,
    }
    assert [p["kind"] for p in data["tasks"]["t"]["problems"]] == ["nop-passes"]
    assert sorted(check.failed_nodeids(problems)) == [
        f"{SET}/t::nop::episode",
        f"{SET}/t::r0::episode",
        f"{SET}/t::r1::episode",
    ]


def test_reports_of_other_items_are_ignored() -> None:
    check = TaskCheck(repeats=1)
    check.add(_report("tests/test_x.py::test_y", "call"))
    check.add(_report("demo/t::weird::episode", "call"))
    assert check.records == {}


def test_refused_folders_and_unloadable_tasks_are_problems(tmp_path: Path, task: Task) -> None:
    check = TaskCheck(repeats=1)
    nodeid = f"{SET}/t::r0::episode"
    check.add(_report(nodeid, "setup", "skipped", unloadable="the image did not build"))
    problems = check.problems({(SET, "t"): task}, {(SET, "bad"): "task.toml: not TOML"})
    assert problems == {
        (SET, "bad"): [Problem("refused", "task.toml: not TOML")],
        (SET, "t"): [Problem("no-result", "oracle r0: unloadable: the image did not build")],
    }
    data = json.loads(check.write(tmp_path / "check.json", SET, problems).read_text())
    assert data["tasks"]["bad"] == {
        "problems": [{"kind": "refused", "detail": "task.toml: not TOML"}],
        "oracle_rewards": [],
        "nop_reward": None,
        "probe_reward": None,
    }
    assert list(check.failed_nodeids(problems)) == [nodeid]


def _probe_row(task: str, rewards: list[float], responses: list[dict[str, Any]]) -> dict[str, Any]:
    row = _row(task, 0, rewards)
    for turn, response in zip(row["turns"], responses, strict=True):
        turn["response"] = json.dumps(response)
    return row


def test_what_the_probe_found_is_a_problem_each_naming_its_evidence(task: Task) -> None:
    check = TaskCheck(repeats=1)
    _episode(check, "t", "r0", _row("t", 0, [1.0]))
    _episode(check, "t", "nop", _row("t", 0, [0.0]))
    findings = {
        "git": ["/app/.git"],
        "image": [{"file": "/opt/answer", "text": "the-answer-42"}],
        "created": ["/app/out.txt"],
    }
    _episode(check, "t", "probe", _probe_row("t", [1.0], [findings]))
    found = {p.kind: p.detail for p in _problems(check, task)}
    assert found["probe-scores"].startswith("an agent creating only /app/out.txt scores 1")
    assert found["git-history"].startswith("/app/.git: a git history an agent can read")
    assert "/opt/answer holds `the-answer-42`" in found["answer-in-image"]


def test_a_probe_that_created_nothing_or_scored_where_nop_did_adds_nothing(task: Task) -> None:
    check = TaskCheck(repeats=1)
    _episode(check, "t", "r0", _row("t", 0, [1.0, 1.0]))
    _episode(check, "t", "nop", _row("t", 0, [0.0, 1.0]))
    _episode(
        check, "t", "probe", _probe_row("t", [0.0, 1.0], [{"created": []}, {"created": ["/x"]}])
    )
    assert [p.kind for p in _problems(check, task)] == ["nop-passes"]


def test_a_masked_oracle_run_has_no_result_and_a_partial_one_is_not_scored(task: Task) -> None:
    check = TaskCheck(repeats=3)
    _episode(check, "t", "r0", _row("t", 0, [0.0], mask_sample=True, failure_reason="lost"))
    _episode(check, "t", "r1", _row("t", 1, [0.0], partial=True))
    _episode(check, "t", "r2", _row("t", 2, [0.0]))
    assert _problems(check, task) == [
        Problem("no-result", "oracle r0: masked: lost"),
        Problem("oracle-failed", "1 of 2 runs (r2): reward 0, solve.sh exit 0"),
    ]


def test_one_failed_oracle_run_is_the_run(task: Task) -> None:
    check = TaskCheck(repeats=1)
    _episode(
        check,
        "t",
        "r0",
        _row("t", 0, [0.0], failure_kind="verifier_timeout", failure_reason="20 s"),
    )
    assert _problems(check, task) == [
        Problem(
            "oracle-failed",
            "the run (r0): reward 0, solve.sh exit 0 (verifier_timeout: 20 s)",
        )
    ]


def test_an_empty_agent_passing_a_step_is_named_with_the_step() -> None:
    check = TaskCheck(repeats=1)
    _episode(check, "m", "r0", _row("m", 0, [1.0, 1.0]))
    _episode(check, "m", "nop", _row("m", 0, [1.0, 0.0]))
    assert _problems(check, name="m") == [
        Problem(
            "nop-passes",
            "an agent that does nothing scores 1 in step s0: the verifier accepts the sandbox "
            "as the task leaves it",
        )
    ]


def test_a_masked_empty_agent_is_not_named_but_still_excuses_the_probe() -> None:
    check = TaskCheck(repeats=1)
    _episode(check, "t", "r0", _row("t", 0, [1.0, 1.0]))
    _episode(check, "t", "nop", _row("t", 0, [0.0, 1.0], mask_sample=True))
    _episode(
        check, "t", "probe", _probe_row("t", [0.0, 1.0], [{"created": ["/x"]}, {"created": []}])
    )
    assert _problems(check) == []


def test_a_masked_probe_finds_nothing(task: Task) -> None:
    check = TaskCheck(repeats=1)
    _episode(check, "t", "r0", _row("t", 0, [1.0]))
    _episode(check, "t", "nop", _row("t", 0, [0.0]))
    row = _probe_row("t", [1.0], [{"created": ["/x"], "git": ["/app/.git"]}])
    row["mask_sample"] = True
    _episode(check, "t", "probe", row)
    assert _problems(check, task) == []


def _steps_task(root: Path, top: str, steps: str) -> Task:
    """A multi-step task: `top` keys of task.toml, then its `[[steps]]` (`steps`)."""
    names = [line.split('"')[1] for line in steps.splitlines() if line.startswith("name")]
    folder = write_task(
        root,
        "m",
        toml=f'{top}\n[environment]\ndocker_image = "img"\n{steps}',
        extra_files={f"steps/{name}/instruction.md": f"Do {name}.\n" for name in names},
    )
    return load_task(folder)


def _checked(task: Task) -> list[Problem]:
    check = TaskCheck(repeats=1)
    _episode(check, "m", "r0", _row("m", 0, [1.0] * len(task.turns)))
    return _problems(check, task, name="m")


def test_an_ungated_middle_step_under_the_mean_roll_up_is_a_risk(tmp_path: Path) -> None:
    task = _steps_task(
        tmp_path,
        "",
        '[[steps]]\nname = "fetch"\n[[steps]]\nname = "parse"\n[[steps]]\nname = "report"\n',
    )
    (found,) = _checked(task)
    assert found.kind == "early-stop-pays"
    assert found.detail.startswith("step parse of 3 has no min_reward under the mean roll-up: ")
    assert found.detail.endswith(
        "breaking the verifier of parse after passing the steps before scores 0.5, failing "
        "it honestly 0.33"
    )


def test_a_gate_that_stops_nothing_is_no_gate(tmp_path: Path) -> None:
    task = _steps_task(
        tmp_path,
        'multi_step_reward_strategy = "mean"',
        '[[steps]]\nname = "a"\n[[steps]]\nname = "b"\nmin_reward = 0.0\n'
        '[[steps]]\nname = "c"\nmin_reward = { style = 0.0 }\n'
        '[[steps]]\nname = "d"\nmin_reward = 1.0\n[[steps]]\nname = "e"\n',
    )
    (found,) = _checked(task)
    assert found.detail.startswith("steps b, c of 5 have no min_reward")
    # Failing b honestly goes on through c to the gate of d: 1 of 4 turns.
    assert found.detail.endswith(
        "verifier of b after passing the steps before scores 0.5, failing it honestly 0.25"
    )


@pytest.mark.parametrize(
    ("top", "steps"),
    [
        # The final roll-up: breaking a step leaves its own 0 as the reward.
        (
            'multi_step_reward_strategy = "final"',
            '[[steps]]\nname = "a"\n[[steps]]\nname = "b"\n[[steps]]\nname = "c"\n',
        ),
        # Every middle step gated (a number, a table): an honest failure stops as well.
        (
            "",
            '[[steps]]\nname = "a"\n[[steps]]\nname = "b"\nmin_reward = 1.0\n'
            '[[steps]]\nname = "c"\nmin_reward = { reward = 0.5 }\n[[steps]]\nname = "d"\n',
        ),
        # Two steps: the first has nothing before it, the last nothing after it.
        ("", '[[steps]]\nname = "a"\n[[steps]]\nname = "b"\n'),
    ],
)
def test_no_risk_where_breaking_a_step_scores_no_more(tmp_path: Path, top: str, steps: str) -> None:
    assert _checked(_steps_task(tmp_path, top, steps)) == []
