"""Copies out of a sandbox, attacked: each is bounded in bytes read and in time, closes
what it stops reading, and takes no set-id bit, owner or file capability from one sandbox
into another.

The oracle plays the agent or the verifier that leaves the trouble behind. Each test
asserts the grade and that the episode ended promptly: before the caps, the sparse file
held verification for minutes and the folder of many files for about ten.
"""

from __future__ import annotations

import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from pytest_harbor.sandboxes import SandboxSpec, output
from pytest_harbor.sandboxes.copies import CopyCapped, CopyLimits, bounded, members
from pytest_harbor.sandboxes.docker import DockerProvider, DockerSandbox
from tests.fixtures import BASE_IMAGE, PASSING_TEST, Dataset, run_harbor

pytestmark = pytest.mark.docker


@pytest.fixture
def dataset(harbor_dataset: Dataset) -> Dataset:
    return harbor_dataset


def timed_row(pytester: pytest.Pytester, dataset: Dataset) -> tuple[dict[str, object], float]:
    started = time.monotonic()
    run_harbor(pytester, dataset)
    elapsed = time.monotonic() - started
    (row,) = dataset.rows(pytester.path / "out")
    return row, elapsed


def plain_toml(verifier_timeout: float = 120) -> str:
    return (
        f"[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = {verifier_timeout}\n"
        f'[environment]\ndocker_image = "{BASE_IMAGE}"\n'
    )


def test_a_16_gib_sparse_file_beside_the_reward_keeps_the_reward_and_the_pace(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task(
        "sparse",
        toml=plain_toml(),
        test_sh="echo 1 > /logs/verifier/reward.txt\ntruncate -s 16G /logs/verifier/huge\n",
    )
    row, elapsed = timed_row(pytester, dataset)
    assert (row["reward"], row["mask_sample"]) == (1.0, False)
    assert elapsed < 90, elapsed
    cut = row["turns"][0]["verifier_files_cut"]  # type: ignore[index]
    assert any("huge" in name or "cap" in name for name in cut), cut


def test_a_verifier_folder_of_many_files_is_copied_promptly(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task(
        "many",
        toml=plain_toml(),
        test_sh=(
            "echo 1 > /logs/verifier/reward.txt\nmkdir /logs/verifier/many\n"
            "cd /logs/verifier/many && seq 1 120000 | xargs touch\n"
        ),
    )
    row, elapsed = timed_row(pytester, dataset)
    assert (row["reward"], row["mask_sample"]) == (1.0, False)
    assert elapsed < 90, elapsed
    assert row["turns"][0]["verifier_files_cut"]  # type: ignore[index]


#: The honest separate verifier, as `nobody`: runs the program the agent handed in (with
#: the interpreter it handed in), then writes its own verdict, 0.
HONEST_SEPARATE = """\
/logs/artifacts/perl /logs/artifacts/answer.pl > /tmp/ran.txt 2>&1
echo 0 > /logs/verifier/reward.txt
cp /tmp/ran.txt /logs/verifier/ran.txt
"""
#: As root, the answer writes a perfect reward that `nobody` can no longer overwrite.
FORGED_ANSWER = """\
print "ran as $>\\n";
open(my $f, '>', '/logs/verifier/reward.txt') or exit 0; print $f "1\\n"; close $f;
"""


def ran_as(row: dict[str, object]) -> str:
    """What the agent's program said in the verifier: whom it ran as."""
    return (Path(str(row["verifier_logs_dir"])) / "ran.txt").read_text()


def separate_toml() -> str:
    return (
        f'[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = 60\nuser = "nobody"\n'
        f'environment_mode = "separate"\n[environment]\ndocker_image = "{BASE_IMAGE}"\n'
    )


def test_a_set_uid_artifact_runs_as_its_caller_in_the_separate_verifier(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    solve = textwrap.dedent(
        f"""\
        cp /usr/bin/perl /logs/artifacts/perl
        chmod 6755 /logs/artifacts/perl
        cat > /logs/artifacts/answer.pl <<'EOF'
        {FORGED_ANSWER}EOF
        """
    )
    dataset.task("setuid", toml=separate_toml(), solve_sh=solve, test_sh=HONEST_SEPARATE)
    row, _ = timed_row(pytester, dataset)
    assert (row["reward"], row["mask_sample"]) == (0.0, False)
    assert row["verifier_mode"] == "separate"
    assert ran_as(row).startswith("ran as 65534"), ran_as(row)


def test_a_link_that_chains_out_of_the_artifacts_reaches_nothing_of_the_verifiers(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    """`d -> .` and `answer.txt -> d/d/../../tests/expected.txt` read as inside the
    artifacts by their text, and on disk resolve to the verifier's own answer. Neither
    link reaches the verifier, and the task is not solved."""
    solve = (
        "ln -s . /logs/artifacts/d\nln -s d/d/../../tests/expected.txt /logs/artifacts/answer.txt\n"
    )
    test = (
        'if [ "$(cat /logs/artifacts/answer.txt 2>/dev/null)" = "$(cat /tests/expected.txt)" ]'
        "; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
    )
    dataset.task(
        "chained",
        toml=separate_toml().replace("[agent]\n", '[agent]\nuser = "nobody"\n'),
        solve_sh=solve,
        test_sh=test,
        extra_files={"tests/expected.txt": "kumquat-7f3a9c\n"},
    )
    row, _ = timed_row(pytester, dataset)
    assert row["verifier_mode"] == "separate"
    assert (row["reward"], row["mask_sample"]) == (0.0, False)


def test_a_file_capability_does_not_reach_the_separate_verifier(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    # No setcap in the image: perl sets the xattr itself (setxattr, x86-64 syscall 188).
    # The value is a VFS_CAP_REVISION_2 capability set: cap_setuid and cap_dac_override,
    # permitted and effective.
    solve = textwrap.dedent(
        f"""\
        set -e
        cp /usr/bin/perl /logs/artifacts/perl
        perl -e 'my ($p, $n) = ("/logs/artifacts/perl", "security.capability");
          my $v = pack("VVVVV", 0x02000001, (1 << 7) | (1 << 1), 0, 0, 0);
          syscall(188, $p, $n, $v, length($v), 0) == 0 or die "setxattr: $!"'
        cat > /logs/artifacts/answer.pl <<'EOF'
        $< = $> = 0;
        {FORGED_ANSWER}EOF
        """
    )
    dataset.task("filecap", toml=separate_toml(), solve_sh=solve, test_sh=HONEST_SEPARATE)
    row, _ = timed_row(pytester, dataset)
    assert row["solution_exit_code"] == 0, row
    assert (row["reward"], row["mask_sample"]) == (0.0, False)
    assert ran_as(row).startswith("ran as 65534"), ran_as(row)


def test_artifacts_over_the_cap_score_0_with_the_reason(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task(
        "overcap",
        toml=separate_toml(),
        solve_sh="truncate -s 2G /logs/artifacts/big\n",
        test_sh="echo 1 > /logs/verifier/reward.txt\n",
    )
    row, elapsed = timed_row(pytester, dataset)
    assert (row["reward"], row["mask_sample"]) == (0.0, False)
    assert row["failure_kind"] == "harbor:artifacts_over_cap"
    assert "more than 1 GiB of files" in str(row["failure_reason"])
    assert elapsed < 60, elapsed


def test_an_oracle_log_made_a_fifo_fails_the_solution_promptly(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task(
        "fifo",
        toml=plain_toml(),
        solve_sh=(
            "echo 1 > /tmp/answer\nrm -f /logs/agent/oracle.txt\n"
            "mkfifo /logs/agent/oracle.txt\nexit 1\n"
        ),
        test_sh=PASSING_TEST,
    )
    row, elapsed = timed_row(pytester, dataset)
    assert row["failure_kind"] == "harbor:solution_failed", row
    assert elapsed < 30, elapsed


# ------------------------------------------------------------------ the sandbox's own copies


@pytest.fixture
def sandbox(docker_client: docker.DockerClient) -> Iterator[DockerSandbox]:
    labels = {"pytest-harbor.run": f"test-{uuid.uuid4().hex[:8]}"}
    started = DockerProvider().start(SandboxSpec(image=BASE_IMAGE, labels=labels))
    yield started
    started.stop()


def test_an_abandoned_archive_read_does_not_hold_the_next_one(sandbox: DockerSandbox) -> None:
    made = sandbox.exec(
        ["bash", "-c", "mkdir /many && cd /many && seq 1 120000 | xargs touch && echo x > /one"],
        timeout=120,
    )
    assert made.exit_code == 0, made.stderr
    # Left after one chunk, then ended by its deadline while the engine still sends.
    chunks = sandbox.iter_archive("/many")
    assert chunks is not None
    next(chunks)
    chunks.close()
    late = sandbox.iter_archive("/many")
    assert late is not None
    started = time.monotonic()
    with pytest.raises(CopyCapped, match=r"stopped after 0\.3 s"):
        for _ in members(bounded(late, CopyLimits(read_bytes=1 << 40, seconds=0.3), "/many")):
            time.sleep(0.001)
    assert time.monotonic() - started < 5
    started = time.monotonic()
    data = sandbox.read_archive("/one")
    assert data is not None and b"x\n" in data
    assert time.monotonic() - started < 5


def test_an_exec_printing_forever_is_ended_at_the_read_cap(
    sandbox: DockerSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(output, "EXEC_READ_CAP", 16 * 1024 * 1024)
    started = time.monotonic()
    result = sandbox.exec(["yes"], timeout=120)
    assert time.monotonic() - started < 30
    assert not result.timed_out
    assert b"output not read past 16777216 bytes" in result.stdout_bytes
    left = sandbox.exec(["bash", "-c", "cat /proc/[0-9]*/comm"], timeout=10)
    assert b"yes" not in left.stdout_bytes.split(), left.stdout
