"""The command channel on the real engine: the same result as plain exec (users, folders,
environment, bytes), deadlines, commands at once, and an agent that ends or stops the
channel: the engine notices and goes on by plain exec."""

from __future__ import annotations

import copy
import threading
import uuid
from pathlib import Path

import docker
import pytest

from pytest_harbor import Episode, load_task, make_provider
from pytest_harbor.harnesses.base import (
    AgentRun,
    Harness,
    HarnessSession,
    SessionContext,
    TurnContext,
)
from pytest_harbor.sandboxes.base import ExecResult
from pytest_harbor.sandboxes.docker import DockerSandbox
from pytest_harbor.sandboxes.docker.channel.pool import ChannelPool
from pytest_harbor.sandboxes.docker.channel.protocol import READY
from tests.fixtures import StartSandbox, write_task

pytestmark = pytest.mark.docker


def carried(sandbox: DockerSandbox, command: list[str], **options: object) -> ExecResult:
    """`command` through a channel: fails the test when the channel left it to plain exec."""
    pool = sandbox._channels
    assert isinstance(pool, ChannelPool)
    options.setdefault("timeout", 30.0)
    result = pool.run(
        command,
        user=str(options.pop("user", sandbox._user or "")),
        workdir=options.pop("workdir", None),  # type: ignore[arg-type]
        env=options.pop("env", None),  # type: ignore[arg-type]
        timeout=float(options.pop("timeout")),  # type: ignore[arg-type]
        stdin=options.pop("stdin", None),  # type: ignore[arg-type]
    )
    assert result is not None, f"the channel did not carry {command}"
    return result


def plain(sandbox: DockerSandbox, command: list[str], **options: object) -> ExecResult:
    options.setdefault("timeout", 30.0)
    view = copy.copy(sandbox)
    view._by_channel = False  # the engine's own view: every command by plain exec
    return view.exec(command, **options)  # type: ignore[arg-type]


def test_output_is_byte_exact_and_its_streams_apart(start: StartSandbox) -> None:
    sandbox = start().for_agent()
    every_byte = bytes(range(256)) * 3 + b"no newline at the end"
    echoed = carried(sandbox, ["cat"], stdin=every_byte)
    assert (echoed.exit_code, echoed.stdout_bytes, echoed.stderr_bytes) == (0, every_byte, b"")
    both = carried(sandbox, ["sh", "-c", "printf 'o\\0ut'; printf 'e\\nrr' >&2; exit 7"])
    assert (both.exit_code, both.stdout_bytes, both.stderr_bytes) == (7, b"o\0ut", b"e\nrr")
    # Output that spells out how a reply ends is still output.
    looks_like_a_marker = carried(sandbox, ["sh", "-c", "printf '0123456789abcdef:0\\n'"])
    assert looks_like_a_marker.stdout_bytes == b"0123456789abcdef:0\n"
    big = carried(sandbox, ["head", "-c", "3000000", "/dev/urandom"])
    assert len(big.stdout_bytes) == 3_000_000


@pytest.mark.parametrize(
    "user", ["0:0", "root", "0", "nobody", "65534:65534", "nobody:nogroup", "4242", "4242:100"]
)
def test_users_folders_and_environment_are_as_plain_exec_gives_them(
    start: StartSandbox, user: str
) -> None:
    sandbox = start(env={"FROM_SANDBOX": "kept"}).for_agent()
    probe = [
        "sh",
        "-c",
        "id -u; id -g; echo home=$HOME; pwd; umask; env | grep -v '^_=' | sort",
    ]
    options = {
        "user": user,
        "workdir": "/tmp",
        "env": {"ASKED": "a b\nc'd", "PATH": "/usr/bin:/bin"},
    }
    assert carried(sandbox, probe, **options) == plain(sandbox, probe, **options)
    without_folder = carried(sandbox, probe, user=user)
    assert without_folder == plain(sandbox, probe, user=user)


@pytest.mark.parametrize("user", ["1500", "1500:1600", "alice:1600"])
def test_a_number_is_a_uid_however_an_entry_is_named(start: StartSandbox, user: str) -> None:
    """An entry named like a uid, listed before that uid's own, is a different user: the
    channel finds a uid by its number, as plain exec does. A group named by digits (which
    plain exec takes for a gid as well) is left to plain exec."""
    sandbox = start().for_agent()
    plant = (
        "useradd -u 1500 -M alice && groupadd -g 1600 extra && "
        "sed -i '1i 1500:x:0:0::/root:/bin/sh' /etc/passwd"
    )
    assert plain(sandbox, ["sh", "-c", plant], user="0:0").exit_code == 0
    probe = ["sh", "-c", "id -u; id -g; id -G; echo home=$HOME"]
    assert carried(sandbox, probe, user=user) == plain(sandbox, probe, user=user)
    assert carried(sandbox, ["id", "-u"], user=user).stdout == "1500\n"
    plain(sandbox, ["sed", "-i", "1i 1600:x:0:", "/etc/group"], user="0:0")
    pool = sandbox._channels
    assert isinstance(pool, ChannelPool)
    assert pool.run(probe, user=user, workdir=None, env=None, timeout=30, stdin=None) is None
    assert sandbox.exec(probe, user=user, timeout=30) == plain(sandbox, probe, user=user)


def test_what_the_channel_cannot_give_goes_by_plain_exec(start: StartSandbox) -> None:
    """A user in supplementary groups, a user the image lacks, a folder that is not there:
    the command runs by plain exec, with exactly what it gives."""
    sandbox = start().for_agent()
    plain(sandbox, ["useradd", "-G", "audio,users", "member"], user="0:0")
    assert sandbox.exec(["id", "-G"], user="member", timeout=10).stdout.split() == [
        "1000",
        "29",
        "100",
    ]
    lacking = sandbox.exec(["true"], user="no-such-user", timeout=10)
    assert lacking.exit_code != 0
    nowhere = sandbox.exec(["pwd"], workdir="/no/such/folder", timeout=10)
    assert nowhere == plain(sandbox, ["pwd"], workdir="/no/such/folder", timeout=10)


def test_a_deadline_ends_the_command_and_what_it_started(start: StartSandbox) -> None:
    sandbox = start().for_agent()
    late = carried(sandbox, ["sh", "-c", "sleep 300 & sleep 301; echo never"], timeout=1.0)
    assert late.timed_out and b"never" not in late.stdout_bytes
    left = plain(sandbox, ["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"])
    assert "sleep 30" not in left.stdout
    after = carried(sandbox, ["echo", "next"])
    assert (after.exit_code, after.stdout_bytes) == (0, b"next\n")


def test_what_a_command_leaves_running_never_writes_into_a_later_reply(
    start: StartSandbox,
) -> None:
    sandbox = start().for_agent()
    first = carried(sandbox, ["sh", "-c", "(sleep 0.5; echo late) & echo first"])
    assert first.stdout_bytes == b"first\nlate\n"
    detached = carried(sandbox, ["sh", "-c", "setsid sh -c 'sleep 1; echo ghost' >/dev/null &"])
    assert detached.exit_code == 0
    for number in range(5):
        assert carried(sandbox, ["sh", "-c", f"sleep 0.3; echo {number}"]).stdout_bytes == (
            f"{number}\n".encode()
        )


def test_commands_run_at_once(start: StartSandbox) -> None:
    sandbox = start().for_agent()
    results: dict[int, ExecResult] = {}

    def run(number: int) -> None:
        results[number] = sandbox.exec(
            ["sh", "-c", f"sleep 0.5; echo {number}; echo {number} >&2"], timeout=30
        )

    threads = [threading.Thread(target=run, args=(number,)) for number in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for number, result in results.items():
        expected = f"{number}\n".encode()
        assert (result.exit_code, result.stdout_bytes, result.stderr_bytes) == (
            0,
            expected,
            expected,
        )


KILL_THE_CHANNELS = (
    "for p in /proc/[0-9]*; do case $(tr '\\0' ' ' < $p/cmdline) in "
    "*busybox-sealed*sh*) [ ${p#/proc/} = 1 ] || [ ${p#/proc/} = $$ ] || kill -9 ${p#/proc/} ;; "
    "esac; done; "
    "sleep 0.2; echo survived"
)


def test_a_root_agent_that_kills_the_channel_ends_only_its_own_command(
    start: StartSandbox,
) -> None:
    """The command that killed its channel comes back (never a hang), ended; every later
    command runs as before, through a new channel or by plain exec."""
    sandbox = start().for_agent()
    assert carried(sandbox, ["echo", "warm"]).exit_code == 0
    killed = sandbox.exec(["sh", "-c", KILL_THE_CHANNELS], user="0:0", timeout=30)
    assert not killed.timed_out
    for number in range(5):
        again = sandbox.exec(["sh", "-c", f"echo {number}"], timeout=30)
        assert (again.exit_code, again.stdout_bytes) == (0, f"{number}\n".encode())


def test_an_agent_that_kills_every_channel_leaves_the_sandbox_to_plain_exec(
    start: StartSandbox,
) -> None:
    sandbox = start().for_agent()
    pool = sandbox._channels
    assert isinstance(pool, ChannelPool)
    for _ in range(4):
        sandbox.exec(["sh", "-c", KILL_THE_CHANNELS], user="0:0", timeout=30)
    assert pool.disabled
    still = sandbox.exec(["sh", "-c", "echo plain"], timeout=30)
    assert (still.exit_code, still.stdout_bytes) == (0, b"plain\n")


def test_a_stopped_channel_holds_a_command_no_longer_than_its_deadline(
    start: StartSandbox,
) -> None:
    """A root agent stops the channel that will carry the next command: that command
    ends at its deadline, and the channel is not used again."""
    sandbox = start().for_agent()
    stop = (
        "for p in /proc/[0-9]*; do case $(tr '\\0' ' ' < $p/cmdline) in "
        "*busybox-sealed*sh*-c*) [ ${p#/proc/} = 1 ] || [ ${p#/proc/} = $$ ] "
        "|| kill -STOP ${p#/proc/} ;; "
        "esac; done"
    )
    plain(sandbox, ["sh", "-c", "true"])
    carried(sandbox, ["echo", "open"])
    plain(sandbox, ["sh", "-c", stop], user="0:0")
    held = sandbox.exec(["echo", "held"], timeout=2)
    assert held.timed_out or held.stdout_bytes == b"held\n"
    after = sandbox.exec(["echo", "after"], timeout=30)
    assert (after.exit_code, after.stdout_bytes) == (0, b"after\n")


def test_a_non_root_agent_cannot_end_or_stop_the_channel(start: StartSandbox) -> None:
    sandbox = start().for_agent()
    attack = KILL_THE_CHANNELS.replace("kill -9", "kill -9 2>/dev/null") + "; kill -STOP -1"
    done = carried(sandbox, ["sh", "-c", attack], user="nobody")
    assert done.stdout_bytes == b"survived\n"
    assert carried(sandbox, ["echo", "still"]).stdout_bytes == b"still\n"


# ------------------------------------------------------------ an agent against its grade


class ChannelKiller(Harness):
    """A root agent whose commands go through command channels (the engine hands it the
    sandbox's agent view), which writes `answer` and then kills every process of the
    sealed busybox but the first: its channels and their relays."""

    name = "channel-killer"
    #: How many channels the sandbox holds: their shells' command lines hold the channel's
    #: script (the word is split here, so that this command's own does not).
    COUNT = (
        "n=0; for p in /proc/[0-9]*; do "
        f"grep -q '{READY[:8]}''{READY[8:]}' $p/cmdline 2>/dev/null && n=$((n+1)); "
        "done; echo $n"
    )

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.killed: list[str] = []

    def open_session(self, context: SessionContext) -> HarnessSession:
        return self

    def run_turn(self, context: TurnContext) -> AgentRun:
        context.sandbox.exec(["sh", "-c", f"echo {self.answer} > /tmp/answer"], timeout=30)
        self.killed.append(
            context.sandbox.exec(["sh", "-c", self.COUNT], timeout=30).stdout.strip()
        )
        context.sandbox.exec(["sh", "-c", KILL_THE_CHANNELS], user="0:0", timeout=30)
        return AgentRun(exit_code=0)

    def close(self, context: SessionContext) -> None:
        return None


@pytest.mark.parametrize(("answer", "reward"), [("1", 1.0), ("0", 0.0)])
def test_an_agent_that_kills_its_channels_is_graded_as_it_left_the_sandbox(
    docker_client: docker.DockerClient, tmp_path: Path, answer: str, reward: float
) -> None:
    """The verifier never goes through a channel: an agent that ends every channel after
    its work scores what it did (neither a hang, nor a lost sandbox, nor a pass it did not
    earn)."""
    harness = ChannelKiller(answer)
    labels = {"pytest-harbor.run": f"channel-killer-{uuid.uuid4().hex[:8]}"}
    task = load_task(write_task(tmp_path, "killer"))
    episode = Episode(
        task,
        taskset="channels",
        repeat=0,
        harness=harness,
        provider=make_provider("docker"),
        labels=labels,
        verifier_logs_dir=tmp_path / "verifier",
    )
    try:
        episode.seed()
        output = episode.run_turn(task.turns[0])
        # The engine's steps since (ending the turn, verifying) opened no channel again.
        (sandbox,) = docker_client.containers.list(
            filters={"label": f"pytest-harbor.run={labels['pytest-harbor.run']}"}
        )
        left = sandbox.exec_run(["sh", "-c", ChannelKiller.COUNT]).output.decode().strip()
    finally:
        episode.cleanup()
    assert left == "0"
    # Its commands did go through channels: there were channels to kill.
    assert harness.killed and int(harness.killed[0]) > 0
    assert (output.result.reward, output.result.failure_kind) == (reward, None)
    assert not output.result.mask_sample
    assert not docker_client.containers.list(
        all=True, filters={"label": f"pytest-harbor.run={labels['pytest-harbor.run']}"}
    )
