"""Harbor 0.26's step features on the real engine: a step's `workdir/` and `setup.sh`,
its healthcheck, its artifacts (and the task's), and the attacks on each."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.fixtures import BASE_IMAGE, Dataset, multi_step, run_harbor

pytestmark = pytest.mark.docker

PASS = "echo 1 > /logs/verifier/reward.txt\n"
NOBODY = '[steps.agent]\nuser = "nobody"\n'


@pytest.fixture
def dataset(harbor_dataset: Dataset) -> Dataset:
    return harbor_dataset


def _turns(dataset: Dataset, pytester: pytest.Pytester) -> list[dict[str, object]]:
    (row,) = dataset.rows(pytester.path / "out")
    turns = row["turns"]
    assert isinstance(turns, list)
    return turns


def test_a_steps_workdir_lands_as_its_user_and_setup_runs_there_then_goes(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    # The second step works as nobody: the copied files are its own to change, setup.sh
    # ran as nobody from the working directory, and the agent never sees setup.sh.
    solve = (
        "ls -A /work > /tmp/seen\n"
        "echo agent >> /work/data.txt\n"  # nobody may change the step's files
    )
    check = (
        "cat /work/data.txt /work/setup-ran /tmp/seen\n"
        '[ "$(cat /work/data.txt)" = "$(printf "from the task\\nfrom setup\\nagent")" ] '
        '&& [ "$(cat /work/setup-ran)" = "65534 /work" ] '
        "&& ! grep -qx setup.sh /tmp/seen && [ ! -e /work/setup.sh ] && " + PASS
    )
    multi_step(
        dataset,
        "copies",
        {"s1": ("true\n", None), "s2": (solve, check)},
        step_toml={"s2": NOBODY},
        extra_files={
            "steps/s2/workdir/data.txt": "from the task\n",
            "steps/s2/workdir/setup.sh": (
                'echo from setup >> data.txt\necho "$(id -u) $(pwd)" > /work/setup-ran\n'
            ),
        },
    )
    result = run_harbor(pytester, dataset, "-v")
    result.assert_outcomes(passed=2)


def test_a_failing_setup_scores_zero_runs_no_agent_and_stops_the_episode(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    multi_step(
        dataset,
        "broken-setup",
        {
            "s1": ("touch /work/agent-ran\n", PASS),
            "s2": ("true\n", PASS),
        },
        extra_files={"steps/s1/workdir/setup.sh": "echo cannot set up >&2\nexit 3\n"},
    )
    result = run_harbor(pytester, dataset, "-v")
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*stopped after turn s1*"])
    (row,) = dataset.rows(pytester.path / "out")
    assert row["reward"] == 0.0 and not row["mask_sample"]
    assert row["failure_kind"] == "harbor:step_setup_failed"
    assert "setup.sh exited 3: cannot set up" in str(row["failure_reason"])
    (turn,) = _turns(dataset, pytester)
    assert turn["agent_exit_code"] is None and turn["verifier_exit_code"] is None


def test_setup_is_bounded_by_step_setup_timeout_s(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    multi_step(
        dataset,
        "slow-setup",
        {"s1": ("true\n", PASS)},
        extra_files={"steps/s1/workdir/setup.sh": "sleep 60\n"},
    )
    started = time.monotonic()
    result = run_harbor(pytester, dataset, "--harbor-set=step_setup_timeout_s=1")
    assert time.monotonic() - started < 40
    result.assert_outcomes(failed=1)
    (row,) = dataset.rows(pytester.path / "out")
    assert row["failure_kind"] == "harbor:step_setup_failed"
    assert "timed out after 1 s" in str(row["failure_reason"])


def test_a_step_healthcheck_runs_after_setup_and_a_failing_one_scores_zero(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    ready = '[steps.healthcheck]\ncommand = "test -f /work/ready"\ninterval_sec = 0.2\n'
    never = '[steps.healthcheck]\ncommand = "false"\ninterval_sec = 0.2\nretries = 2\n'
    multi_step(
        dataset,
        "healthy",
        {"s1": ("true\n", PASS)},
        step_toml={"s1": ready},
        extra_files={"steps/s1/workdir/setup.sh": "touch /work/ready\n"},
    )
    multi_step(
        dataset,
        "unhealthy",
        {"s1": ("true\n", PASS), "s2": ("true\n", PASS)},
        step_toml={"s2": never},
    )
    result = run_harbor(pytester, dataset, "-v")
    result.assert_outcomes(passed=2, failed=1)
    rows = {row["task_id"]: row for row in dataset.rows(pytester.path / "out")}
    assert rows["healthy"]["reward"] == 1.0
    unhealthy = rows["unhealthy"]
    assert unhealthy["failure_kind"] == "harbor:healthcheck_failed"
    assert unhealthy["stopped_after_turn"] == "s2" or len(unhealthy["turns"]) == 2
    assert "step s2: the healthcheck `false` failed 2 times" in str(unhealthy["failure_reason"])


def test_each_step_keeps_its_artifacts_with_the_tasks_and_what_it_published(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    first = "echo one > /work/a.txt; echo note-1 > /logs/artifacts/note\n"
    second = (
        "echo two > /work/a.txt; mkdir -p /work/out; echo keep > /work/out/keep.txt; "
        "echo skip > /work/out/skip.tmp\n"
    )
    multi_step(
        dataset,
        "kept",
        {"s1": (first, PASS), "s2": (second, PASS)},
        toml='artifacts = ["/work/a.txt", "missing.txt"]\n',
        step_toml={"s2": 'artifacts = [{ source = "out", exclude = ["*.tmp"] }]\n'},
    )
    result = run_harbor(pytester, dataset)
    result.assert_outcomes(passed=2)
    one, two = _turns(dataset, pytester)
    first_dir, second_dir = Path(str(one["artifacts_dir"])), Path(str(two["artifacts_dir"]))
    assert first_dir.name == "s1" and first_dir.parent.name == "kept__r0"
    assert first_dir.parent.parent.name == "artifacts"
    assert (first_dir / "work" / "a.txt").read_text() == "one\n"
    assert (first_dir / "logs" / "artifacts" / "note").read_text() == "note-1\n"
    assert (second_dir / "work" / "a.txt").read_text() == "two\n"
    assert (second_dir / "work" / "out" / "keep.txt").read_text() == "keep\n"
    assert not (second_dir / "work" / "out" / "skip.tmp").exists()
    # /logs/artifacts is emptied between steps, as each step's results keep it.
    assert not (second_dir / "logs" / "artifacts" / "note").exists()
    manifest = json.loads((second_dir / "manifest.json").read_text())["artifacts"]
    statuses = {entry["source"]: entry["status"] for entry in manifest}
    assert statuses == {
        "/logs/artifacts": "ok",
        "/work/a.txt": "ok",
        "missing.txt": "missing",
        "out": "ok",
    }
    assert one["notes"] == [] and two["notes"] == []


def test_a_single_step_task_keeps_its_artifacts_and_none_leaves_no_folder(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task(
        "with-artifacts",
        solve_sh="echo result > /app/out.txt\n",
        test_sh=PASS,
        toml=f'artifacts = ["/app/out.txt"]\n[environment]\ndocker_image = "{BASE_IMAGE}"\n'
        'workdir = "/app"\n',
    )
    dataset.task("without", solve_sh="true\n", test_sh=PASS)
    result = run_harbor(pytester, dataset)
    result.assert_outcomes(passed=2)
    rows = {row["task_id"]: row for row in dataset.rows(pytester.path / "out")}
    (kept,) = rows["with-artifacts"]["turns"]
    assert Path(kept["artifacts_dir"], "app", "out.txt").read_text() == "result\n"
    (nothing,) = rows["without"]["turns"]
    assert nothing["artifacts_dir"] is None
    summary = dataset.summary(pytester.path / "out")
    logs = {entry["task_id"]: entry["logs"][0] for entry in summary["episodes"]}
    assert logs["with-artifacts"]["artifacts_dir"] == "artifacts/with-artifacts__r0"
    assert "artifacts_dir" not in logs["without"]


# ---------------------------------------------------------------------------- attacks


def test_hostile_artifacts_bring_no_link_device_or_secret_to_this_machine(
    pytester: pytest.Pytester, dataset: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "s3cr3t-artifact-value"
    solve = (
        "mkdir -p /work/out && cd /work/out\n"
        "ln -s /etc/passwd passwd-link\n"
        "ln /etc/hostname hard-link 2>/dev/null || true\n"
        "mkfifo pipe\n"
        f"echo 'token {secret}' > 'leak-{secret}.txt'\n"
        "ln -s /etc/shadow /work/top-link\n"
    )
    multi_step(
        dataset,
        "hostile",
        {"s1": (solve, PASS)},
        toml='artifacts = ["/work/out", "/work/top-link"]\n',
    )
    monkeypatch.setenv("ARTIFACT_TOKEN", secret)
    result = run_harbor(pytester, dataset, "--harbor-set=secrets.TOKEN=env:ARTIFACT_TOKEN")
    result.assert_outcomes(passed=1)
    (turn,) = _turns(dataset, pytester)
    folder = Path(str(turn["artifacts_dir"]))
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(root, name)
            assert not path.is_symlink() and (path.is_dir() or path.is_file()), path
            assert secret not in name
            if path.is_file():
                assert secret not in path.read_text(errors="replace")
    out = folder / "work" / "out"
    assert (out / "leak-***.txt").read_text() == "token ***\n"
    assert not (out / "passwd-link").exists() and not (out / "pipe").exists()
    assert not (folder / "work" / "top-link").exists()
    notes = " ".join(str(note) for note in turn["notes"])  # type: ignore[union-attr]
    assert "passwd-link (a link, not copied)" in notes and "pipe (a FIFO, not copied)" in notes


def test_a_non_root_agent_cannot_turn_the_next_steps_files_against_root(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    # Step 1's agent (nobody, owner of /work) plants links where step 2's files land;
    # the files are unpacked as step 2's agent user, never through a link as root.
    plant = (
        "ln -s /etc/debian_version /work/data.txt\n"
        "mkdir -p /work/sub && rmdir /work/sub && ln -s /etc /work/sub\n"
    )
    check = (
        "grep -q planted-by-the-task /etc/debian_version && exit 0\n"
        "[ -e /etc/dropped.txt ] && exit 0\n" + PASS
    )
    multi_step(
        dataset,
        "links",
        {"s1": (plant, PASS), "s2": ("true\n", check)},
        step_toml={
            "s1": '[steps.agent]\nuser = "nobody"\n',
            "s2": '[steps.agent]\nuser = "nobody"\n',
        },
        extra_files={
            "steps/s2/workdir/data.txt": "planted-by-the-task\n",
            "steps/s2/workdir/sub/dropped.txt": "planted-by-the-task\n",
        },
    )
    result = run_harbor(pytester, dataset)
    rows = dataset.rows(pytester.path / "out")
    (row,) = rows
    turns = row["turns"]
    assert isinstance(turns, list) and len(turns) == 2
    # Either the copy was refused (the agent spoilt its own step) or it replaced the
    # links; never a root file changed.
    if turns[1]["failure_kind"] is None:
        assert turns[1]["reward"] == 1.0
    else:
        assert turns[1]["failure_kind"] == "harbor:step_setup_failed"
    assert result.ret in (0, 1)


def test_a_link_an_earlier_agent_planted_stops_a_root_steps_copy(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    # Step 1's agent (nobody, owner of /work) makes /work/sub a link to /etc; step 2 runs
    # as root, and its files would go through the link into /etc.
    check = "[ -e /etc/dropped.txt ] && exit 0\n" + PASS
    multi_step(
        dataset,
        "root-copy",
        {"s1": ("ln -s /etc /work/sub\n", PASS), "s2": ("true\n", check)},
        step_toml={"s1": NOBODY, "s2": '[steps.agent]\nuser = "root"\n'},
        extra_files={"steps/s2/workdir/sub/dropped.txt": "planted-by-the-task\n"},
    )
    run_harbor(pytester, dataset)
    (row,) = dataset.rows(pytester.path / "out")
    turns = row["turns"]
    assert isinstance(turns, list) and len(turns) == 2
    assert turns[1]["failure_kind"] == "harbor:step_setup_failed"
    assert "/work/sub is a link, not a folder" in turns[1]["failure_reason"]
