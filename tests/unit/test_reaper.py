"""Which owners count as gone, and what the reaper removes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from pytest_harbor.labels import OWNER_LABEL, RUN_LABEL
from pytest_harbor.run.reaper import (
    owner_is_alive,
    owner_of_this_process,
    reap_orphans,
)
from pytest_harbor.sandboxes import SandboxError


def owner(pid: int | str, start: str, *, boot: str | None = None, ns: str | None = None) -> str:
    """An owner label of a process on this host, in this boot and PID namespace unless
    `boot` or `ns` say otherwise."""
    here_boot, here_ns = owner_of_this_process().split(":")[3:]
    return f"{socket.gethostname()}:{pid}:{start}:{boot or here_boot}:{ns or here_ns}"


def _ended_process() -> tuple[int, str]:
    """The pid and start time of a process that has ended (and been waited for)."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=-1)
    stat = Path(f"/proc/{child.pid}/stat").read_text()
    start = stat[stat.rindex(")") + 2 :].split()[19]
    child.communicate(b"")
    return child.pid, start


def test_this_process_is_alive() -> None:
    assert owner_is_alive(owner_of_this_process())


def test_an_ended_process_is_gone() -> None:
    pid, start = _ended_process()
    assert not owner_is_alive(owner(pid, start))


def test_a_reused_pid_does_not_pass_for_its_earlier_process() -> None:
    _, pid, start, _, _ = owner_of_this_process().split(":")
    assert not owner_is_alive(owner(pid, str(int(start) - 1)))


def test_a_zombie_is_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    stat = Path(f"/proc/{child.pid}/stat").read_text()
    start = stat[stat.rindex(")") + 2 :].split()[19]
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # ended, not yet reaped
    try:
        assert not owner_is_alive(owner(child.pid, start))
    finally:
        child.wait()


def test_owners_of_other_hosts_and_unreadable_owners_count_as_alive() -> None:
    assert owner_is_alive("some-other-host:1:1")
    assert owner_is_alive(f"{socket.gethostname()}:not-a-pid")
    assert owner_is_alive(owner("not-a-pid", "1"))


def test_a_dead_pid_of_another_namespace_or_boot_counts_as_alive() -> None:
    """Two runs on one host in different PID namespaces (CI containers sharing the host's
    network and name): a pid of the other one says nothing here."""
    pid, start = _ended_process()
    assert not owner_is_alive(owner(pid, start))
    assert owner_is_alive(owner(pid, start, ns="4026599999"))
    assert owner_is_alive(owner(pid, start, boot="00000000-0000-0000-0000-000000000000"))
    # An owner written without boot and namespace (an older release's) is left alone.
    assert owner_is_alive(f"{socket.gethostname()}:{pid}:{start}")


class _Provider:
    def __init__(self, sandboxes: dict[str, dict[str, str]]) -> None:
        self.sandboxes = sandboxes
        self.removed: list[str] = []

    def labelled(self, key: str) -> list[tuple[str, dict[str, str]]]:
        return [(id_, labels) for id_, labels in self.sandboxes.items() if key in labels]

    def remove(self, sandbox_id: str) -> None:
        if sandbox_id.startswith("stuck"):
            raise SandboxError(f"sandbox {sandbox_id}: removal failed")
        self.removed.append(sandbox_id)


def test_reap_removes_only_what_a_gone_owner_left() -> None:
    pid, start = _ended_process()
    dead = owner(pid, start)
    provider = _Provider(
        {
            "dead": {RUN_LABEL: "r1", OWNER_LABEL: dead},
            "live": {RUN_LABEL: "r2", OWNER_LABEL: owner_of_this_process()},
            "elsewhere": {RUN_LABEL: "r3", OWNER_LABEL: "other-host:1:1"},
            "no-owner": {RUN_LABEL: "r4"},
        }
    )
    assert reap_orphans(provider) == 1  # type: ignore[arg-type]
    assert provider.removed == ["dead"]


def test_a_sandbox_that_will_not_go_does_not_stop_the_reaper() -> None:
    pid, start = _ended_process()
    dead = owner(pid, start)
    provider = _Provider(
        {
            "stuck": {RUN_LABEL: "r1", OWNER_LABEL: dead},
            "next": {RUN_LABEL: "r1", OWNER_LABEL: dead},
        }
    )
    assert reap_orphans(provider) == 1  # type: ignore[arg-type]
    assert provider.removed == ["next"]
