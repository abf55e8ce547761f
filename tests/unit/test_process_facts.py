"""The engine's readers of what the kernel says about a process, run by a static busybox on
this machine's own /proc: whatever name a process gives itself (up to the kernel's 15
bytes: newlines, parentheses, a fake state and fake numbers), the start time read is the
kernel's, and a zombie is told from a live process by its memory, not by its state."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_harbor.engine.scripts import KILL_AS_USER, PROCESS_FACTS

#: The kernel keeps at most 15 bytes of a name, and stops at a NUL.
NAMES = st.binary(min_size=1, max_size=15).filter(lambda name: b"\0" not in name)


@pytest.fixture(scope="module")
def busybox() -> str:
    found = shutil.which("busybox")
    assert found, ".ci/setup installs Debian's busybox-static, which these tests run"
    return found


#: A process that renames itself (only a process may write its own name): each line it
#: reads is a name in hex; it answers once the kernel has it.
_RENAMER = (
    "import sys\n"
    "for line in sys.stdin:\n"
    "    with open('/proc/self/comm', 'wb') as comm:\n"
    "        comm.write(bytes.fromhex(line))\n"
    "    print('ok', flush=True)\n"
)


class Renamer:
    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _RENAMER], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        self.pid = self.process.pid

    def name(self, name: bytes) -> None:
        assert self.process.stdin and self.process.stdout
        self.process.stdin.write(name.hex().encode() + b"\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline() == b"ok\n"


@pytest.fixture(scope="module")
def renamer() -> Iterator[Renamer]:
    found = Renamer()
    yield found
    found.process.kill()
    found.process.wait()


def kernel_start_time(pid: int) -> str:
    """Field 22 of /proc/PID/stat, found after the last ')' of the whole file."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        data = stat.read()
    return data[data.rindex(b")") + 2 :].split()[19].decode()


def kernel_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as stat:
        data = stat.read()
    return data[data.rindex(b")") + 2 :].split()[0].decode()


def shell(busybox: str, script: str, *arguments: str) -> str:
    done = subprocess.run(
        [busybox, "sh", "-c", PROCESS_FACTS + script, "sh", *arguments],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(name=NAMES)
def test_the_start_time_is_the_kernels_whatever_the_name(
    busybox: str, renamer: Renamer, name: bytes
) -> None:
    renamer.name(name)
    found = shell(busybox, 'started_at "$1" && echo "$start"', str(renamer.pid))
    assert found == kernel_start_time(renamer.pid)


@pytest.mark.parametrize(
    "name", [b") Z\n", b"x\n) Z 1 1 1", b"a) S 1 2 3 4 5", b")))))))))))))))", b"\n\n\n) Z 0"]
)
def test_names_that_fake_fields_change_nothing(busybox: str, renamer: Renamer, name: bytes) -> None:
    renamer.name(name)
    found = shell(busybox, 'started_at "$1" && echo "$start"', str(renamer.pid))
    assert found == kernel_start_time(renamer.pid)
    assert shell(busybox, 'alive "$1" && echo alive || echo dead', str(renamer.pid)) == "alive"


def test_a_zombie_is_dead_and_a_gone_process_has_no_start(busybox: str) -> None:
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while kernel_state(child.pid) != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert shell(busybox, 'alive "$1" && echo alive || echo dead', str(child.pid)) == "dead"
    child.wait()
    assert shell(busybox, 'started_at "$1" && echo "$start" || echo gone', str(child.pid)) == "gone"


def test_the_killer_of_the_agents_user_can_be_quoted_whole() -> None:
    """END_PROCESSES hands KILL_AS_USER to the killer in single quotes."""
    assert "'" not in KILL_AS_USER
    assert os.path.isabs(KILL_AS_USER.split("usleep")[0].split()[-1])
