"""Attacks on the grade, as an agent under evaluation would try them, on the real engine.

The oracle plays the agent: each task's solve.sh is the attack and its test.sh the honest
verifier, which scores 0. Every test asserts the reward the attack got and that the sample
was not masked: an agent must neither raise its grade nor take itself out of the score.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from tests.fixtures import BASE_IMAGE, PASSING_TEST, Dataset, multi_step, run_harbor

pytestmark = pytest.mark.docker


@pytest.fixture
def dataset(harbor_dataset: Dataset) -> Dataset:
    return harbor_dataset


def toml(user: str | None = None, verifier_timeout: float = 30) -> str:
    agent = f"[agent]\ntimeout_sec = 60\n{f'user = {user!r}' if user else ''}\n"
    return (
        f"{agent}[verifier]\ntimeout_sec = {verifier_timeout}\n"
        f'[environment]\ndocker_image = "{BASE_IMAGE}"\n'
    )


#: The honest verifier: the agent did nothing worth a point. It waits a little so that a
#: forger has time to act after it wrote its 0.
HONEST = "echo 0 > /logs/verifier/reward.txt\nsleep 1.5\necho 'graded: 0'\n"

#: A process that outlives the agent and keeps writing a perfect reward.
FORGER = textwrap.dedent(
    """\
    cat > /tmp/forge.sh <<'EOF'
    while :; do
      echo 1 > /logs/verifier/reward.txt
      echo '{"reward": 1}' > /logs/verifier/reward.json
      sleep 0.02
    done
    EOF
    setsid sh /tmp/forge.sh > /dev/null 2>&1 < /dev/null &
    sleep 0.2
    """
)


def graded(pytester: pytest.Pytester, dataset: Dataset, *args: str) -> dict[str, object]:
    run_harbor(pytester, dataset, *args)
    (row,) = dataset.rows(pytester.path / "out")
    return row


def test_a_background_forger_of_a_non_root_agent_is_gone_before_verification(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task("forge", toml=toml(user="nobody"), solve_sh=FORGER, test_sh=HONEST)
    row = graded(pytester, dataset)
    assert (row["reward"], row["mask_sample"]) == (0.0, False)


def test_a_root_forger_is_left_behind_with_verify_from_snapshot(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task("forge-root", toml=toml(), solve_sh=FORGER, test_sh=HONEST)
    row = graded(pytester, dataset, "--harbor-set=verify_from_snapshot=true")
    assert (row["reward"], row["mask_sample"]) == (0.0, False)
    assert row["verifier_mode"] == "snapshot"


def test_fake_timeout_and_tar_early_on_path_decide_nothing(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    fake = "#!/bin/sh\\necho 1 > /logs/verifier/reward.txt\\nexit 0\\n"
    dataset.task(
        "fake-tools",
        toml=toml(),
        solve_sh=(
            f"printf '{fake}' > /usr/local/bin/timeout\n"
            f"printf '{fake}' > /usr/local/bin/tar\n"
            "chmod +x /usr/local/bin/timeout /usr/local/bin/tar\n"
        ),
        test_sh=HONEST,
    )
    row = graded(pytester, dataset)
    assert (row["reward"], row["mask_sample"], row["failure_kind"]) == (0.0, False, None)


def test_deleting_timeout_does_not_mask_the_sample(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task(
        "no-timeout",
        toml=toml(),
        solve_sh='rm -f "$(command -v timeout)"\n',
        test_sh=HONEST,
    )
    row = graded(pytester, dataset)
    assert (row["reward"], row["mask_sample"]) == (0.0, False)


def test_deleting_bash_is_tampering_not_a_mask(pytester: pytest.Pytester, dataset: Dataset) -> None:
    dataset.task(
        "no-bash",
        toml=toml(),
        solve_sh='rm -f /usr/bin/bash /bin/bash "$(command -v bash)"\n',
        test_sh=HONEST,
    )
    row = graded(pytester, dataset)
    assert (row["reward"], row["mask_sample"]) == (0.0, False)
    assert row["failure_kind"] == "harbor:verifier_tampered"


@pytest.mark.parametrize(
    "replace",
    [
        "echo 1 > /logs/verifier",
        "mkdir /tmp/fake && echo 1 > /tmp/fake/reward.txt && ln -s /tmp/fake /logs/verifier",
    ],
    ids=["file", "symlink"],
)
def test_a_replaced_verifier_folder_is_tampering_not_a_mask(
    pytester: pytest.Pytester, dataset: Dataset, replace: str
) -> None:
    dataset.task(
        "replaced", toml=toml(), solve_sh=f"rm -rf /logs/verifier\n{replace}\n", test_sh=HONEST
    )
    row = graded(pytester, dataset)
    assert (row["reward"], row["mask_sample"]) == (0.0, False)
    assert row["failure_kind"] == "harbor:verifier_tampered"
    assert "/logs/verifier" in str(row["failure_reason"])


def test_a_replaced_tests_folder_is_tampering_not_a_mask(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task(
        "no-tests-folder",
        toml=toml(),
        solve_sh="rm -rf /tests && ln -s /tmp /tests\n",
        test_sh=HONEST,
    )
    row = graded(pytester, dataset)
    assert (row["reward"], row["mask_sample"], row["failure_kind"]) == (
        0.0,
        False,
        "harbor:verifier_tampered",
    )


def test_a_test_sh_planted_before_verification_is_not_run(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task(
        "planted",
        toml=toml(user="nobody"),
        solve_sh="echo 'echo 1 > /logs/verifier/reward.txt' > /tests/test.sh 2>/dev/null\n"
        "echo 'echo 1 > /logs/verifier/reward.txt' > /tests/extra.sh 2>/dev/null; true\n",
        test_sh=HONEST,
    )
    root = dataset.task(
        "planted-root",
        toml=toml(),
        solve_sh="echo 'echo 1 > /logs/verifier/reward.txt' > /tests/test.sh\n",
        test_sh=HONEST,
    )
    assert root.exists()
    run_harbor(pytester, dataset)
    rows = {row["task_id"]: row for row in dataset.rows(pytester.path / "out")}
    for name in ("planted", "planted-root"):
        assert (rows[name]["reward"], rows[name]["mask_sample"]) == (0.0, False)


@pytest.mark.parametrize(
    ("make", "why"),
    [
        ("ln -s /dev/zero /logs/verifier/reward.txt", "is not a regular file"),
        ("mkfifo /logs/verifier/reward.txt", "is not a regular file"),
        (
            "head -c 100000000 /dev/zero | tr '\\\\0' 1 > /logs/verifier/reward.txt",
            "is larger than",
        ),
        ("ln -s /etc/hostname /logs/verifier/reward.json", "is not a regular file"),
    ],
    ids=["symlink-to-dev-zero", "fifo", "100MB", "symlink-json"],
)
def test_reward_files_are_read_defensively(
    pytester: pytest.Pytester, dataset: Dataset, make: str, why: str
) -> None:
    dataset.task("odd-reward", toml=toml(verifier_timeout=60), test_sh=f"{make}\n")
    row = graded(pytester, dataset)
    assert (row["reward"], row["mask_sample"], row["failure_kind"]) == (
        0.0,
        False,
        "harbor:reward_invalid",
    )
    assert why in str(row["failure_reason"])
    assert row["timings"]["verify_s"] < 30  # type: ignore[index]


def test_a_verifier_that_leaves_children_running_ends_at_its_timeout(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task(
        "lingering",
        toml=toml(verifier_timeout=2),
        test_sh="echo 1 > /logs/verifier/reward.txt\n(sleep 300 &)\nsleep 300 &\nsleep 300\n",
    )
    row = graded(pytester, dataset, "--harbor-set=verifier_grace_s=1")
    assert (row["failure_kind"], row["mask_sample"]) == ("harbor:verifier_timeout", False)
    assert row["timings"]["verify_s"] < 20  # type: ignore[index]


def test_an_agent_cannot_fake_the_entrypoint_failing(
    pytester: pytest.Pytester, dataset: Dataset, built_images: list[Path]
) -> None:
    """The ENTRYPOINT's end is seen by the engine, not read from a file the agent could
    write: an agent cannot take itself out of the score by faking it."""
    task = dataset.task(
        "service",
        toml='[agent]\ntimeout_sec = 60\nuser = "nobody"\n',
        dockerfile=f'FROM {BASE_IMAGE}\nENTRYPOINT ["sleep", "infinity"]\n',
        solve_sh=(
            "mkdir -p /run/pytest-harbor 2>/dev/null\n"
            "echo 1 > /run/pytest-harbor/entrypoint.exit 2>/dev/null; true\n"
        ),
        test_sh=HONEST,
    )
    built_images.append(task / "environment")
    row = graded(pytester, dataset)
    assert (row["reward"], row["mask_sample"], row["failure_kind"]) == (0.0, False, None)


def test_a_fake_sh_decides_nothing(pytester: pytest.Pytester, dataset: Dataset) -> None:
    dataset.task(
        "fake-sh",
        toml=toml(),
        solve_sh=(
            "printf '#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n' > /tmp/sh\n"
            "chmod +x /tmp/sh\n"
            "cp /tmp/sh /bin/sh; cp /tmp/sh /usr/bin/sh 2>/dev/null; true\n"
        ),
        test_sh=HONEST,
    )
    row = graded(pytester, dataset)
    assert (row["reward"], row["mask_sample"], row["failure_kind"]) == (0.0, False, None)


def test_an_agent_cannot_end_its_own_sandbox_to_be_masked(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task(
        "suicide",
        toml=toml(),
        solve_sh="kill -9 1 2>/dev/null; (sleep 0.5; kill -9 -1) > /dev/null 2>&1 &\nexit 0\n",
        test_sh=HONEST,
    )
    row = graded(pytester, dataset)
    assert (row["reward"], row["mask_sample"]) == (0.0, False)


def test_a_root_agent_wiping_the_verifier_folder_is_not_masked(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    # A file the engine cannot find is an answer (no reward); only a sandbox that is gone
    # is a lost sample, and an agent cannot make its sandbox go (the test above). Here the
    # folder goes, again and again, while the verifier runs.
    wiper = FORGER.replace(
        "echo 1 > /logs/verifier/reward.txt\n  echo '{\"reward\": 1}' > /logs/verifier/reward.json",
        "rm -rf /logs/verifier",
    )
    assert "rm -rf /logs/verifier" in wiper
    dataset.task("wiper", toml=toml(), solve_sh=wiper, test_sh=HONEST)
    row = graded(pytester, dataset)
    assert (row["reward"], row["mask_sample"]) == (0.0, False)


# --------------------------------------------------------------------------------------
# Grades by construction: the kill is atomic, masking is the engine's alone, copies are
# safe for the host, rewards are numbers, secrets stay masked at cuts, sandboxes are capped.


def agent_toml(
    user: str | None = None,
    verifier_user: str | None = None,
    agent_timeout: float = 60,
    memory_mb: int | None = None,
    prebuilt: bool = True,
) -> str:
    lines = ["[agent]", f"timeout_sec = {agent_timeout}"]
    if user:
        lines.append(f"user = {user!r}")
    lines += ["[verifier]", "timeout_sec = 30"]
    if verifier_user:
        lines.append(f"user = {verifier_user!r}")
    lines += ["[environment]"] + ([f'docker_image = "{BASE_IMAGE}"'] if prebuilt else [])
    if memory_mb:
        lines.append(f"memory_mb = {memory_mb}")
    return "\n".join(lines) + "\n"


#: A chain of processes, each starting the next and exiting at once: no pid lives long
#: enough to be listed and then killed. Each link writes a perfect reward.
HOPPER = textwrap.dedent(
    """\
    cat > /tmp/hop.sh <<'EOF'
    echo 1 > /logs/verifier/reward.txt 2>/dev/null
    echo 1 > /tmp/answer 2>/dev/null
    sh /tmp/hop.sh &
    EOF
    setsid sh /tmp/hop.sh > /dev/null 2>&1 < /dev/null &
    sleep 0.5
    """
)

#: Resets the answer, then scores 1 only if an answer is there after a while (as a check
#: of a program the agent should have left running would). A forger alive now writes it.
RESETTING = (
    "rm -f /tmp/answer; touch /tmp/reset-done\n"
    "sleep 1.5\n"
    'if [ -e /tmp/answer ]; then echo "the answer came back"; echo 1; else echo 0; fi'
    " > /logs/verifier/answer.txt\n"
    "tail -n 1 /logs/verifier/answer.txt > /logs/verifier/reward.txt\n"
)

#: A chain that waits for the verifier's reset, then writes the answer back.
WAITING_HOPPER = textwrap.dedent(
    """\
    cat > /tmp/hop.sh <<'EOF'
    [ -e /tmp/reset-done ] && echo 1 > /tmp/answer 2>/dev/null
    sh /tmp/hop.sh &
    EOF
    setsid sh /tmp/hop.sh > /dev/null 2>&1 < /dev/null &
    sleep 0.5
    """
)


def test_a_process_chain_of_a_non_root_agent_does_not_outlive_the_kill(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    """The verifier runs as the agent's user, so a link alive then could write the reward
    and read test.sh's environment: none is."""
    dataset.task(
        "hopper",
        toml=agent_toml(user="nobody", verifier_user="nobody"),
        solve_sh=HOPPER,
        test_sh=HONEST,
    )
    row = graded(pytester, dataset)
    assert (row["reward"], row["mask_sample"]) == (0.0, False)


def test_a_process_chain_cannot_write_the_answer_back_after_the_verifier_reset_it(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task(
        "hopper", toml=agent_toml(user="nobody"), solve_sh=WAITING_HOPPER, test_sh=RESETTING
    )
    row = graded(pytester, dataset)
    assert (row["reward"], row["mask_sample"]) == (0.0, False)
    answer = Path(str(row["verifier_logs_dir"])) / "answer.txt"
    assert "the answer came back" not in answer.read_text()


def test_a_process_chain_is_ended_when_the_agent_runs_out_of_time(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    """A root agent's processes live on after a turn it ended itself (documented), but not
    after one that ran out of time: then every process the turn started goes, chain and
    all, before the verifier."""
    dataset.task(
        "slow-hopper",
        toml=agent_toml(agent_timeout=3),
        solve_sh=HOPPER + "sleep 100\n",
        test_sh=HONEST,
    )
    row = graded(pytester, dataset)
    assert (row["reward"], row["mask_sample"]) == (0.0, False)
    assert row["failure_cause"] == "timeout"


def test_a_process_chain_dies_before_each_turn_of_a_multi_step_task_is_verified(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    task = dataset.task(
        "two-hops",
        toml=(
            'multi_step_reward_strategy = "mean"\n'
            f'[environment]\ndocker_image = "{BASE_IMAGE}"\n'
            '[agent]\ntimeout_sec = 60\nuser = "nobody"\n'
            '[verifier]\nuser = "nobody"\n'
            '[[steps]]\nname = "one"\n[[steps]]\nname = "two"\n'
        ),
        solve_sh=None,
        test_sh=HONEST,
    )
    for step in ("one", "two"):
        (task / "steps" / step / "solution").mkdir(parents=True)
        (task / "steps" / step / "solution" / "solve.sh").write_text(HOPPER)
        (task / "steps" / step / "instruction.md").write_text(f"Step {step}.\n")
    run_harbor(pytester, dataset)
    (row,) = dataset.rows(pytester.path / "out")
    assert (row["reward"], row["mask_sample"]) == (0.0, False)


@pytest.mark.parametrize(
    ("user", "attack"),
    [
        ("nobody", "mkdir -p /logs/agent/trajectory.json/x"),
        (None, "rm -f /logs/agent/trajectory.json; ln -s /etc/shadow /logs/agent/trajectory.json"),
        (
            None,
            # A tree deeper than PATH_MAX under /tests: rm -rf cannot remove it.
            "cd /tests && for i in $(seq 900); do mkdir dddd && cd dddd || break; done",
        ),
        (None, "sed -i '/^nobody:/d' /etc/passwd /etc/shadow"),
        (None, "sed -i '/^root:/d' /etc/passwd"),
        (None, "mkfifo /logs/verifier/reward.txt; mkdir -p /logs/verifier/a/b"),
    ],
    ids=[
        "trajectory-folder",
        "trajectory-link",
        "deep-tests",
        "no-verifier-user",
        "no-root",
        "fifo",
    ],
)
def test_what_an_agent_leaves_behind_cannot_make_its_sample_masked(
    pytester: pytest.Pytester, dataset: Dataset, user: str | None, attack: str
) -> None:
    """Each of these once failed a step of the engine after the agent's turn, and the
    episode was masked. The steps no longer fail that way; and when one still fails in a
    sandbox that runs, the episode scores 0."""
    dataset.task(
        "litter",
        toml=agent_toml(user=user, verifier_user="nobody"),
        solve_sh=attack + "\n",
        test_sh=HONEST,
    )
    row = graded(pytester, dataset)
    assert (row["reward"], row["mask_sample"]) == (0.0, False)
    assert row["failure_kind"] in (None, "harbor:verifier_tampered"), row["failure_reason"]


def test_an_entrypoint_the_agent_kills_is_not_a_masked_sample(
    pytester: pytest.Pytester, dataset: Dataset, built_images: list[Path]
) -> None:
    task = dataset.task(
        "killed-service",
        toml=agent_toml(user="nobody", prebuilt=False),
        dockerfile=(
            f"FROM {BASE_IMAGE}\n"
            'RUN printf "#!/bin/sh\\nexec sleep infinity\\n" > /service && chmod 755 /service\n'
            'ENTRYPOINT ["/service"]\nUSER nobody\n'
        ),
        solve_sh=textwrap.dedent(
            """\
            for p in /proc/[0-9]*; do
              case "$(tr '\\0' ' ' < "$p/cmdline" 2>/dev/null)" in
                "sleep infinity"*) kill -9 "${p#/proc/}" ;;
              esac
            done
            sleep 0.5
            """
        ),
        test_sh=HONEST,
    )
    built_images.append(task / "environment")
    row = graded(pytester, dataset)
    assert (row["reward"], row["mask_sample"], row["failure_kind"]) == (0.0, False, None)
    assert any("ENTRYPOINT exited" in note for note in row["turns"][0]["notes"])  # type: ignore[index]


def test_a_root_agent_cannot_end_its_sandbox_by_any_signal_or_trace(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    """Every signal to the first process, its sleeping child killed, and a trace of it
    attempted as root and as its own user: the sandbox stays, the sample is scored."""
    attack = textwrap.dedent(
        """\
        for s in $(seq 1 31); do kill -$s 1 2>/dev/null; done
        for p in /proc/[0-9]*; do
          case "$(cat $p/cmdline 2>/dev/null | tr '\\0' ' ')" in
            *busybox-sealed*) kill -9 "${p#/proc/}" 2>/dev/null ;;
          esac
        done
        uid=$(stat -c %u /proc/1)
        perl -e 'my $r = syscall(101, 16, 1, 0, 0); print "trace as root: $r\\n"'
        perl -e '$) = $( = $ARGV[0]; $> = $< = $ARGV[0]; my $r = syscall(101, 16, 1, 0, 0);
                 print "trace as $<: $r\\n"' "$uid"
        echo 1000 > /proc/1/oom_score_adj 2>/dev/null
        sleep 0.5
        """
    )
    dataset.task("no-exit", toml=agent_toml(), solve_sh=attack, test_sh=HONEST)
    row = graded(pytester, dataset)
    assert (row["reward"], row["mask_sample"], row["failure_kind"]) == (0.0, False, None)


def test_a_sandbox_run_out_of_memory_is_scored_not_masked(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    """A root agent marks the sandbox's first process as the one to kill when memory runs
    out (its oom_score_adj may be raised), then runs out of memory. Whichever process the
    kernel kills, the episode is scored."""
    dataset.task(
        "oom",
        toml=agent_toml(memory_mb=128),
        solve_sh=(
            "echo 1000 > /proc/1/oom_score_adj\n"
            "head -c 400000000 /dev/zero | tail > /dev/null\n"
            "sleep 1\n"
        ),
        test_sh=HONEST,
    )
    row = graded(pytester, dataset)
    assert (row["reward"], row["mask_sample"]) == (0.0, False)
    assert row["failure_kind"] in (None, "harbor:sandbox_exhausted")


def test_nothing_in_the_verifier_folder_can_fail_the_run_on_the_host(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    """Paths too long for this machine, names no file system here would choose, links of
    every kind, many files: the episode is scored, what could not be copied is named."""
    hostile = textwrap.dedent(
        """\
        cd /logs/verifier
        deep=$(printf 'd%.0s' $(seq 200))
        mkdir -p "long" && cd long
        for i in $(seq 19); do mkdir "$deep" && cd "$deep"; done
        echo far > "$(printf 'f%.0s' $(seq 200))"
        cd /logs/verifier
        touch "$(printf 'new\\nline')" "$(printf 'bad\\377utf8')" -- "-dash" " space"
        ln -s /etc/shadow shadow-link; ln -s /nowhere dangling; ln /etc/hostname hard 2>/dev/null
        mkfifo fifo; mknod dev c 1 3 2>/dev/null
        mkdir many && for i in $(seq 3000); do : > "many/$i"; done
        echo 1 > reward.txt
        """
    )
    dataset.task("hostile-names", toml=agent_toml(), test_sh=hostile)
    row = graded(pytester, dataset)
    assert (row["reward"], row["mask_sample"], row["failure_kind"]) == (1.0, False, None)
    cut = row["turns"][0]["verifier_files_cut"]  # type: ignore[index]
    assert any(name.startswith("long/") for name in cut), cut
    folder = Path(str(row["verifier_logs_dir"]))
    assert (folder / "-dash").is_file() and (folder / "new\nline").is_file()
    assert not (folder / "shadow-link").exists()
    assert len(list((folder / "many").iterdir())) == 3000


def test_a_file_that_changes_while_it_is_copied_out_ends_the_copy_not_the_episode(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    """A process the verifier leaves keeps growing and truncating a file while the engine
    streams the folder out: the copy breaks off, the reward is read all the same."""
    churn = textwrap.dedent(
        """\
        echo 1 > /logs/verifier/reward.txt
        cat > /tmp/churn.sh <<'EOF'
        while :; do
          head -c 20000000 /dev/zero > /logs/verifier/churn
          : > /logs/verifier/churn
        done
        EOF
        for i in 1 2 3; do : > /logs/verifier/file$i; done
        setsid sh /tmp/churn.sh > /dev/null 2>&1 < /dev/null &
        sleep 0.5
        """
    )
    dataset.task("churn", toml=agent_toml(), test_sh=churn)
    for repeat in range(3):
        row = graded_in(pytester, dataset, f"out{repeat}")
        assert (row["reward"], row["mask_sample"], row["failure_kind"]) == (1.0, False, None)


def graded_in(pytester: pytest.Pytester, dataset: Dataset, folder: str) -> dict[str, object]:
    pytester.runpytest(f"--harbor-dataset={dataset.path}", f"--harbor-results-dir={folder}")
    (row,) = dataset.rows(pytester.path / folder)
    return row


def strict(text: str) -> object:
    """JSON as a strict reader takes it: NaN and Infinity refused."""

    def refuse(constant: str) -> object:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize(
    ("written", "why"),
    [
        ('{"reward": 1' + "0" * 400 + "}", "is not a finite number"),
        ('{"reward": ' + "[" * 3000 + "]" * 3000 + "}", "deeper than 100 levels"),
        ('{"a": 1e400}', "is not a finite number"),
        ("1" + "0" * 400, "does not hold a finite number"),
    ],
    ids=["401-digits", "nested-3000-deep", "json-infinity", "text-401-digits"],
)
def test_reward_values_out_of_range_are_invalid_and_every_file_stays_strict_json(
    pytester: pytest.Pytester, dataset: Dataset, written: str, why: str
) -> None:
    name = "reward.txt" if written[0].isdigit() else "reward.json"
    dataset.task("huge", toml=agent_toml(), test_sh=f"echo '{written}' > /logs/verifier/{name}\n")
    row = graded(pytester, dataset)
    assert (row["reward"], row["mask_sample"], row["failure_kind"]) == (
        0.0,
        False,
        "harbor:reward_invalid",
    )
    assert why in str(row["failure_reason"])
    folder = dataset.results_folder(pytester.path / "out")
    for path in folder.glob("*.json*"):
        for line in (
            path.read_text().splitlines() if path.suffix == ".jsonl" else [path.read_text()]
        ):
            strict(line)
    assert (folder / "report.html").is_file()


def test_rewards_of_1e308_average_to_a_finite_mean_everywhere(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    """Two steps of 1e308 (one as the mean of two keys of 1e308): their sums overflow, the
    means do not, in the row, the summary, the terminal and the report."""
    multi_step(
        dataset,
        "huge",
        {
            "s1": ("true\n", "echo 1e308 > /logs/verifier/reward.txt\n"),
            "s2": ("true\n", """echo '{"a": 1e308, "b": 1e308}' > /logs/verifier/reward.json\n"""),
        },
    )
    result = run_harbor(pytester, dataset)
    (row,) = dataset.rows(pytester.path / "out")
    assert (row["reward"], row["failure_kind"]) == (1e308, None)
    assert [turn["reward"] for turn in row["turns"]] == [1e308, 1e308]
    summary = dataset.summary(pytester.path / "out")
    assert summary["counts"]["mean_reward"] == 1e308
    result.stdout.fnmatch_lines([f"*{dataset.name}: 1 episode, mean reward 1e+308 (*"])
    report = (dataset.results_folder(pytester.path / "out") / "report.html").read_text()
    assert not re.search(r"\b(inf|nan)\b", report, re.IGNORECASE)


def test_a_secret_cut_by_the_file_cap_leaves_no_piece_of_itself(
    pytester: pytest.Pytester, dataset: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    """64 MiB of a verifier's file are kept; a secret that straddles that cut leaves no
    beginning of itself at the end of the kept part."""
    secret = "sk-live-Zq9x7Wm2Kp4Tn8Rb6Yc3Vd5Hf"
    monkeypatch.setenv("HARBOR_TEST_SECRET", secret)
    for offset in (1, 12, len(secret) - 1):
        before = 64 * 1024 * 1024 - offset
        dataset.task(
            f"straddle-{offset}",
            toml=(
                '[agent]\nuser = "nobody"\n[verifier]\nenv = { TOKEN = "${API_TOKEN}" }\n'
                f'[environment]\ndocker_image = "{BASE_IMAGE}"\n'
            ),
            test_sh=(
                f"head -c {before} /dev/zero | tr '\\0' x > /logs/verifier/big.txt\n"
                'printf "%s tail" "$TOKEN" >> /logs/verifier/big.txt\n'
                "echo 1 > /logs/verifier/reward.txt\n"
            ),
        )
    run_harbor(
        pytester, dataset, "--harbor-set=secrets.API_TOKEN=env:HARBOR_TEST_SECRET", "-n", "2"
    )
    rows = dataset.rows(pytester.path / "out")
    assert len(rows) == 3
    for row in rows:
        kept = (Path(str(row["verifier_logs_dir"])) / "big.txt").read_bytes()
        end = kept[kept.rindex(b"x") + 1 :]
        offset = int(str(row["task_id"]).split("-")[1])
        if offset >= 8:
            assert end.startswith(b"***\n[... cut:"), (offset, end[:80])
        for length in range(8, len(secret)):
            assert secret[:length].encode() not in end


def test_a_flood_of_processes_is_capped_and_the_other_episodes_pass(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    """6000 processes asked for in one episode: it gets the cap (4096 by default), its
    agent's processes are ended before the verifier (which then runs as usual), and the
    other episodes of the run pass. A root agent's flood, left running, is scored too."""
    flood = textwrap.dedent(
        """\
        sh -c 'for i in $(seq 6000); do sleep 300 & done' 2>/dev/null
        n=0; for p in /proc/[0-9]*; do n=$((n + 1)); done
        echo "$n" > /tmp/count
        echo 1 > /tmp/answer
        """
    )
    dataset.task(
        "flood",
        toml=agent_toml(user="nobody"),
        solve_sh=flood,
        test_sh="echo processes: $(cat /tmp/count)\n" + PASSING_TEST,
    )
    dataset.task("flood-root", toml=agent_toml(), solve_sh=flood, test_sh=PASSING_TEST)
    dataset.task("calm", toml=agent_toml())
    run_harbor(pytester, dataset, "-n", "2")
    rows = {row["task_id"]: row for row in dataset.rows(pytester.path / "out")}
    assert (rows["calm"]["reward"], rows["flood"]["reward"]) == (1.0, 1.0)
    stdout = (Path(str(rows["flood"]["verifier_logs_dir"])) / "test-stdout.txt").read_text()
    assert 3000 < int(stdout.split("processes:")[1].split()[0]) <= 4096
    # A root agent's processes live on (documented): the verifier runs if the cap leaves
    # it room, and scores; if not, the episode scores 0. Either way it is scored.
    root = rows["flood-root"]
    assert root["mask_sample"] is False
    assert root["reward"] == 1.0 or root["failure_kind"] in (
        "harbor:reward_missing",
        "harbor:sandbox_exhausted",
        "harbor:verifier_tampered",
    )


def test_orphans_are_reaped_so_they_do_not_fill_the_cap(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task(
        "orphans",
        toml=agent_toml(),
        solve_sh="for i in $(seq 400); do (sleep 0.01 &); done\nsleep 1\necho 1 > /tmp/answer\n",
    )
    row = graded(pytester, dataset, "--harbor-set=sandbox_pids_limit=128")
    assert (row["reward"], row["mask_sample"]) == (1.0, False)


def test_a_working_directory_replaced_by_a_link_is_not_handed_to_the_next_user(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    """The first step's agent owns the working directory and may rename it (its parent is
    /tmp): a link to /etc in its place would have the next step's user given /etc."""
    task = dataset.task(
        "relink",
        toml=(
            'multi_step_reward_strategy = "mean"\n'
            f'[environment]\ndocker_image = "{BASE_IMAGE}"\nworkdir = "/tmp/work"\n'
            "[agent]\ntimeout_sec = 60\n"
            '[[steps]]\nname = "one"\n[steps.agent]\nuser = "nobody"\n'
            '[[steps]]\nname = "two"\n[steps.agent]\nuser = "daemon"\n'
        ),
        solve_sh=None,
        test_sh="stat -c %U /etc > /logs/verifier/etc-owner\necho 0 > /logs/verifier/reward.txt\n",
    )
    steps = {
        "one": "cd / && mv /tmp/work /tmp/old && ln -s /etc /tmp/work\n",
        "two": "stat -c %U /etc\n",
    }
    for step, solve in steps.items():
        (task / "steps" / step / "solution").mkdir(parents=True)
        (task / "steps" / step / "solution" / "solve.sh").write_text(solve)
        (task / "steps" / step / "instruction.md").write_text(f"Step {step}.\n")
    run_harbor(pytester, dataset)
    (row,) = dataset.rows(pytester.path / "out")
    second = row["turns"][1]  # type: ignore[index]
    assert (second["reward"], second["mask_sample"]) == (0.0, False)
    assert second["failure_kind"] == "harbor:verifier_tampered"
    assert "replaced by a link" in second["failure_reason"]
    assert row["mask_sample"] is False


def test_an_agent_that_runs_its_episode_out_of_time_after_its_turn_is_still_scored(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    """A collect hook the agent can slow down (it sleeps as long as a file the agent
    wrote says) eats the verifier's share of the episode: the verifier still runs, and
    the episode is scored, not left without a result."""
    dataset.task(
        "slow-hook",
        toml=(
            "[agent]\ntimeout_sec = 2\n[verifier]\ntimeout_sec = 2\n"
            '[[verifier.collect]]\ncommand = "sleep $(cat /tmp/delay)"\ntimeout_sec = 600\n'
            f'[environment]\ndocker_image = "{BASE_IMAGE}"\n'
        ),
        solve_sh="echo 1000 > /tmp/delay\n",
        test_sh=HONEST,
    )
    # An episode deadline of about 45 s: 2 + 30 (the hook) + 2 + 1, a 5 s start, 5 s clean-up.
    row = graded(
        pytester,
        dataset,
        "--harbor-set=harness_setup_allowance_s=0",
        "--harbor-set=verifier_grace_s=1",
        "--harbor-set=sandbox_ready_timeout_s=5",
        "--harbor-set=cleanup_timeout_seconds=5",
        "--harbor-set=image_pull_retries=0",
    )
    assert (row["reward"], row["mask_sample"]) == (0.0, False)
    assert "past the episode's deadline" in " ".join(row["turns"][0]["notes"])  # type: ignore[index]


#: As root: take the first process's own uid (root may), lower its address-space limit
#: (the kernel lets a process of the same uid), then kill the sleep it waits on: it must
#: start another, cannot, and ends, and the sandbox stops with it.
STOP_THE_SANDBOX = textwrap.dedent(
    """\
    U=$(awk '/^Uid/{print $2}' /proc/1/status); G=$(awk '/^Gid/{print $2}' /proc/1/status)
    setpriv --reuid="$U" --regid="$G" --clear-groups prlimit --pid 1 --as=65536:65536
    for p in /proc/[0-9]*; do
      [ "$(awk '/^PPid/{print $2}' "$p/status" 2>/dev/null)" = 1 ] || continue
      [ "$(awk '/^Uid/{print $2}' "$p/status")" = "$U" ] && kill -9 "${p#/proc/}"
    done
    sleep 3
    """
)


@pytest.mark.parametrize("user", ["root", "nobody"])
def test_a_sandbox_the_agent_stops_is_scored_not_masked(
    pytester: pytest.Pytester, dataset: Dataset, user: str
) -> None:
    """A root agent can end the sandbox's first process: the sandbox it stopped scores 0,
    never a masked sample or an episode with no result. A non-root agent cannot (its
    prlimit is refused), and its episode is verified as usual."""
    dataset.task(
        "stopper",
        toml=agent_toml(user=None if user == "root" else user),
        solve_sh=STOP_THE_SANDBOX,
        test_sh=HONEST,
    )
    row = graded(pytester, dataset)
    assert (row["reward"], row["mask_sample"]) == (0.0, False)
    if user == "root":
        assert row["failure_kind"] in ("harbor:verifier_tampered", "harbor:agent_crashed")
    else:
        assert row["failure_kind"] is None
