"""Settings that change what a run does, on the real engine."""

from __future__ import annotations

import itertools
import time
from datetime import datetime
from pathlib import Path
from xml.etree import ElementTree

import docker
import pytest

from tests.fixtures import BASE_IMAGE, Dataset, SandboxWatcher, containers_of, run_harbor

pytestmark = pytest.mark.docker

run = run_harbor


@pytest.fixture
def dataset(harbor_dataset: Dataset) -> Dataset:
    return harbor_dataset


def toml(agent: float | None = 60, verifier: float = 30, extra: str = "") -> str:
    agent_line = f"[agent]\ntimeout_sec = {agent}\n" if agent is not None else ""
    environment = f'[environment]\ndocker_image = "{BASE_IMAGE}"\n{extra}'
    return f"{agent_line}[verifier]\ntimeout_sec = {verifier}\n{environment}"


def test_verifier_grace_bounds_a_verifier_that_ignores_sigterm(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task(
        "stubborn",
        toml=toml(verifier=1),
        test_sh="trap '' TERM; sleep 120; echo 1 > /logs/verifier/reward.txt\n",
    )
    run(pytester, dataset, "--harbor-set=verifier_grace_s=1").assert_outcomes(failed=1)
    (row,) = dataset.rows(pytester.path / "out")
    assert row["failure_kind"] == "harbor:verifier_timeout"
    assert row["timings"]["verify_s"] < 30  # SIGKILL after 1 s + 1 s, not the 120 s sleep


def test_metadata_labels_resources_and_lifetime_reach_the_engine(
    pytester: pytest.Pytester, dataset: Dataset, docker_client: docker.DockerClient
) -> None:
    dataset.task(
        "watched",
        toml=toml(extra="memory_mb = 2048\ncpus = 1\n"),
        solve_sh="echo 1 > /tmp/answer; sleep 1\n",
    )
    label = f"pytest-harbor.task={dataset.name}/watched"
    with SandboxWatcher(docker_client, label) as watcher:
        run(
            pytester,
            dataset,
            "--harbor-set=sandbox_metadata.team=evals",
            "--harbor-set=sandbox_resources_override={memory_mib: 256}",
            "--harbor-set=sandbox_ttl_slack_s=5",
            "--harbor-set=cleanup_timeout_seconds=7",
        ).assert_outcomes(passed=1)
    (attrs,) = watcher.seen.values()
    labels = attrs["Config"]["Labels"]  # type: ignore[index]
    assert (labels["team"], labels["benchmark"]) == ("evals", "harbor")
    host = attrs["HostConfig"]  # type: ignore[index]
    assert host["Memory"] == 256 * 2**20  # the override replaces memory_mb ...
    assert host["NanoCpus"] == 10**9  # ... and leaves cpus alone
    # Not removed by the engine when it ends: a sandbox that stopped must say why.
    assert host["AutoRemove"] is False
    assert host["PidsLimit"] == 4096
    # Lifetime: the episode's worst-case deadline + cleanup + slack.
    turns = 300 + 60 + 30 + 30
    worst = turns + (900 + 7) * 3
    # (The first argument of the sandbox's first process.)
    assert attrs["Config"]["Cmd"][0] == str(worst + 7 + 5)  # type: ignore[index]


@pytest.mark.parametrize(("retries", "attempts"), [("0", "1 attempt"), ("2", "3 attempts")])
def test_image_pull_retries(
    pytester: pytest.Pytester, dataset: Dataset, retries: str, attempts: str
) -> None:
    dataset.task("ghost", toml='[environment]\ndocker_image = "pytest-harbor-nowhere:2"\n')
    result = run(pytester, dataset, f"--harbor-set=image_pull_retries={retries}")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*pulling it failed ({attempts})*"])


def test_a_sandbox_slower_than_the_ready_timeout_fails_and_is_not_left(
    pytester: pytest.Pytester, dataset: Dataset, docker_client: docker.DockerClient
) -> None:
    dataset.task("hurried")
    result = run(pytester, dataset, "--harbor-set=sandbox_ready_timeout_s=0.001")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*did not start within sandbox_ready_timeout_s = 0.001 s*"])
    # The start given up on may finish a moment later: it then removes what it made.
    for _ in range(50):
        time.sleep(0.1)
        if not containers_of(docker_client, dataset.name, "hurried"):
            break
    assert containers_of(docker_client, dataset.name, "hurried") == []


def test_max_concurrent_episodes_holds_across_workers(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    for name in ("first", "second", "third"):
        dataset.task(name, solve_sh="echo 1 > /tmp/answer; sleep 1\n")
    result = run(
        pytester,
        dataset,
        "-n",
        "2",
        "--harbor-set=max_concurrent_episodes=1",
        "--harbor-set=queue_timeout_seconds=120",
    )
    result.assert_outcomes(passed=3)
    spans = sorted(
        (datetime.fromisoformat(row["started_at"]), datetime.fromisoformat(row["finished_at"]))
        for row in dataset.rows(pytester.path / "out")
    )
    for (_, finished), (started, _) in itertools.pairwise(spans):
        assert finished <= started


def test_waiting_past_the_queue_timeout_is_an_error(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    for name in ("hog", "late"):
        dataset.task(name, solve_sh="echo 1 > /tmp/answer; sleep 8\n")
    result = run(
        pytester,
        dataset,
        "-n",
        "2",
        "--harbor-set=max_concurrent_episodes=1",
        "--harbor-set=queue_timeout_seconds=1",
    )
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*no episode slot came free within queue_timeout_seconds = 1 s*"])
    (failure,) = dataset.failures(pytester.path / "out")
    assert (failure["failure_kind"], failure["stage"], failure["retry"]) == (
        "harbor:queue_timeout",
        "queue",
        True,
    )
    assert len(dataset.rows(pytester.path / "out")) == 1


def test_without_enforcement_a_task_that_does_not_fit_is_refused_at_seed(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task("long", toml=toml(agent=3600))
    result = run(
        pytester,
        dataset,
        "--harbor-set=enforce_task_timeouts=false",
        "--harbor-set=default_episode_timeout_seconds=600",
        "--junitxml=report.xml",
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*long does not fit default_episode_timeout_seconds = 600 s with "
            "enforce_task_timeouts off*"
        ]
    )
    (failure,) = dataset.failures(pytester.path / "out")
    assert (failure["failure_kind"], failure["stage"], failure["retry"]) == (
        "harbor:budget_refused",
        "seed",
        False,
    )
    properties = {
        prop.get("name"): prop.get("value")
        for prop in ElementTree.parse(pytester.path / "report.xml").iter("property")
    }
    assert properties == {"failure_kind": "harbor:budget_refused"}


def test_the_episode_deadline_cuts_an_agent_without_a_budget(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task(
        "endless", toml=toml(agent=None, verifier=2), solve_sh="echo 1 > /tmp/answer; sleep 300\n"
    )
    result = run(
        pytester,
        dataset,
        "--harbor-set=default_episode_timeout_seconds=8",
        "--harbor-set=verifier_grace_s=1",
    )
    result.assert_outcomes(failed=1)
    (row,) = dataset.rows(pytester.path / "out")
    assert (row["reward"], row["failure_kind"]) == (1.0, "agent_timeout")
    assert row["timings"]["agent_s"] < 8


def test_the_budget_warning_names_its_three_figures(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task("big", toml=toml(agent=5000))
    result = run(
        pytester, dataset, "--harbor-set=default_episode_timeout_seconds=3000", "-o", "log_cli=true"
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "*WARNING*big: the episode budget is above default_episode_timeout_seconds = 3000 s "
            "(turns 5360 s, nominal episode 6260 s, worst case 8600 s)*"
        ]
    )


def test_secrets_reach_the_verifier_but_not_the_results(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task(
        "keyed",
        toml='[agent]\nuser = "nobody"\n[verifier]\nenv = { TOKEN = "${API_TOKEN}" }\n'
        f'[environment]\ndocker_image = "{BASE_IMAGE}"\n',
        test_sh=(
            'echo "token=$TOKEN"\n'
            '[ "$TOKEN" = hunter2-xyz ] && echo 1 > /logs/verifier/reward.txt\n'
        ),
    )
    run(pytester, dataset, "--harbor-set=secrets.API_TOKEN=hunter2-xyz").assert_outcomes(passed=1)
    (row,) = dataset.rows(pytester.path / "out")
    assert (Path(row["verifier_logs_dir"]) / "test-stdout.txt").read_text() == "token=***\n"
    assert (
        "hunter2"
        not in (pytester.path / "out")
        .joinpath("harbor/validation", dataset.name, "latest", "rollouts.jsonl")
        .read_text()
    )


def test_artifacts_dir_moves_the_verifier_folders(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task("moved")
    run(pytester, dataset, f"--harbor-set=artifacts_dir={pytester.path / 'logs'}").assert_outcomes(
        passed=1
    )
    (row,) = dataset.rows(pytester.path / "out")
    run_name = dataset.results_folder(pytester.path / "out").resolve().name
    expected = (
        pytester.path / "logs" / "validation" / dataset.name / "runs" / run_name / "moved__r0"
    )
    assert row["verifier_logs_dir"] == str(expected)
    assert (expected / "reward.txt").read_text() == "1\n"


def test_artifacts_dir_keeps_validation_and_agent_runs_apart(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task("both")
    logs = f"--harbor-set=artifacts_dir={pytester.path / 'logs'}"
    run(pytester, dataset, logs).assert_outcomes(passed=1)
    run(pytester, dataset, logs, "--harbor-agent=nop").assert_outcomes(failed=1)
    (oracle_row,) = dataset.rows(pytester.path / "out")
    (nop_row,) = dataset.rows(pytester.path / "out", validation=False)
    # The agent run's fresh start deleted nothing of the validation run's.
    assert (Path(oracle_row["verifier_logs_dir"]) / "reward.txt").read_text() == "1\n"
    assert Path(nop_row["verifier_logs_dir"]).is_dir()
    assert oracle_row["verifier_logs_dir"] != nop_row["verifier_logs_dir"]


def test_a_task_with_timeouts_past_the_timers_range_runs(
    pytester: pytest.Pytester, harbor_dataset: Dataset
) -> None:
    """Any finite timeout a task asks for is taken (3e9 s and more once ended the whole
    session with an OverflowError from the alarm): the task runs, and so do the others."""
    harbor_dataset.task(
        "forever",
        toml=(
            "[agent]\ntimeout_sec = 1e300\n[verifier]\ntimeout_sec = 3e9\n"
            f'[environment]\ndocker_image = "{BASE_IMAGE}"\n'
        ),
    )
    harbor_dataset.task("plain", toml=f'[environment]\ndocker_image = "{BASE_IMAGE}"\n')
    run_harbor(pytester, harbor_dataset).assert_outcomes(passed=2)


def test_a_host_variable_reaches_a_task_only_when_host_env_names_it(
    pytester: pytest.Pytester, harbor_dataset: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dataset's `${NAME}` in `[environment].env` copied any host variable into the
    agent's sandbox; it reads one only when the run's host_env setting names it."""
    monkeypatch.setenv("HARBOR_TEST_HOST_VALUE", "from-the-host")
    harbor_dataset.task(
        "copier",
        toml=(
            f'[environment]\ndocker_image = "{BASE_IMAGE}"\n'
            'env = { COPIED = "${HARBOR_TEST_HOST_VALUE:-withheld}" }\n'
        ),
        solve_sh='echo "$COPIED" > /tmp/answer\n',
        test_sh="cp /tmp/answer /logs/verifier/seen.txt; echo 1 > /logs/verifier/reward.txt\n",
    )

    def seen(*args: str) -> str:
        folder = f"out-{len(args)}"
        pytester.runpytest(
            f"--harbor-dataset={harbor_dataset.path}", f"--harbor-results-dir={folder}", *args
        )
        (row,) = harbor_dataset.rows(pytester.path / folder)
        return (Path(str(row["verifier_logs_dir"])) / "seen.txt").read_text()

    assert seen() == "withheld\n"
    assert seen("--harbor-set=host_env=[HARBOR_TEST_HOST_VALUE]") == "from-the-host\n"
