"""Removing what runs that are gone left behind, never what a live run owns.

Every sandbox is labelled with its run's owner: `host:pid:start:boot:pidns`, where
`start` is when the process began (so a recycled pid does not pass for the dead process),
`boot` the kernel's boot id and `pidns` its PID namespace: a pid means something only to
processes of the same boot and namespace (two CI containers on one host's network share a
host name, not their pids).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from pytest_harbor.display import harbor_logger
from pytest_harbor.labels import OWNER_LABEL, RUN_LABEL
from pytest_harbor.sandboxes.base import SandboxError, SandboxProvider, SweepsLeftovers

__all__ = ["owner_is_alive", "owner_of_this_process", "reap_orphans"]

log = harbor_logger()


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command (Linux), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command may hold spaces and parentheses: the other fields follow the last ')'.
    return stat[stat.rindex(")") + 2 :].split()


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot, or None."""
    fields = _stat_fields(pid)
    return None if fields is None else fields[19]


def _is_zombie(pid: int) -> bool:
    """A process that ended and that its parent has not waited for yet."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] in ("Z", "X")


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _pid_namespace() -> str:
    try:
        link = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return ""
    return "".join(character for character in link if character.isdigit())


def _here() -> tuple[str, str, str]:
    """What a pid is relative to: this host, its boot, this PID namespace."""
    return socket.gethostname(), _boot_id(), _pid_namespace()


def owner_of_this_process() -> str:
    pid = os.getpid()
    host, boot, namespace = _here()
    return f"{host}:{pid}:{_start_time(pid) or 0}:{boot}:{namespace}"


def owner_is_alive(owner: str) -> bool:
    """False only when `owner` is a process of this host, boot and PID namespace that has
    ended (or whose pid now belongs to a later process); anything unsure counts as alive,
    an owner written without boot and namespace too."""
    parts = owner.split(":")
    if len(parts) != 5:
        return True
    host, pid_text, start, boot, namespace = parts
    if (host, boot, namespace) != _here() or not boot or not namespace:
        return True
    if not pid_text.isdigit():
        return True
    pid = int(pid_text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    if _is_zombie(pid):
        return False
    now = _start_time(pid)
    return now is None or start in ("", "0") or now == start


def reap_orphans(provider: SandboxProvider) -> int:
    """Remove every sandbox of a run whose owner is gone; return how many. A sandbox that
    will not go is left for the next reaper, not a reason to stop."""
    removed = 0
    for sandbox_id, labels in provider.labelled(RUN_LABEL):
        owner = labels.get(OWNER_LABEL)
        if owner is None or owner_is_alive(owner):
            continue
        try:
            provider.remove(sandbox_id)
        except SandboxError as error:
            log.warning(
                "could not remove sandbox %s of a run that is gone: %s", sandbox_id[:12], error
            )
            continue
        removed += 1
    # What Compose projects of such runs made beside their containers: networks, volumes.
    if not isinstance(provider, SweepsLeftovers):
        return removed
    for reference, labels in provider.labelled_leftovers(RUN_LABEL):
        owner = labels.get(OWNER_LABEL)
        if owner is not None and not owner_is_alive(owner):
            provider.remove_leftover(reference)
    return removed
