"""Collection as users see it: targets, ids, selection, bad task.toml, no task imports.

None of these start a sandbox: they collect only, or every item is skipped before setup.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures import write_task

#: Task-folder Python that must never run on the host: it leaves a marker if imported.
_TRAP = "import pathlib\npathlib.Path({marker!r}).write_text('imported')\n"


def make_dataset(
    root: Path, name: str = "tasks", tasks: tuple[str, ...] = ("alpha", "beta")
) -> Path:
    dataset = root / name
    for task in tasks:
        write_task(dataset, task)
    return dataset


def test_ids_name_taskset_task_repeat_and_episode(pytester: pytest.Pytester) -> None:
    dataset = make_dataset(pytester.path)
    write_task(dataset / "group" / "deeper", "gamma")
    result = pytester.runpytest(f"--harbor-dataset={dataset}", "--collect-only", "-q")
    result.stdout.fnmatch_lines(
        [
            "tasks/alpha::r0::episode",
            "tasks/beta::r0::episode",
            "tasks/gamma::r0::episode",
            "3 tests collected*",
        ]
    )
    assert result.ret == pytest.ExitCode.OK


def test_repeats_give_one_trial_each(pytester: pytest.Pytester) -> None:
    dataset = make_dataset(pytester.path, tasks=("alpha",))
    result = pytester.runpytest(
        f"--harbor-dataset={dataset}", "--harbor-repeats=3", "--collect-only", "-q"
    )
    result.stdout.fnmatch_lines(
        ["tasks/alpha::r0::episode", "tasks/alpha::r1::episode", "tasks/alpha::r2::episode"]
    )


def test_k_selects_a_task_by_name(pytester: pytest.Pytester) -> None:
    dataset = make_dataset(pytester.path)
    result = pytester.runpytest(f"--harbor-dataset={dataset}", "-k", "beta", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["tasks/beta::r0::episode", "1/2 tests collected (1 deselected)*"])
    result.stdout.no_fnmatch_line("*alpha*")


def test_k_that_looks_like_harbors_attempt_count_says_what_it_does(
    pytester: pytest.Pytester,
) -> None:
    """`harbor run -k 3` runs three attempts; here -k is pytest's keyword filter, which
    selects repeat r3: the run says so and names --harbor-repeats."""
    dataset = make_dataset(pytester.path, tasks=("alpha",))
    result = pytester.runpytest(
        f"--harbor-dataset={dataset}", "--harbor-repeats=4", "-k", "3", "--collect-only", "-q"
    )
    result.stdout.fnmatch_lines(
        [
            "tasks/alpha::r3::episode",
            "*HarborWarning: -k 3 is pytest's keyword filter: it runs only the items whose "
            "names hold '3' (repeat r3 of each task, say), not 3 attempts as harbor run's -k; "
            "--harbor-repeats=3 runs each task 3 times",
        ]
    )
    quiet = pytester.runpytest(f"--harbor-dataset={dataset}", "-k", "alpha", "--collect-only")
    quiet.stdout.no_fnmatch_line("*keyword filter*")


def test_pointing_pytest_at_a_dataset_or_task_collects_the_same(pytester: pytest.Pytester) -> None:
    dataset = make_dataset(pytester.path)
    as_dataset = pytester.runpytest(str(dataset), "--collect-only", "-q")
    as_dataset.stdout.fnmatch_lines(["tasks/alpha::r0::episode", "tasks/beta::r0::episode"])
    # A single task folder is its own taskset, named after the folder.
    as_task = pytester.runpytest(str(dataset / "beta"), "--collect-only", "-q")
    # A task folder is its own taskset: its name once, not `beta/beta`.
    as_task.stdout.fnmatch_lines(["beta::r0::episode", "1 test collected*"])


def test_ini_key_names_datasets_relative_to_the_ini_file(pytester: pytest.Pytester) -> None:
    make_dataset(pytester.path)
    pytester.makeini("[pytest]\nharbor_dataset = tasks\nharbor_repeats = 2\n")
    result = pytester.runpytest("--collect-only", "-q")
    result.stdout.fnmatch_lines(["tasks/alpha::r0::episode", "tasks/alpha::r1::episode"])
    assert result.ret == pytest.ExitCode.OK


def test_dataset_option_replaces_default_arguments(pytester: pytest.Pytester) -> None:
    make_dataset(pytester.path)
    pytester.makepyfile(test_project="def test_unit():\n    pass\n")
    pytester.makeini("[pytest]\ntestpaths = .\n")
    only_tasks = pytester.runpytest("--harbor-dataset=tasks", "--collect-only", "-q")
    only_tasks.stdout.no_fnmatch_line("*test_unit*")
    both = pytester.runpytest("--harbor-dataset=tasks", "test_project.py", "--collect-only", "-q")
    both.stdout.fnmatch_lines(["test_project.py::test_unit", "tasks/alpha::r0::episode"])


def test_broken_task_toml_is_a_collection_error_naming_file_key_and_expectation(
    pytester: pytest.Pytester,
) -> None:
    dataset = make_dataset(pytester.path)
    write_task(
        dataset,
        "broken",
        toml='[agent]\ntimeout_sec = "soon"\n[environment]\ndocker_image = "img"\n',
    )
    result = pytester.runpytest(f"--harbor-dataset={dataset}", "--collect-only", "-q")
    result.stdout.fnmatch_lines(
        [
            "*ERROR collecting tasks/broken*",
            f"{dataset / 'broken' / 'task.toml'}: agent.timeout_sec: Input should be a valid "
            "number, unable to parse string as a number, got 'soon'",
        ]
    )
    result.stdout.no_fnmatch_line("*Traceback*")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    # The other tasks are not lost: with --continue-on-collection-errors they still run.
    going_on = pytester.runpytest(
        f"--harbor-dataset={dataset}", "--collect-only", "-q", "--continue-on-collection-errors"
    )
    going_on.stdout.fnmatch_lines(["tasks/alpha::r0::episode", "tasks/beta::r0::episode"])


def test_a_dockerfile_adding_a_url_is_refused_unless_the_settings_allow_it(
    pytester: pytest.Pytester,
) -> None:
    """The engine would fetch it from this machine's own network: a collection error
    naming the Dockerfile and line; `allow_remote_add` lets it through."""
    dataset = make_dataset(pytester.path, tasks=("alpha",))
    dockerfile = "FROM debian:bookworm-slim\nADD http://127.0.0.1:1/x /x\n"
    write_task(dataset, "remote-add", toml="", dockerfile=dockerfile)
    result = pytester.runpytest(f"--harbor-dataset={dataset}", "--collect-only", "-q")
    result.stdout.fnmatch_lines(
        [
            "*ERROR collecting tasks/remote-add*",
            f"{dataset / 'remote-add' / 'environment' / 'Dockerfile'}: line 2: "
            "ADD http://127.0.0.1:1/x: the engine fetches a URL*allow_remote_add*",
        ]
    )
    assert result.ret == pytest.ExitCode.INTERRUPTED
    allowed = pytester.runpytest(
        f"--harbor-dataset={dataset}", "--collect-only", "-q", "--harbor-set=allow_remote_add=true"
    )
    allowed.stdout.fnmatch_lines(["tasks/alpha::r0::episode", "tasks/remote-add::r0::episode"])
    assert allowed.ret == pytest.ExitCode.OK


def test_duplicate_task_ids_are_refused(pytester: pytest.Pytester) -> None:
    dataset = make_dataset(pytester.path, tasks=())
    write_task(dataset / "one", "same")
    write_task(dataset / "two", "same")
    result = pytester.runpytest(f"--harbor-dataset={dataset}", "--collect-only")
    result.stdout.fnmatch_lines(["*task id 'same' is used twice*"])
    assert result.ret == pytest.ExitCode.INTERRUPTED


def test_a_dataset_without_tasks_is_an_error(pytester: pytest.Pytester) -> None:
    (pytester.path / "empty").mkdir()
    result = pytester.runpytest("--harbor-dataset=empty", "--collect-only")
    result.stdout.fnmatch_lines(["*empty: no task folders found*"])
    assert result.ret == pytest.ExitCode.INTERRUPTED


def test_each_unknown_key_is_a_warning_at_its_line_with_the_key_meant(
    pytester: pytest.Pytester,
) -> None:
    dataset = make_dataset(pytester.path, tasks=())
    write_task(
        dataset,
        "odd",
        toml='flavour = "x"\n[environment]\ndocker_image = "img"\nsize = 1\ncpu = 2\n',
    )
    result = pytester.runpytest(
        f"--harbor-dataset={dataset}", "--harbor-repeats=2", "--collect-only", "-q"
    )
    task_file = dataset / "odd" / "task.toml"
    result.stdout.fnmatch_lines(
        [
            f"*task.toml:1: HarborWarning: {task_file}: unknown key ignored: flavour (line 1)",
            f"*task.toml:4: HarborWarning: {task_file}: unknown key ignored: "
            "environment.size (line 4)",
            f"*task.toml:5: HarborWarning: {task_file}: unknown key ignored: environment.cpu "
            "(line 5): did you mean environment.cpus?",
        ]
    )
    # Once each, though two trials (and workers) load the task.
    assert result.stdout.str().count("unknown key ignored: environment.size") == 1


def test_a_misspelt_key_reported_missing_names_the_misspelling_and_its_line(
    pytester: pytest.Pytester,
) -> None:
    dataset = make_dataset(pytester.path, tasks=())
    write_task(
        dataset, "typo", toml='[verifier]\ntimeout_sec = 3\n[environment]\ndocker_imgae = "x"\n'
    )
    result = pytester.runpytest(f"--harbor-dataset={dataset}", "--collect-only", "-q")
    result.stdout.fnmatch_lines(
        [
            f"*{dataset / 'typo' / 'task.toml'}: environment.docker_image: no environment: *; "
            "the file has `docker_imgae` (line 4): did you mean `docker_image`?"
        ]
    )


@pytest.mark.parametrize("how", ["option", "dataset-arg", "task-arg", "walk", "xdist"])
def test_python_files_in_a_task_folder_are_never_imported(
    pytester: pytest.Pytester, how: str
) -> None:
    marker = pytester.path / "imported.txt"
    trap = _TRAP.format(marker=str(marker))
    dataset = pytester.path / "suite" / "tasks"
    task = write_task(
        dataset,
        "trap",
        extra_files={
            "tests/conftest.py": trap,
            "tests/test_outputs.py": trap + "def test_inside():\n    pass\n",
            "conftest.py": trap,
            "solution/helper_test.py": trap,
        },
    )
    # A project test next to the dataset makes `suite` an ordinary test folder.
    (pytester.path / "suite" / "test_project.py").write_text("def test_unit():\n    pass\n")
    args = {
        "option": [f"--harbor-dataset={dataset}"],
        "dataset-arg": [str(dataset)],
        "task-arg": [str(task)],
        "walk": [str(pytester.path / "suite")],
        "xdist": [f"--harbor-dataset={dataset}", "-n", "2"],
    }[how]
    result = pytester.runpytest(*args, "--collect-only", "-q", "-p", "no:cacheprovider")
    assert not marker.exists(), result.stdout.str()
    result.stdout.no_fnmatch_line("*test_inside*")
    if how == "walk":
        result.stdout.fnmatch_lines(["*test_project.py::test_unit*"])
        result.stdout.no_fnmatch_line("*trap::r0*")
    elif how != "xdist":
        result.stdout.fnmatch_lines(["*trap::r0::episode"])


def test_task_without_solution_is_skipped_unvalidated_and_the_run_fails(
    pytester: pytest.Pytester,
) -> None:
    dataset = pytester.path / "tasks"
    write_task(dataset, "open", solve_sh=None)
    result = pytester.runpytest(f"--harbor-dataset={dataset}", "-rs")
    result.stdout.fnmatch_lines(
        ["*no selected task has a solution/solve.sh: nothing was validated*"]
    )
    result.stdout.fnmatch_lines(["*SKIPPED*unvalidated: the task has no solution/solve.sh*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_unknown_agent_or_sandbox_is_a_usage_error(pytester: pytest.Pytester) -> None:
    dataset = make_dataset(pytester.path)
    agent = pytester.runpytest(f"--harbor-dataset={dataset}", "--harbor-agent=wizard")
    agent.stderr.fnmatch_lines(
        ["*--harbor-agent: unknown harness 'wizard'; available: *mini-swe-agent, nop, *oracle*"]
    )
    assert agent.ret == pytest.ExitCode.USAGE_ERROR
    sandbox = pytester.runpytest(f"--harbor-dataset={dataset}", "--harbor-sandbox=cloud")
    sandbox.stderr.fnmatch_lines(["*--harbor-sandbox: unknown sandbox provider 'cloud'*"])
    assert sandbox.ret == pytest.ExitCode.USAGE_ERROR


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--harbor-dataset=nowhere"], "*--harbor-dataset: */nowhere is not a folder*"),
        (["--harbor-repeats=0"], "*--harbor-repeats / harbor_repeats: must be at least 1*"),
        (["--harbor-repeats=many"], "*expected an integer, got 'many'*"),
    ],
)
def test_bad_option_values_are_usage_errors(
    pytester: pytest.Pytester, args: list[str], message: str
) -> None:
    result = pytester.runpytest(*args)
    result.stderr.fnmatch_lines([message])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_two_targets_with_one_taskset_name_are_refused(pytester: pytest.Pytester) -> None:
    first = make_dataset(pytester.path / "a", name="same", tasks=("x",))
    second = make_dataset(pytester.path / "b", name="same", tasks=("y",))
    result = pytester.runpytest(f"--harbor-dataset={first}", f"--harbor-dataset={second}")
    result.stderr.fnmatch_lines(["*two targets share the taskset name 'same'*"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_help_lists_the_harnesses_and_points_to_the_settings(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    text = " ".join(result.stdout.str().split())
    assert (
        "harness to run (default: oracle): claude-code, codex, mini-swe-agent, nop, "
        "opencode, oracle, shell-agent;" in text
    )
    assert "every setting and its default: docs/options.md" in text
