"""Environments on the real engine: ENTRYPOINT, healthcheck, loose files, separate
verification, collect hooks, and a task folder edited mid-run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures import BASE_IMAGE, Dataset, run_harbor

pytestmark = pytest.mark.docker

PREBUILT = f'[environment]\ndocker_image = "{BASE_IMAGE}"\n'


@pytest.fixture
def dataset(harbor_dataset: Dataset) -> Dataset:
    return harbor_dataset


@pytest.fixture
def built(built_images: list[Path]) -> list[Path]:
    return built_images


def run(pytester: pytest.Pytester, dataset: Dataset, *args: str) -> pytest.RunResult:
    return run_harbor(pytester, dataset, "-rA", *args)


ENTRYPOINT_IMAGE = f"""FROM {BASE_IMAGE}
RUN printf '#!/bin/sh\\necho "started as $(id -un) with $*" > /tmp/entrypoint-ran\\nexec "$@"\\n' \\
    > /entry.sh && chmod +x /entry.sh
ENTRYPOINT ["/entry.sh"]
CMD ["sleep", "300"]
"""


def test_the_image_entrypoint_is_started_at_seed(
    pytester: pytest.Pytester, dataset: Dataset, built: list[Path]
) -> None:
    task = dataset.task(
        "service",
        toml="[verifier]\ntimeout_sec = 30\n",
        dockerfile=ENTRYPOINT_IMAGE,
        test_sh="cat /tmp/entrypoint-ran && echo 1 > /logs/verifier/reward.txt\n",
    )
    built.append(task / "environment")
    run(pytester, dataset).assert_outcomes(passed=1)
    (row,) = dataset.rows(pytester.path / "out")
    logs = (Path(row["verifier_logs_dir"]) / "test-stdout.txt").read_text()
    assert logs == "started as root with sleep 300\n"


def test_an_entrypoint_that_fails_masks_the_sample(
    pytester: pytest.Pytester, dataset: Dataset, built: list[Path]
) -> None:
    task = dataset.task(
        "broken-service",
        toml="[verifier]\ntimeout_sec = 30\n",
        dockerfile=(
            f'FROM {BASE_IMAGE}\nENTRYPOINT ["/bin/sh", "-c", "echo no config >&2; exit 3"]\n'
        ),
    )
    built.append(task / "environment")
    result = run(pytester, dataset)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "masked: reward 0 (harbor:entrypoint_failed): the image's ENTRYPOINT exited with "
            "code 3: no config"
        ]
    )
    (row,) = dataset.rows(pytester.path / "out")
    assert (row["mask_sample"], row["failure_kind"]) == (True, "harbor:entrypoint_failed")


def test_healthcheck_waits_until_the_check_passes(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    # Fails twice, then passes: within retries = 3.
    check = "n=$(cat /tmp/probes 2>/dev/null || echo 0); echo $((n+1)) > /tmp/probes; [ $n -ge 2 ]"
    dataset.task(
        "slow-start",
        toml=PREBUILT
        + f"[environment.healthcheck]\ncommand = '{check}'\ninterval_sec = 0.1\nretries = 3\n",
        test_sh="cat /tmp/probes; echo 1 > /logs/verifier/reward.txt\n",
    )
    run(pytester, dataset).assert_outcomes(passed=1)
    (row,) = dataset.rows(pytester.path / "out")
    assert (Path(row["verifier_logs_dir"]) / "test-stdout.txt").read_text() == "3\n"


@pytest.mark.parametrize(
    ("check", "why"),
    [("exit 4", "exited 4"), ("sleep 30", "timed out")],
    ids=["failing", "exec-timeout"],
)
def test_a_healthcheck_that_keeps_failing_fails_the_seed(
    pytester: pytest.Pytester, dataset: Dataset, check: str, why: str
) -> None:
    dataset.task(
        "never-ready",
        toml=PREBUILT + f'[environment.healthcheck]\ncommand = "{check}"\ninterval_sec = 0.1\n'
        "timeout_sec = 0.5\nretries = 2\n",
    )
    result = run(pytester, dataset)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [f"*the healthcheck `{check}` failed 2 times in a row (last: {why}*"]
    )
    assert dataset.rows(pytester.path / "out") == []


@pytest.mark.parametrize(("workdir", "where"), [("/srv/app", "/srv/app"), (None, "")])
def test_loose_environment_files_land_in_the_working_directory(
    pytester: pytest.Pytester, dataset: Dataset, workdir: str | None, where: str
) -> None:
    line = f'workdir = "{workdir}"\n' if workdir else ""
    dataset.task(
        "with-data",
        toml=PREBUILT + line,
        extra_files={"environment/data.txt": "forty-two\n", "environment/sub/more.txt": "more\n"},
        test_sh=(
            f'[ "$(cat {where}/data.txt)" = forty-two ] && [ -f {where}/sub/more.txt ] '
            "&& echo 1 > /logs/verifier/reward.txt\n"
        ),
    )
    run(pytester, dataset).assert_outcomes(passed=1)


SEPARATE_SOLUTION = (
    "mkdir -p /app && echo answer > /app/out.txt && echo published > /logs/artifacts/note.txt "
    "&& mkdir -p /app/cache && echo junk > /app/cache/big.bin && echo secret > /tmp/agent-only\n"
)
SEPARATE_TEST = (
    "ls /app /logs/artifacts; "
    '[ "$(cat /app/out.txt)" = answer ] && [ -f /logs/artifacts/note.txt ] '
    "&& [ ! -e /tmp/agent-only ] && [ ! -e /app/cache ] && echo 1 > /logs/verifier/reward.txt\n"
)


def test_separate_verifier_sees_only_the_artifacts(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task(
        "isolated",
        toml=f"""
            [[artifacts]]
            source = "/app"
            exclude = ["cache"]
            [verifier]
            timeout_sec = 30
            [verifier.environment]
            docker_image = "{BASE_IMAGE}"
            [environment]
            docker_image = "{BASE_IMAGE}"
        """,
        solve_sh=SEPARATE_SOLUTION,
        test_sh=SEPARATE_TEST,
    )
    run(pytester, dataset).assert_outcomes(passed=1)
    (row,) = dataset.rows(pytester.path / "out")
    assert row["verifier_mode"] == "separate"
    assert (
        Path(row["verifier_logs_dir"]) / "test-stdout.txt"
    ).read_text() == "/app:\nout.txt\n\n/logs/artifacts:\nnote.txt\n"


def test_the_setting_sends_tasks_with_artifacts_to_a_separate_verifier(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task(
        "declared",
        toml='artifacts = [{ source = "/app", exclude = ["cache"] }]\n' + PREBUILT,
        solve_sh=SEPARATE_SOLUTION,
        test_sh=SEPARATE_TEST,
    )
    # Shared by default: the agent's own files are there, so the test sees /tmp/agent-only.
    run(pytester, dataset).assert_outcomes(failed=1)
    (shared,) = dataset.rows(pytester.path / "out")
    assert shared["verifier_mode"] == "shared"
    run(pytester, dataset, "--harbor-set=separate_verifier_for_artifacts=true").assert_outcomes(
        passed=1
    )
    (separate,) = dataset.rows(pytester.path / "out")
    assert separate["verifier_mode"] == "separate"


def test_a_verifier_image_that_ships_its_tests_gets_no_upload(
    pytester: pytest.Pytester, dataset: Dataset, built: list[Path]
) -> None:
    task = dataset.task(
        "bundled",
        test_sh="echo 'uploaded copy'; echo 0 > /logs/verifier/reward.txt\n",
        extra_files={
            "tests/Dockerfile": f"FROM {BASE_IMAGE}\nCOPY bundled.sh /tests/test.sh\n",
            "tests/bundled.sh": "echo 'bundled copy'; echo 1 > /logs/verifier/reward.txt\n",
        },
    )
    built.append(task / "tests")
    run(pytester, dataset).assert_outcomes(passed=1)
    (row,) = dataset.rows(pytester.path / "out")
    assert row["verifier_mode"] == "separate"
    assert (Path(row["verifier_logs_dir"]) / "test-stdout.txt").read_text() == "bundled copy\n"


def test_collect_hooks_run_before_verification_and_their_failures_are_noted(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task(
        "hooked",
        toml=PREBUILT
        + '[[verifier.collect]]\ncommand = "cp /tmp/answer /tmp/collected"\n'
        + '[[verifier.collect]]\ncommand = "exit 9"\n',
        test_sh="cat /tmp/collected > /logs/verifier/reward.txt\n",
    )
    run(pytester, dataset).assert_outcomes(passed=1)
    (row,) = dataset.rows(pytester.path / "out")
    assert row["turns"][0]["notes"] == ["collect hook `exit 9` exited 9"]


def test_a_task_folder_edited_after_its_row_was_written_is_refused(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    task = dataset.task("moving")
    pytester.makeconftest(
        f"""
        from pathlib import Path

        def pytest_collection_finish(session):
            # After the rows were written, before the episode starts.
            path = Path({str(task / "solution" / "solve.sh")!r})
            path.write_text(path.read_text() + "# edited\\n")
        """
    )
    result = run(pytester, dataset)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*{task} changed since its row was written (sha256:*"])
    assert dataset.rows(pytester.path / "out") == []


def test_skip_unloadable_skips_a_task_whose_image_does_not_build(
    pytester: pytest.Pytester, dataset: Dataset, built: list[Path]
) -> None:
    task = dataset.task(
        "unbuildable",
        toml="[verifier]\ntimeout_sec = 30\n",
        dockerfile=f"FROM {BASE_IMAGE}\nRUN echo missing dependency && exit 2\n",
    )
    dataset.task("fine")
    built.append(task / "environment")
    stopped = run(pytester, dataset)
    stopped.assert_outcomes(passed=1, errors=1)
    going = run(pytester, dataset, "--harbor-skip-unloadable")
    going.assert_outcomes(passed=1, skipped=1)
    skipped = json.loads(
        (
            pytester.path / "out/harbor/validation" / dataset.name / "latest" / "skipped.json"
        ).read_text()
    )
    assert list(skipped) == ["unbuildable"]
    assert skipped["unbuildable"].startswith(
        f"building {task / 'environment' / 'Dockerfile'} failed"
    )
    assert "missing dependency" in skipped["unbuildable"]


NETWORK_SEEN = "ls /sys/class/net | tr '\\n' ' '"
IMAGE = f'[environment]\ndocker_image = "{BASE_IMAGE}"\n'


@pytest.mark.parametrize(
    ("toml", "agent", "verifier"),
    [
        ('[agent]\nnetwork_mode = "no-network"\n' + IMAGE, "=", "!="),
        (
            '[agent]\nnetwork_mode = "public"\n[verifier]\nnetwork_mode = "no-network"\n'
            + IMAGE
            + 'network_mode = "no-network"\n',
            "!=",
            "=",
        ),
    ],
    ids=["agent-offline", "agent-online-verifier-offline"],
)
def test_each_phase_has_the_network_its_network_mode_says(
    pytester: pytest.Pytester, dataset: Dataset, toml: str, agent: str, verifier: str
) -> None:
    """`agent` and `verifier`: `=` when the phase sees loopback alone, `!=` when it has
    the network too."""
    dataset.task(
        "phases",
        toml=toml,
        solve_sh=f"{NETWORK_SEEN} > /tmp/agent-saw\n",
        test_sh=(
            f'echo "agent saw: $(cat /tmp/agent-saw)"; echo "verifier sees: $({NETWORK_SEEN})"\n'
            f'[ "$(cat /tmp/agent-saw)" {agent} "lo " ] && [ "$({NETWORK_SEEN})" {verifier} "lo " ]'
            " && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"
        ),
    )
    run_harbor(pytester, dataset, "-rA").assert_outcomes(passed=1)
