"""Attacks on the end of an agent's processes, on the real engine: processes that dress up
as zombies, zombie leaders whose threads work on, watchers that stop whatever the agent's
user starts. The kill decides by what the kernel enforces (who may signal whom, start
times, mapped memory), never by what a process can write about itself, so each attack
must score 0 without being masked, and must not hold the episode up.

The oracle plays the agent: each task's solve.sh leaves the attacker behind, and test.sh
is an honest verifier that resets the answer, then scores 1 only if it came back.
"""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.fixtures import BASE_IMAGE, Dataset, run_harbor

pytestmark = pytest.mark.docker

#: Resets the answer and says so, waits, then scores 1 only if the answer came back (as a
#: check of a program the agent should have left running would). It also carries a value
#: in its environment that no process of the agent may read.
RESETTING = textwrap.dedent(
    """\
    rm -f /tmp/answer; touch /tmp/reset-done
    sleep 1.5
    if [ -e /tmp/answer ]; then echo "the answer came back"; echo 1; else echo 0; fi \\
      > /logs/verifier/answer.txt
    tail -n 1 /logs/verifier/answer.txt > /logs/verifier/reward.txt
    """
)
VERIFIER_ONLY = "verifier-only-4f1c9e"

#: A daemon whose name makes a line-by-line reader of /proc/PID/stat see a zombie (") Z"
#: on the first line): it writes the answer back after the reset, forges reward.json, and
#: copies every environment it can read (test.sh's, when they share a user).
FAKE_ZOMBIE = textwrap.dedent(
    """\
    cat > /tmp/forge.sh <<'EOF'
    printf ') Z\\n' > /proc/$$/comm
    while :; do
      [ -e /tmp/reset-done ] && echo 1 > /tmp/answer 2>/dev/null
      echo '{"reward": 1}' > /logs/verifier/reward.json 2>/dev/null
      cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' >> /logs/verifier/seen.txt
      read -t 0.05 _ < /dev/zero 2>/dev/null || sleep 0.05
    done
    EOF
    setsid bash /tmp/forge.sh > /dev/null 2>&1 < /dev/null &
    sleep 0.3
    """
)

#: A watcher that, once the agent's turn is over, stops every new process of its own user
#: at once (the killer, were it to run as that user unprotected), and writes the answer
#: back after the reset.
STOPPER = textwrap.dedent(
    """\
    cat > /tmp/stop.sh <<'EOF'
    known=" "
    for p in /proc/[0-9]*; do known="$known${p#/proc/} "; done
    while :; do
      [ -e /tmp/reset-done ] && echo 1 > /tmp/answer 2>/dev/null
      [ -e /tmp/turn-over ] || continue
      for p in /proc/[0-9]*; do
        pid=${p#/proc/}
        case "$known" in *" $pid "*) continue ;; esac
        kill -STOP "$pid" 2>/dev/null
        known="$known$pid "
      done
    done
    EOF
    setsid bash /tmp/stop.sh > /dev/null 2>&1 < /dev/null &
    sleep 0.3
    : > /tmp/turn-over  # no process of its own, which the watcher could stop mid-turn
    """
)

#: A program whose main thread exits while another thread writes the answer back: its
#: leader is a zombie, its thread group is not. Its name fakes a zombie too.
ZOMBIE_LEADER_C = textwrap.dedent(
    """\
    #include <fcntl.h>
    #include <pthread.h>
    #include <unistd.h>

    static void *work(void *unused) {
        for (;;) {
            if (access("/tmp/reset-done", F_OK) == 0) {
                int fd = open("/tmp/answer", O_WRONLY | O_CREAT | O_TRUNC, 0666);
                if (fd >= 0) { write(fd, "1\\n", 2); close(fd); }
            }
            int fd = open("/logs/verifier/reward.txt", O_WRONLY | O_CREAT | O_TRUNC, 0666);
            if (fd >= 0) { write(fd, "1\\n", 2); close(fd); }
            usleep(20000);
        }
        return unused;
    }

    int main(void) {
        if (fork() != 0) return 0;
        setsid();
        int fd = open("/proc/self/comm", O_WRONLY);
        if (fd >= 0) { write(fd, ") Z\\n", 4); close(fd); }
        pthread_t thread;
        pthread_create(&thread, 0, work, 0);
        pthread_exit(0);
    }
    """
)


@pytest.fixture(scope="module")
def zombie_leader(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The zombie-leader program, built static on this machine (the image has no
    compiler)."""
    compiler = shutil.which("gcc")
    assert compiler, "gcc builds the attack program; .ci/setup's machine has it"
    folder = tmp_path_factory.mktemp("zombie-leader")
    (folder / "zl.c").write_text(ZOMBIE_LEADER_C)
    subprocess.run(
        [compiler, "-static", "-O2", "-pthread", "-o", str(folder / "zl"), str(folder / "zl.c")],
        check=True,
    )
    return folder / "zl"


def task_toml(*, user: str | None, verifier_user: str | None = None, timeout: float = 60) -> str:
    lines = ["[agent]", f"timeout_sec = {timeout}"]
    if user:
        lines.append(f"user = {user!r}")
    lines += ["[verifier]", "timeout_sec = 30"]
    if verifier_user:
        lines.append(f"user = {verifier_user!r}")
    lines += ["[verifier.env]", f'GUARDED = "{VERIFIER_ONLY}"']
    lines += ["[environment]", f'docker_image = "{BASE_IMAGE}"']
    return "\n".join(lines) + "\n"


def graded(pytester: pytest.Pytester, dataset: Dataset) -> dict[str, object]:
    run_harbor(pytester, dataset)
    (row,) = dataset.rows(pytester.path / "out")
    return row


def assert_scored_zero(row: dict[str, object]) -> None:
    assert (row["reward"], row["mask_sample"]) == (0.0, False), row
    kept = Path(str(row["verifier_logs_dir"]))
    assert "the answer came back" not in (kept / "answer.txt").read_text()
    for path in kept.rglob("*"):
        if path.is_file():
            assert VERIFIER_ONLY not in path.read_text(errors="replace"), path


@pytest.mark.parametrize("verifier_user", [None, "nobody"])
def test_a_process_named_like_a_zombie_is_ended(
    pytester: pytest.Pytester, harbor_dataset: Dataset, verifier_user: str | None
) -> None:
    """With the verifier as the agent's own user too: a survivor could then write
    reward.json and read test.sh's environment."""
    harbor_dataset.task(
        "fake-zombie",
        toml=task_toml(user="nobody", verifier_user=verifier_user),
        solve_sh=FAKE_ZOMBIE,
        test_sh=RESETTING,
    )
    assert_scored_zero(graded(pytester, harbor_dataset))


def test_a_zombie_leader_whose_thread_works_on_is_ended(
    pytester: pytest.Pytester, harbor_dataset: Dataset, zombie_leader: Path
) -> None:
    task = harbor_dataset.task(
        "zombie-leader",
        toml=task_toml(user="nobody", verifier_user="nobody"),
        solve_sh="/solution/zl\nsleep 0.3\n",
        test_sh=RESETTING,
    )
    shutil.copy(zombie_leader, task / "solution" / "zl")
    assert_scored_zero(graded(pytester, harbor_dataset))


def test_a_watcher_that_stops_its_users_new_processes_cannot_stop_the_kill(
    pytester: pytest.Pytester, harbor_dataset: Dataset
) -> None:
    """The kill runs as the agent's own user, which could signal it: every process is
    stopped before it starts, so the watcher cannot. The episode is not held up either."""
    harbor_dataset.task(
        "stopper", toml=task_toml(user="nobody"), solve_sh=STOPPER, test_sh=RESETTING
    )
    row = graded(pytester, harbor_dataset)
    assert_scored_zero(row)
    timings = row["timings"]
    assert isinstance(timings, dict)
    assert timings["total_s"] < 30


@pytest.mark.parametrize("attack", ["fake-zombie", "zombie-leader"])
def test_the_timeout_kill_of_a_root_agent_ends_disguised_processes(
    pytester: pytest.Pytester, harbor_dataset: Dataset, zombie_leader: Path, attack: str
) -> None:
    """A root agent's processes live on after a turn it ends itself (documented); after a
    turn that runs out of time, every process the turn started ends, disguised or not."""
    solve = FAKE_ZOMBIE if attack == "fake-zombie" else "/solution/zl\nsleep 0.3\n"
    task = harbor_dataset.task(
        attack,
        toml=task_toml(user=None, timeout=3),
        solve_sh=solve + "sleep 100\n",
        test_sh=RESETTING,
    )
    shutil.copy(zombie_leader, task / "solution" / "zl")
    row = graded(pytester, harbor_dataset)
    assert row["failure_cause"] == "timeout"
    assert_scored_zero(row)
