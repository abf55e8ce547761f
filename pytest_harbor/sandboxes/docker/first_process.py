"""The first process of every sandbox the docker provider starts: it makes the sandbox's
folders and runs the engine's start script as root, says so on its output (the
container's log, which the engine reads), then becomes the keep-alive that nothing
inside can end.

Doing this in the first process, before any other runs, saves the sandbox two round
trips through the engine (an archive put for the folders, an exec for the survey), and
what it reports was written before anything of the task's or the agent's ran: the
image's own ENTRYPOINT is started later, by the engine, and the keep-alive stops writing
to the log once it has said it is ready.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import docker

from pytest_harbor.sandboxes.base import KEEPALIVE_USER, SEALED_BUSYBOX, SandboxStartError
from pytest_harbor.sandboxes.docker.engine import ENGINE_ERRORS, TRANSPORT_ERRORS, explain

__all__ = [
    "FIRST_USER",
    "FirstReport",
    "first_process",
    "read_first_report",
]

#: Who the first process starts as: root, by number, for the folders and the start
#: script; it becomes KEEPALIVE_USER before it keeps the sandbox alive.
FIRST_USER = "0:0"
#: How long the first process may take to say it is ready.
FIRST_REPORT_TIMEOUT_S = 60.0
#: The pauses between reads of the log: from the first, doubling up to the last.
_FIRST_PAUSE_S = 0.004
_LAST_PAUSE_S = 0.1
#: The most of the first process's log that is read.
_REPORT_CAP = 1024 * 1024
_MARK = "pytest-harbor-first:"
_READY = f"{_MARK}ready"
_KEEPALIVE_UID, _, _KEEPALIVE_GID = KEEPALIVE_USER.partition(":")
_SIGNALS = "1 2 3 4 5 6 7 8 10 11 12 13 14 15 16 18 20 21 22 23 24 25 26 27 28 29 30 31"

#: The keep-alive, run by the sealed busybox as KEEPALIVE_USER; $1 is its lifetime in
#: seconds. Nothing inside a sandbox, root included, can end it: it ignores every signal
#: it could be sent (the kernel drops the others for a first process), and no agent can
#: trace it (the sealed busybox). It reaps the orphans every sandbox gathers (they become
#: its children; unreaped, each would hold a place under the pids cap) by waiting on the
#: sleep it starts. It forks only then, at its start: a fork refused later (the cap
#: reached) would end the shell, and the sandbox with it. When that sleep ends early
#: (only root can kill it), it sleeps on in its own place, without reaping. It reports
#: the sleep (as the survey reports a process: pid and start time) and that it is ready,
#: then writes nothing more anywhere.
_KEEPALIVE = f"""trap '' {_SIGNALS}
read -r up _ < /proc/uptime
end=$(( ${{up%.*}} + $1 ))
{SEALED_BUSYBOX} sleep "$1" &
last=""
{{ while IFS= read -r line || [ -n "$line" ]; do last=$line; done < "/proc/$!/stat"; }} 2>/dev/null
case $last in *") "*) set -- ${{last##*) }}; echo "proc:$!:${{20}}" ;; esac
echo "{_READY}"
exec >/dev/null 2>&1 </dev/null
while :; do
  wait
  read -r up _ < /proc/uptime
  left=$(( end - ${{up%.*}} ))
  [ "$left" -gt 0 ] || exit 0
  exec {SEALED_BUSYBOX} sleep "$left"
done
"""

#: Run by the sealed busybox as root: $1 the lifetime, $2 the keep-alive's script, $3 the
#: number of folders, then each as `MODE:PATH` (octal), then the start script and its
#: arguments (none: no script). A folder's place that holds anything but a folder (a
#: file, a link) is emptied first, as an archive put would; a folder that cannot be made
#: is reported. The start script runs under the sealed `timeout`, its stdout on the log,
#: its exit status reported after it.
_FIRST = f"""trap '' {_SIGNALS}
S={SEALED_BUSYBOX}
lifetime=$1 keepalive=$2 count=$3
shift 3
paths=""
while [ "$count" -gt 0 ]; do
  path=${{1#*:}} mode=${{1%%:*}}
  shift; count=$((count - 1))
  if [ -L "$path" ] || {{ [ -e "$path" ] && [ ! -d "$path" ]; }}; then $S rm -rf "$path"; fi
  $S mkdir -p "$path" && $S chown 0:0 "$path" && $S chmod "$mode" "$path" \\
    || echo "{_MARK}missing:$path"
done
if [ "$#" -gt 0 ]; then
  script=$1
  shift
  $S timeout {FIRST_REPORT_TIMEOUT_S:g} $S sh -c "$script" sh "$@" 2>/dev/null </dev/null
  echo "{_MARK}status:$?"
fi
exec $S nsenter -F -S {_KEEPALIVE_UID} -G {_KEEPALIVE_GID} -- $S sh -c "$keepalive" sh "$lifetime"
"""


def first_process(
    lifetime: int,
    directories: Mapping[str, int],
    script: str | None = None,
    arguments: Sequence[str] = (),
) -> tuple[list[str], list[str]]:
    """The entrypoint and command of a sandbox's container (run as FIRST_USER): make
    `directories` (absolute path -> mode, owned by root), run `script` (text for the
    trusted shell) with `arguments` as root, then keep the sandbox alive for `lifetime`
    seconds as KEEPALIVE_USER."""
    command = [str(lifetime), _KEEPALIVE, str(len(directories))]
    command += [f"{mode:o}:{path}" for path, mode in sorted(directories.items())]
    if script is not None:
        command += [script, *arguments]
    return [SEALED_BUSYBOX, "sh", "-c", _FIRST, "sh"], command


@dataclass(frozen=True)
class FirstReport:
    """What the first process said: the start script's output and exit status (None:
    no script ran), and the folders it could not make."""

    output: str
    status: int | None
    missing: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> FirstReport:
        lines: list[str] = []
        status: int | None = None
        missing: list[str] = []
        for line in text.splitlines():
            if line.startswith(f"{_MARK}status:"):
                value = line.rpartition(":")[2]
                status = int(value) if value.isdigit() else -1
            elif line.startswith(f"{_MARK}missing:"):
                missing.append(line[len(_MARK) + len("missing:") :])
            elif not line.startswith(_MARK):
                lines.append(line)
        return cls("\n".join(lines) + ("\n" if lines else ""), status, tuple(missing))


def read_first_report(
    api: docker.APIClient, container_id: str, timeout_s: float = FIRST_REPORT_TIMEOUT_S
) -> FirstReport | None:
    """Wait for the first process of the started container `container_id` to say it is
    ready, and read what it said from the container's log. None when the engine's log
    driver cannot be read (the caller then does by other means what the first process
    reports); SandboxStartError when the container stopped first or `timeout_s` passed.

    The log is asked for again until it holds the ready line (the first process takes a
    few milliseconds): a plain request, which every transport to an engine carries and
    none can leave waiting, unlike a followed stream."""
    deadline = time.monotonic() + timeout_s
    pause = _FIRST_PAUSE_S
    polls = 0
    while True:
        try:
            received = api.logs(container_id, stdout=True, stderr=False)
        except docker.errors.APIError as error:
            if error.status_code == 501 or "does not support reading" in str(error):
                return None
            raise SandboxStartError(f"cannot read the sandbox's log: {explain(error)}") from None
        except TRANSPORT_ERRORS as error:
            raise SandboxStartError(f"cannot read the sandbox's log: {error}") from None
        text = bytes(received[:_REPORT_CAP]).decode("utf-8", "replace")
        if _READY in text:
            return FirstReport.parse(text.split(_READY, 1)[0])
        polls += 1
        if polls % 8 == 0 and not _running(api, container_id):
            raise SandboxStartError(
                "the sandbox's first process ended before it was ready"
                + (f": {text.strip()[-300:]}" if text.strip() else "")
            )
        if time.monotonic() >= deadline:
            raise SandboxStartError(
                f"the sandbox's first process did not say it was ready within {timeout_s:g} s"
            )
        time.sleep(min(pause, max(deadline - time.monotonic(), 0.0)))
        pause = min(pause * 2, _LAST_PAUSE_S)


def _running(api: docker.APIClient, container_id: str) -> bool:
    try:
        state = api.inspect_container(container_id).get("State") or {}
    except ENGINE_ERRORS as error:
        raise SandboxStartError(f"cannot inspect the sandbox: {explain(error)}") from None
    return bool(state.get("Running"))
