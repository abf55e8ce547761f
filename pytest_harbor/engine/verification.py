"""Running tests/test.sh in a sandbox the agent had, so that the agent cannot change the
grade, and the folders and scripts that takes.

Everything the engine runs in the sandbox to drive a verification comes from the trusted
tools (a static busybox mounted read-only, TRUSTED_BUSYBOX): the shell, `timeout`, `tar`,
`rm`, `kill`. Only test.sh runs with the image's own bash, at the path the seed found it.
What the verifier left is read through the engine's archive API, not by a tool inside the
sandbox. Before test.sh starts, every process a non-root agent started is killed, and
/tests and /logs/verifier belong to the verifier alone.
"""

from __future__ import annotations

import logging
import shutil
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from pytest_harbor.engine.failures import FailureKind
from pytest_harbor.engine.rewards import REWARD_FILES, RewardReading, read_reward
from pytest_harbor.redaction import Redactor
from pytest_harbor.sandboxes.archives import ChunkReader, pack_tree
from pytest_harbor.sandboxes.base import TRUSTED_BUSYBOX, Sandbox, SandboxError
from pytest_harbor.tasks import Turn

__all__ = [
    "REWARD_CAP_BYTES",
    "SANDBOX_DIRECTORIES",
    "TRAJECTORY",
    "SandboxSurvey",
    "VerifierRun",
    "clear_for_next_turn",
    "kill_processes_since",
    "run_verifier",
    "survey",
    "trusted",
]

log = logging.getLogger("pytest_harbor")

TESTS_DIR = "/tests"
#: Where the verifier finds the agent's transcript (ATIF), written just before it runs.
TRAJECTORY = "/logs/agent/trajectory.json"
VERIFIER_LOGS = "/logs/verifier"
#: A reward file larger than this is not read: it is invalid.
REWARD_CAP_BYTES = 64 * 1024
#: Of any other file the verifier leaves, at most this much is kept ...
FILE_CAP_BYTES = 64 * 1024 * 1024
#: ... and of all of them together this much, in at most this many files.
TOTAL_CAP_BYTES = 256 * 1024 * 1024
FILE_COUNT_CAP = 20_000
_CHUNK = 64 * 1024

#: Made before the sandbox starts. The agent's folder is writable by any user; the
#: verifier's is handed to the verifier's user when it runs.
SANDBOX_DIRECTORIES = {
    "/logs": 0o755,
    "/logs/agent": 0o777,
    VERIFIER_LOGS: 0o755,
    "/logs/artifacts": 0o777,
    TESTS_DIR: 0o755,
    "/solution": 0o755,
}

_TAMPERED = "pytest-harbor-tampered:"
_BROKEN = "pytest-harbor-error:"

#: Shell functions every engine script starts with ($B is the trusted busybox).
_PRELUDE = f"""
B={TRUSTED_BUSYBOX}
tampered() {{ echo "{_TAMPERED} $*" >&2; exit 0; }}
broken() {{ echo "{_BROKEN} $*" >&2; exit 1; }}
empty() {{
  for dir in "$@"; do
    $B rm -rf "$dir"/* "$dir"/.[!.]* "$dir"/..?* || broken "cannot empty $dir"
  done
}}
"""

# What the sandbox is at the end of the seed, before any agent: the image's bash and
# timeout on its PATH (else in the usual folders), and every process with its start time
# (which no later process can have: the kernel sets it).
_SURVEY = """
echo "path:$PATH"
locate() {
  found=""
  old_ifs=$IFS; IFS=:
  for dir in $PATH:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin; do
    if [ -f "$dir/$1" ] && [ -x "$dir/$1" ]; then found="$dir/$1"; break; fi
  done
  IFS=$old_ifs
  echo "$1:$found"
}
locate bash
locate timeout
for p in /proc/[0-9]*; do
  read -r stat 2>/dev/null < "$p/stat" || continue
  rest=${stat##*) }
  set -- $rest
  echo "proc:${p#/proc/}:${20}"
done
"""

# Kills, as root, every process of user $1 (a name or a uid; "" for every user) that is
# not in $2, the seed's "pid:start" list; again until none is left (one may fork while
# its parent dies).
_KILL = """
kill_user=$1 keep=" $2 "
case $kill_user in
  *[!0-9]*) uid=$($B id -u "$kill_user") || broken "no user $kill_user" ;;
  *) uid=$kill_user ;;
esac
round=0
while [ $round -lt 20 ]; do
  round=$((round + 1)) killed=""
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    [ "$pid" = "$$" ] && continue
    read -r stat 2>/dev/null < "$p/stat" || continue
    rest=${stat##*) }
    set -- $rest
    # A zombie is dead already (nothing reaps orphans in a sandbox); kill cannot end it.
    [ "$1" = Z ] && continue
    case "$keep" in *" $pid:${20} "*) continue ;; esac
    owner=""
    { while read -r key real rest; do
        if [ "$key" = "Uid:" ]; then owner=$real; break; fi
      done < "$p/status"; } 2>/dev/null
    if [ -z "$uid" ] || [ "$owner" = "$uid" ]; then kill -9 "$pid" 2>/dev/null && killed=1; fi
  done
  [ -z "$killed" ] && break
done
"""

# As root: the folders must still be folders and the image's bash still there; the
# agent's processes go; /tests and /logs/verifier are emptied and handed to the verifier;
# the tests and the transcript are unpacked from stdin. Arguments: bash, whether to empty
# /tests, the verifier's user (or ""), the user to kill (or ""), the seed's processes.
_PREPARE = (
    """
bash=$1 upload=$2 verifier_user=$3 kill_user=$4 keep=$5
for dir in /logs /tests /logs/verifier; do
  if [ -L "$dir" ] || [ ! -d "$dir" ]; then tampered "$dir is no longer a folder"; fi
done
if [ ! -f "$bash" ] || [ ! -x "$bash" ]; then
  tampered "$bash, which runs the verifier, is gone"
fi
if [ -n "$kill_user" ]; then
  ( set -- "$kill_user" "$keep"
"""
    + _KILL
    + f"""
  ) || exit $?
fi
if [ "$upload" = 1 ]; then empty {TESTS_DIR} {VERIFIER_LOGS}; else empty {VERIFIER_LOGS}; fi
$B chown 0:0 {TESTS_DIR} && $B chmod 755 {TESTS_DIR} || broken "cannot take {TESTS_DIR}"
$B chown "${{verifier_user:-0}}" {VERIFIER_LOGS} && $B chmod 755 {VERIFIER_LOGS} \\
  || broken "cannot hand {VERIFIER_LOGS} to ${{verifier_user:-root}}"
if [ -L /logs/agent ] || [ ! -d /logs/agent ]; then
  $B rm -rf /logs/agent && $B mkdir -p /logs/agent && $B chmod 777 /logs/agent \\
    || broken "cannot make /logs/agent"
fi
$B rm -f {TRAJECTORY} || broken "cannot replace {TRAJECTORY}"
$B tar -x -f - -C / || broken "cannot unpack the tests"
"""
)

# Runs test.sh with the image's bash under the trusted timeout, from the working
# directory (`exec`: the shell would add its own word on a killed test.sh to the output).
# Arguments: bash, budget, grace.
_RUN = f"""
exec $B timeout -s TERM -k "$3" "$2" "$1" {TESTS_DIR}/test.sh \
  > {VERIFIER_LOGS}/test-stdout.txt 2>&1
"""

# Before a later turn, as root: the previous turn's tests, reward files and transcript go.
_CLEAR = f"""
for dir in {TESTS_DIR} {VERIFIER_LOGS}; do
  if [ -d "$dir" ] && [ ! -L "$dir" ]; then empty "$dir"; fi
done
$B rm -f {TRAJECTORY}
"""


def trusted(script: str, *arguments: str) -> list[str]:
    """The command that runs `script` with the trusted shell (and its helper functions)."""
    return [TRUSTED_BUSYBOX, "sh", "-c", _PRELUDE + script, "sh", *arguments]


@dataclass(frozen=True)
class SandboxSurvey:
    """What a sandbox was before any agent had it."""

    #: The image's bash and timeout, as found on its PATH (None: it has none).
    bash: str | None
    timeout: str | None
    #: `pid:start` of every process then.
    processes: frozenset[str] = frozenset()

    @property
    def lacking(self) -> list[str]:
        return [tool for tool, path in (("bash", self.bash), ("timeout", self.timeout)) if not path]


def survey(sandbox: Sandbox) -> SandboxSurvey:
    """Look at a sandbox before the agent has it (the end of the seed). An answer that
    lists no process (there is always one: the keep-alive) was lost on its way: it is
    asked again, once, rather than taken to say that the image lacks its tools."""
    for _ in range(2):
        done = sandbox.exec(trusted(_SURVEY), user="root", timeout=60.0)
        if done.exit_code != 0:
            raise SandboxError(f"cannot survey the sandbox: {done.stderr.strip()[-300:]}")
        tools: dict[str, str | None] = {}
        processes = set()
        for line in done.stdout.splitlines():
            kind, _, value = line.partition(":")
            if kind == "proc":
                processes.add(value)
            elif kind in ("bash", "timeout"):
                tools[kind] = value or None
        if processes and len(tools) == 2:
            found = SandboxSurvey(tools["bash"], tools["timeout"], frozenset(processes))
            if found.lacking:
                log.warning(
                    "sandbox %s: no %s on its PATH (%s) or in the usual folders",
                    sandbox.id[:12],
                    " or ".join(found.lacking),
                    next(
                        (line[5:] for line in done.stdout.splitlines() if line.startswith("path:")),
                        "",
                    ),
                )
            return found
        log.warning(
            "the survey of sandbox %s gave an incomplete answer (stdout %r, stderr %r)",
            sandbox.id[:12],
            done.stdout[-300:],
            done.stderr[-300:],
        )
    raise SandboxError(f"the survey of sandbox {sandbox.id[:12]} gave no complete answer")


def kill_processes_since(sandbox: Sandbox, before: frozenset[str]) -> None:
    """Kill, as root, every process of any user that is not in `before` (`pid:start` of
    the processes there when the agent's turn began): all the agent started, however it
    detached. An agent's turn that ran out of time ends this way."""
    done = sandbox.exec(trusted(_KILL, "", " ".join(sorted(before))), user="root", timeout=60.0)
    if done.exit_code != 0:
        raise SandboxError(f"cannot end the agent's processes: {done.stderr.strip()[-300:]}")


def clear_for_next_turn(sandbox: Sandbox) -> None:
    """Before a later turn: the previous turn's tests, reward and transcript go; the
    agent's own files under /logs/agent stay."""
    cleared = sandbox.exec(trusted(_CLEAR), user="root", timeout=60.0)
    if cleared.exit_code != 0:
        raise SandboxError(f"cannot clear the previous turn's files: {cleared.stderr.strip()}")


@dataclass(frozen=True)
class VerifierRun:
    """What one verification gave: the reward reading, and what of /logs/verifier was
    cut or left out of the copy (the caps)."""

    reading: RewardReading
    exit_code: int | None = None
    timed_out: bool = False
    cut: list[str] = field(default_factory=list)


def run_verifier(
    sandbox: Sandbox,
    turn: Turn,
    *,
    workdir: str | None,
    grace_s: float,
    budget_s: float,
    trajectory: bytes,
    seed: SandboxSurvey,
    into: Path,
    redactor: Redactor | None = None,
    kill_user: str | None = None,
    upload_tests: bool = True,
) -> VerifierRun:
    """Verify `turn` in `sandbox`: check what the agent may have broken, kill the
    processes of `kill_user` the seed did not have, empty /tests and /logs/verifier, upload
    the tests (unless the image ships them) and the transcript, run test.sh, read the
    reward through the engine.

    An image that lacked bash or timeout at the seed masks the sample (nothing the agent
    did); a folder or a bash the agent replaced or removed scores 0
    (`harbor:verifier_tampered`). As root this is one exec; a verifier user needs a second.
    What the verifier left is copied into the folder `into`, file by file (with the
    transcript, as `trajectory.json`), with secrets masked.
    """
    if seed.lacking:
        tools = " and ".join(seed.lacking)
        return VerifierRun(
            RewardReading.failed(
                FailureKind.VERIFIER_ERROR,
                f"the image lacks {tools}, which the verifier needs",
                masked=True,
            )
        )
    assert seed.bash is not None
    budget = max(budget_s, 1.0)
    payload = pack_tree(
        {"tests": turn.tests_dirs if upload_tests else ()},
        {TRAJECTORY.lstrip("/"): trajectory},
    )
    user = turn.verifier_user
    as_root = user in (None, "root", "0")
    verifier_owner = "" if as_root else (user or "").split(":")[0]
    arguments = (
        seed.bash,
        "1" if upload_tests else "0",
        verifier_owner,
        kill_user or "",
        " ".join(sorted(seed.processes)),
    )
    run_arguments = (seed.bash, f"{budget:g}", f"{grace_s:g}")
    started = time.monotonic()
    if as_root:
        # One exec: the run's arguments follow the preparation's.
        script = _PREPARE + 'set -- "$6" "$7" "$8"\n' + _RUN
        first = sandbox.exec(
            trusted(script, *arguments, *run_arguments),
            user="root",
            workdir=workdir,
            env=turn.verifier_env,
            timeout=budget + grace_s + 30.0,
            stdin=payload,
        )
    else:
        first = sandbox.exec(
            trusted(_PREPARE, *arguments), user="root", workdir=workdir, timeout=60.0, stdin=payload
        )
    tampered = _marked(first.stderr, _TAMPERED)
    if tampered is not None:
        return VerifierRun(
            RewardReading.failed(
                FailureKind.VERIFIER_TAMPERED,
                f"the sandbox was changed where the verifier needs it: {tampered}",
            )
        )
    problem = _marked(first.stderr, _BROKEN)
    if problem is not None:
        raise SandboxError(problem)
    result = first
    if not as_root:
        started = time.monotonic()
        result = sandbox.exec(
            trusted(_RUN, *run_arguments),
            user=user,
            workdir=workdir,
            env=turn.verifier_env,
            timeout=budget + grace_s + 30.0,
        )
    elapsed = time.monotonic() - started
    # busybox timeout: 143 after SIGTERM worked, 137 when SIGKILL was needed.
    timed_out = result.timed_out or (result.exit_code in (124, 137, 143) and elapsed >= budget)
    copied = copy_verifier_folder(sandbox, into, redactor or Redactor())
    if not (into / "trajectory.json").exists():
        (into / "trajectory.json").write_bytes((redactor or Redactor()).bytes(trajectory))
    if timed_out:
        reading = RewardReading.failed(
            FailureKind.VERIFIER_TIMEOUT,
            f"the verifier did not finish within its budget of {budget:g} s and was killed",
        )
    else:
        reading = read_reward(copied.rewards, copied.unusable)
    return VerifierRun(reading, result.exit_code, timed_out, copied.cut)


@dataclass
class _Copied:
    """What copy_verifier_folder() found: the reward files' bytes, why a reward file
    could not be read, and the files cut short or left out."""

    rewards: dict[str, bytes] = field(default_factory=dict)
    unusable: dict[str, str] = field(default_factory=dict)
    cut: list[str] = field(default_factory=list)


def copy_verifier_folder(sandbox: Sandbox, into: Path, redactor: Redactor) -> _Copied:
    """Copy /logs/verifier into `into` (emptied first), read through the engine's archive
    API as a stream and written file by file with secrets masked: nothing of it is held
    whole. A file is cut at FILE_CAP_BYTES; past TOTAL_CAP_BYTES or FILE_COUNT_CAP, files
    are left out. A reward file that is not a regular file, or is larger than
    REWARD_CAP_BYTES, is not read (`unusable` says why)."""
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True, exist_ok=True)
    copied = _Copied()
    chunks = sandbox.iter_archive(VERIFIER_LOGS)
    if chunks is None:
        return copied
    total = files = 0
    with tarfile.open(fileobj=ChunkReader(chunks), mode="r|") as archive:
        for member in archive:
            parts = member.name.split("/")[1:]
            if not parts or any(part in ("", ".", "..") for part in parts):
                continue
            name = "/".join(parts)
            if name in REWARD_FILES:
                if not member.isreg():
                    copied.unusable[name] = f"is not a regular file ({_kind(member)})"
                    continue
                if member.size > REWARD_CAP_BYTES:
                    copied.unusable[name] = (
                        f"is larger than {REWARD_CAP_BYTES} bytes ({member.size} bytes)"
                    )
                    copied.cut.append(name)
                    continue
            if not member.isreg():
                continue
            # The reward files (small, by the check above) are never left out.
            if name not in REWARD_FILES and (files >= FILE_COUNT_CAP or total >= TOTAL_CAP_BYTES):
                copied.cut.append(name)
                continue
            source = archive.extractfile(member)
            if source is None:
                continue
            room = min(FILE_CAP_BYTES, TOTAL_CAP_BYTES - total)
            target = into.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            if name in REWARD_FILES:
                # Read as written (a masked copy could no longer be a number).
                copied.rewards[name] = source.read()
                target.write_bytes(redactor.bytes(copied.rewards[name]))
            else:
                with target.open("wb") as handle:
                    for chunk in redactor.stream(_read_up_to(source, room)):
                        handle.write(chunk)
                    if member.size > room:
                        cut = member.size - room
                        handle.write(f"\n[... cut: {cut} more bytes ...]\n".encode())
                        copied.cut.append(name)
            total += min(member.size, room)
            files += 1
    return copied


def _read_up_to(source: IO[bytes], limit: int) -> Iterator[bytes]:
    while limit > 0:
        chunk = source.read(min(_CHUNK, limit))
        if not chunk:
            return
        limit -= len(chunk)
        yield chunk


def _kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return f"a symbolic link to {member.linkname}"
    if member.islnk():
        return f"a hard link to {member.linkname}"
    if member.isfifo():
        return "a FIFO"
    if member.isdev():
        return "a device"
    if member.isdir():
        return "a folder"
    return "not a file"


def _marked(stderr: str, marker: str) -> str | None:
    """The text after `marker` on the first stderr line that carries it."""
    for line in stderr.splitlines():
        if line.startswith(marker):
            return line[len(marker) :].strip()
    return None
