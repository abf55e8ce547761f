"""Whole episodes through pytest on the real engine: outcomes, timeouts, users, rows."""

from __future__ import annotations

import contextlib
import threading
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import docker
import pytest

from pytest_harbor.sandboxes.images import image_tag_for
from tests.fixtures import BASE_IMAGE, Dataset, containers_of, run_harbor

pytestmark = pytest.mark.docker

run = run_harbor


@pytest.fixture
def dataset(harbor_dataset: Dataset) -> Dataset:
    return harbor_dataset


def test_passing_and_failing_reports_and_rows(pytester: pytest.Pytester, dataset: Dataset) -> None:
    dataset.task("good")
    dataset.task(
        "wrong", test_sh="echo 'expected 42, got 41'; echo 0 > /logs/verifier/reward.txt\n"
    )
    result = run(pytester, dataset, "-rA")
    result.assert_outcomes(passed=1, failed=1)
    logs = (
        pytester.path
        / "out"
        / "harbor"
        / "validation"
        / dataset.name
        / "latest"
        / "verifier"
        / "wrong__r0"
    ).resolve()
    result.stdout.fnmatch_lines(
        [
            f"*_ {dataset.name}/wrong::r0::episode _*",
            "reward 0",
            "solve.sh exit code: 0",
            f"verifier logs: {logs}",
            "---- last lines of test-stdout.txt ----",
            "expected 42, got 41",
        ]
    )
    result.stdout.fnmatch_lines([f"FAILED {dataset.name}/wrong::r0::episode - Failed: reward 0*"])
    rows = {row["task_id"]: row for row in dataset.rows(pytester.path / "out")}
    assert set(rows) == {"good", "wrong"}
    good = rows["good"]
    assert (good["taskset"], good["repeat"], good["agent"]) == (dataset.name, 0, "oracle")
    assert (good["reward"], good["verifier_rewards"], good["mask_sample"]) == (
        1.0,
        {"reward": 1.0},
        False,
    )
    assert (good["failure_kind"], good["solution_exit_code"], good["verifier_mode"]) == (
        None,
        0,
        "shared",
    )
    assert {"seed_s", "agent_s", "verify_s", "total_s"} <= {
        key for key, value in good["timings"].items() if value is not None
    }
    assert rows["wrong"]["reward"] == 0.0
    assert rows["wrong"]["verifier_logs_dir"] == str(logs)
    assert (logs / "test-stdout.txt").read_text() == "expected 42, got 41\n"
    assert (logs / "reward.txt").read_text() == "0\n"


def test_missing_and_invalid_reward_files_score_zero_with_a_kind(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task("silent", test_sh="echo 'no reward written'\n")
    dataset.task("garbled", test_sh="echo '{oops' > /logs/verifier/reward.json\n")
    result = run(pytester, dataset)
    result.assert_outcomes(failed=2)
    rows = {row["task_id"]: row for row in dataset.rows(pytester.path / "out")}
    assert (rows["silent"]["reward"], rows["silent"]["failure_kind"]) == (
        0.0,
        "harbor:reward_missing",
    )
    assert (rows["garbled"]["reward"], rows["garbled"]["failure_kind"]) == (
        0.0,
        "harbor:reward_invalid",
    )
    assert "reward.json is not valid JSON" in rows["garbled"]["failure_reason"]


def test_multi_key_reward_json(pytester: pytest.Pytester, dataset: Dataset) -> None:
    dataset.task(
        "scored",
        test_sh='echo \'{"correctness": 1, "performance": 0.5}\' > /logs/verifier/reward.json\n',
    )
    run(pytester, dataset).assert_outcomes(failed=1)
    (row,) = dataset.rows(pytester.path / "out")
    assert row["reward"] == 0.75
    assert row["verifier_rewards"] == {"correctness": 1.0, "performance": 0.5}


def test_verifier_past_its_timeout_is_cut(pytester: pytest.Pytester, dataset: Dataset) -> None:
    dataset.task(
        "slow",
        toml=f'[verifier]\ntimeout_sec = 2\n[environment]\ndocker_image = "{BASE_IMAGE}"\n',
        test_sh="echo started; sleep 120; echo 1 > /logs/verifier/reward.txt\n",
    )
    result = run(pytester, dataset)
    result.assert_outcomes(failed=1)
    (row,) = dataset.rows(pytester.path / "out")
    assert (row["reward"], row["failure_kind"]) == (0.0, "harbor:verifier_timeout")
    assert row["turns"][0]["verifier_timed_out"]
    # Killed at the 2 s deadline (SIGTERM worked), not left to its 120 s sleep.
    assert row["timings"]["verify_s"] < 60
    assert (Path(row["verifier_logs_dir"]) / "test-stdout.txt").read_text() == "started\n"


def test_agent_past_its_timeout_is_killed_then_verified(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task(
        "stuck",
        toml=f'[agent]\ntimeout_sec = 1\n[environment]\ndocker_image = "{BASE_IMAGE}"\n',
        solve_sh="echo 1 > /tmp/answer\nsleep 120 & sleep 120\n",
        test_sh=(
            "if pgrep -f 'sleep 120' >/dev/null 2>&1 || "
            "grep -qs 'sleep 120' /proc/[0-9]*/cmdline; then echo 'still running'; fi\n"
            "cat /tmp/answer > /logs/verifier/reward.txt\n"
        ),
    )
    result = run(pytester, dataset)
    result.assert_outcomes(failed=1)
    (row,) = dataset.rows(pytester.path / "out")
    assert row["reward"] == 1.0
    assert row["failure_kind"] == "agent_timeout"
    assert row["turns"][0]["agent_timed_out"]
    assert row["solution_exit_code"] != 0
    assert "still running" not in (Path(row["verifier_logs_dir"]) / "test-stdout.txt").read_text()


def test_failing_solve_sh_fails_with_its_output(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task("crash", solve_sh="echo 1 > /tmp/answer\necho 'cannot continue' >&2\nexit 3\n")
    result = run(pytester, dataset)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "reward 1 (harbor:solution_failed): solve.sh exited with code 3",
            "solve.sh exit code: 3",
            "---- last lines of /logs/agent/oracle.txt ----",
            "cannot continue",
        ]
    )


def test_the_oracles_output_is_kept_and_linked(pytester: pytest.Pytester, dataset: Dataset) -> None:
    dataset.task("talk", solve_sh="echo 'to stdout'\necho 'to stderr' >&2\necho 1 > /tmp/answer\n")
    run(pytester, dataset).assert_outcomes(passed=1)
    folder = dataset.results_folder(pytester.path / "out").resolve()
    kept = folder / "agent" / "talk__r0" / "oracle.txt"
    assert kept.read_text() == "to stdout\nto stderr\n"
    (row,) = dataset.rows(pytester.path / "out")
    assert row["turns"][0]["agent_logs_dir"] == str(kept.parent)  # type: ignore[index]
    (entry,) = dataset.summary(pytester.path / "out")["episodes"]
    assert entry["logs"][0]["agent_log"] == "agent/talk__r0/oracle.txt"
    assert 'href="agent/talk__r0/oracle.txt"' in (folder / "report.html").read_text()


def test_users_workdir_and_env_reach_solution_and_verifier(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task(
        "people",
        toml=f"""
            [agent]
            user = "nobody"
            [verifier]
            user = "daemon"
            env = {{ CHECK = "verifier-env" }}
            [environment]
            docker_image = "{BASE_IMAGE}"
            workdir = "/srv/job"
            env = {{ SHARED = "environment-env" }}
            [solution]
            env = {{ SECRET = "solution-env" }}
        """,
        solve_sh='echo "$(id -un) $PWD $SHARED $SECRET $DEBIAN_FRONTEND" > /tmp/who\n',
        test_sh=(
            'echo "$(cat /tmp/who) | $(id -un) $PWD $SHARED $CHECK ${SECRET:-none}"\n'
            "echo 1 > /logs/verifier/reward.txt\n"
        ),
    )
    run(pytester, dataset).assert_outcomes(passed=1)
    (row,) = dataset.rows(pytester.path / "out")
    stdout = (Path(row["verifier_logs_dir"]) / "test-stdout.txt").read_text().strip()
    assert stdout == (
        "nobody /srv/job environment-env solution-env noninteractive"
        " | daemon /srv/job environment-env verifier-env none"
    )


def test_files_the_agent_plants_in_tests_and_logs_verifier_are_gone(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task(
        "cheat",
        solve_sh=(
            "echo 1 > /logs/verifier/reward.txt; echo hacked > /tests/test.sh; "
            "echo hidden > /tests/.planted\n"
        ),
        test_sh="ls -A /tests; echo 0 > /logs/verifier/reward.txt\n",
    )
    run(pytester, dataset).assert_outcomes(failed=1)
    (row,) = dataset.rows(pytester.path / "out")
    assert row["reward"] == 0.0
    assert (Path(row["verifier_logs_dir"]) / "test-stdout.txt").read_text() == "test.sh\n"


def test_image_without_timeout_masks_the_sample(
    pytester: pytest.Pytester, dataset: Dataset, docker_client: docker.DockerClient
) -> None:
    task = dataset.task(
        "no-timeout",
        toml="[verifier]\ntimeout_sec = 30\n",
        # The test's own image (another test removes the image it builds).
        dockerfile=f"# {dataset.name}\nFROM {BASE_IMAGE}\nRUN rm /usr/bin/timeout\n",
    )
    try:
        result = run(pytester, dataset, "-rA")
        result.stdout.fnmatch_lines(
            [
                "masked: reward 0 (harbor:verifier_error): the image lacks timeout, which the "
                "verifier needs",
                f"ERROR {dataset.name}/no-timeout::r0::episode - Failed: masked*",
            ]
        )
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        (row,) = dataset.rows(pytester.path / "out")
        assert (row["mask_sample"], row["failure_kind"]) == (True, "harbor:verifier_error")
        assert "lacks timeout" in row["failure_reason"]
    finally:
        docker_client.images.remove(image_tag_for(task / "environment"), force=True)


def test_sandbox_that_cannot_start_is_an_error_naming_the_image(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task("ghost", toml='[environment]\ndocker_image = "pytest-harbor-nowhere:1"\n')
    result = run(pytester, dataset)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*image pytest-harbor-nowhere:1 is not on this machine*"])
    assert not dataset.rows(pytester.path / "out")


def test_no_network_task_has_only_loopback(pytester: pytest.Pytester, dataset: Dataset) -> None:
    dataset.task(
        "offline",
        toml=f'[environment]\ndocker_image = "{BASE_IMAGE}"\nnetwork_mode = "no-network"\n',
        test_sh='[ "$(ls /sys/class/net)" = lo ] && echo 1 > /logs/verifier/reward.txt\n',
    )
    run(pytester, dataset).assert_outcomes(passed=1)


def test_nop_fails_what_the_oracle_passes(pytester: pytest.Pytester, dataset: Dataset) -> None:
    dataset.task("needs-work")
    run(pytester, dataset, "--harbor-agent=nop").assert_outcomes(failed=1)
    (row,) = dataset.rows(pytester.path / "out", validation=False)
    assert (row["agent"], row["reward"], row["solution_exit_code"]) == ("nop", 0.0, None)


def test_selection_last_failed_exitfirst_and_junit(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task("a-good")
    dataset.task("b-bad", test_sh="echo 0 > /logs/verifier/reward.txt\n")
    dataset.task("c-good")
    first = run(pytester, dataset, "--junitxml=report.xml")
    first.assert_outcomes(passed=2, failed=1)
    properties = sorted(
        (case.get("classname"), prop.get("name"), prop.get("value"))
        for case in ElementTree.parse(pytester.path / "report.xml").iter("testcase")
        for prop in case.iter("property")
    )
    # junit's classname for `<taskset>/<task>::r0::episode`.
    names = [f"{dataset.name}.{task}.r0" for task in ("a-good", "b-bad", "c-good")]
    assert [(n, p, v) for n, p, v in properties if p == "reward"] == [
        (names[0], "reward", "1.0"),
        (names[1], "reward", "0.0"),
        (names[2], "reward", "1.0"),
    ]
    assert {v for _, p, v in properties if p == "failure_kind"} == {""}
    rerun = run(pytester, dataset, "--lf")
    rerun.assert_outcomes(failed=1, deselected=2)
    rerun.stdout.fnmatch_lines([f"FAILED {dataset.name}/b-bad::r0::episode*"])
    stop = run(pytester, dataset, "-x", "-p", "no:cacheprovider")
    stop.assert_outcomes(passed=1, failed=1)


def test_repeats_run_each_task_several_times(pytester: pytest.Pytester, dataset: Dataset) -> None:
    dataset.task("again")
    result = run(pytester, dataset, "--harbor-repeats=2", "-n", "2")
    result.assert_outcomes(passed=2)
    rows = dataset.rows(pytester.path / "out")
    assert sorted((row["task_id"], row["repeat"]) for row in rows) == [("again", 0), ("again", 1)]
    result.stdout.fnmatch_lines(
        [
            f"{dataset.name}: 2 episodes, mean reward 1.000 "
            "(2 passed, 0 failed, 0 masked, 0 no result)",
            "  pass@k: pass@1 1.000  pass@2 1.000",
            "  task    pass@1   pass@2",
            "  again    1.000    1.000",
        ]
    )


def test_unvalidated_tasks_beside_validated_ones_do_not_fail_the_run(
    pytester: pytest.Pytester, dataset: Dataset, docker_client: docker.DockerClient
) -> None:
    dataset.task("checked")
    dataset.task("unchecked", solve_sh=None)
    result = run(pytester, dataset)
    result.assert_outcomes(passed=1, skipped=1)
    assert result.ret == pytest.ExitCode.OK
    assert containers_of(docker_client, dataset.name, "unchecked") == []


def test_sandbox_lost_mid_episode_is_an_error(
    pytester: pytest.Pytester, dataset: Dataset, docker_client: docker.DockerClient
) -> None:
    dataset.task("doomed", solve_sh="sleep 60\n")

    def remove_the_sandbox() -> None:
        # Once solve.sh runs: the agent phase is under way.
        for _ in range(600):
            for container in containers_of(docker_client, dataset.name, "doomed"):
                with contextlib.suppress(docker.errors.APIError):
                    processes = container.top()["Processes"]  # type: ignore[attr-defined]
                    if any("sleep 60" in " ".join(process) for process in processes):
                        container.remove(force=True)  # type: ignore[attr-defined]
                        return
            time.sleep(0.1)

    remover = threading.Thread(target=remove_the_sandbox)
    remover.start()
    result = run(pytester, dataset)
    remover.join()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*ERROR at call of*doomed::r0::episode*"])
    # Noticed by the agent's exec: no result. Noticed when verifying: a masked row.
    rows = dataset.rows(pytester.path / "out")
    if rows:
        (row,) = rows
        assert (row["mask_sample"], row["failure_kind"]) == (True, "harbor:sandbox_lost")
    else:
        result.stdout.fnmatch_lines(["*the sandbox was lost during turn episode: sandbox*"])
        (failure,) = dataset.failures(pytester.path / "out")
        assert failure["failure_kind"] == "harbor:sandbox_lost"


def test_the_verifier_folder_is_copied_within_its_caps(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    """Per-file, total and file-count caps (made small here): the reward is read all the
    same, and the row names what was cut or left out."""
    pytester.makeconftest(
        """
        import pytest_harbor.engine.verification as verification

        saved = {}

        def pytest_configure(config):
            for name, value in (("FILE_CAP_BYTES", 1000), ("FILE_COUNT_CAP", 20)):
                saved[name] = getattr(verification, name)
                setattr(verification, name, value)

        def pytest_unconfigure(config):
            for name, value in saved.items():
                setattr(verification, name, value)
        """
    )
    dataset.task(
        "chatty",
        test_sh="printf 'x%.0s' $(seq 5000)\necho 1 > /logs/verifier/reward.txt\n",
    )
    dataset.task(
        "many-files",
        test_sh=(
            "mkdir /logs/verifier/many\n"
            "for i in $(seq 1 30); do echo $i > /logs/verifier/many/$i.txt; done\n"
            "echo 1 > /logs/verifier/reward.txt\n"
        ),
    )
    run(pytester, dataset).assert_outcomes(passed=2)
    rows = {row["task_id"]: row for row in dataset.rows(pytester.path / "out")}
    chatty, many = rows["chatty"], rows["many-files"]
    assert chatty["reward"] == many["reward"] == 1.0
    assert chatty["turns"][0]["verifier_files_cut"] == ["test-stdout.txt"]
    stdout = (Path(chatty["verifier_logs_dir"]) / "test-stdout.txt").read_text()
    assert stdout == "x" * 1000 + "\n[... cut: 4000 more bytes ...]\n"
    cut = many["turns"][0]["verifier_files_cut"]
    kept = list((Path(many["verifier_logs_dir"]) / "many").iterdir())
    assert len(kept) + len([name for name in cut if name.startswith("many/")]) == 30
    assert len(kept) <= 20
