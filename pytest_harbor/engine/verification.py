"""Running tests/test.sh in a sandbox the agent had, so that the agent cannot change the
grade, and copying out what the verifier left.

Everything the engine runs in the sandbox to drive a verification comes from the trusted
tools (engine/scripts.py); only test.sh runs with the image's own bash, at the path the
seed found it. What the verifier left is read through the engine's archive API, not by a
tool inside the sandbox, and copied so that nothing the sandbox holds can fail the run on
this machine. Before test.sh starts, no process of a non-root agent's user is left, and
/tests and /logs/verifier are fresh folders belonging to the verifier alone.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from pytest_harbor.engine.context import EpisodeContext
from pytest_harbor.engine.failures import FailureKind
from pytest_harbor.engine.masked_names import MaskedPaths
from pytest_harbor.engine.processes import SandboxSurvey
from pytest_harbor.engine.python_verifiers import contract_error, verifier_files
from pytest_harbor.engine.rewards import REWARD_FILES, RewardReading, read_reward
from pytest_harbor.engine.scripts import (
    CLEAR,
    PREPARE,
    RUN_TEST,
    TESTS_DIR,
    TRAJECTORY,
    VERIFIER_LOGS,
    Tampered,
    check,
    trusted,
)
from pytest_harbor.redaction import Redactor
from pytest_harbor.sandboxes.archives import pack_tree
from pytest_harbor.sandboxes.base import (
    ROOT_USER,
    Sandbox,
    SandboxError,
    is_root_user,
    service_of,
)
from pytest_harbor.sandboxes.copies import (
    REWARD_FILE_COPY,
    VERIFIER_FOLDER_COPY,
    CopyCapped,
    bounded,
    members,
)
from pytest_harbor.settings import HarborSettings
from pytest_harbor.tasks import Task, Turn
from pytest_harbor.templates import SecretReference

__all__ = [
    "REWARD_CAP_BYTES",
    "SANDBOX_DIRECTORIES",
    "TRAJECTORY",
    "Verification",
    "VerifierRun",
    "clear_for_next_turn",
    "copy_verifier_folder",
    "run_collect_hooks",
    "run_verifier",
    "verifier_environment",
]

#: A reward file larger than this is not read: it is invalid.
REWARD_CAP_BYTES = 64 * 1024
#: Of any other file the verifier leaves, at most this much is kept ...
FILE_CAP_BYTES = 64 * 1024 * 1024
#: ... and of all of them together this much, in at most this many files.
TOTAL_CAP_BYTES = 256 * 1024 * 1024
FILE_COUNT_CAP = 20_000
#: The files cut or left out are named in the row up to this many; once one more would
#: be, the copy stops reading the folder.
CUT_NAMES_CAP = 1000
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


def clear_for_next_turn(sandbox: Sandbox) -> None:
    """Before a later turn: the previous turn's tests, reward and transcript go; the
    agent's own files under /logs/agent stay. Raises SandboxError when that failed."""
    cleared = sandbox.exec(trusted(CLEAR), user=ROOT_USER, timeout=60.0)
    check(cleared, "clearing the previous turn's files")


@dataclass(frozen=True)
class VerifierRun:
    """What one verification gave: the reward reading, and what of /logs/verifier was
    cut or left out of the copy (the caps)."""

    reading: RewardReading
    exit_code: int | None = None
    timed_out: bool = False
    cut: list[str] = field(default_factory=list)


def run_collect_hooks(
    sandbox: Sandbox, task: Task, workdir: str | None, within: Callable[[float], float]
) -> list[str]:
    """`[[verifier.collect]]`, each hook bounded by its timeout `within` what the episode
    leaves; returns notes of the hooks that failed (a failing hook is not fatal)."""
    notes = []
    for hook in task.config.verifier.collect:
        user = None if hook.user is None else str(hook.user)
        if hook.service == "main":
            done = sandbox.exec(
                ["bash", "-c", hook.command],
                user=user,
                workdir=workdir,
                timeout=within(hook.timeout_sec),
            )
        else:
            # Another service of a Compose task: its own shell, user and folder.
            done = service_of(sandbox, hook.service).exec(
                ["sh", "-c", hook.command], user=user, timeout=within(hook.timeout_sec)
            )
        if done.timed_out or done.exit_code != 0:
            why = "timed out" if done.timed_out else f"exited {done.exit_code}"
            notes.append(f"collect hook `{hook.command}` {why}")
    return notes


@dataclass(frozen=True)
class Verification:
    """One turn's verification, as the episode hands it to its mode."""

    turn: Turn
    #: The agent's transcript of the turn (the verifier gets it as a file).
    transcript: bytes
    #: The sandbox the verifier runs in as it was before any agent (the seed's survey of
    #: the agent's sandbox; a separate verifier's own).
    seed: SandboxSurvey
    #: Where the files the verifier left go.
    into: Path
    #: The turn's verifier user as `uid:gid`, when the seed read one (None: the turn's own).
    verifier_user: str | None
    #: The user (`uid:gid`) whose every process ends before a shared verification (None:
    #: root's).
    agent_id: str | None
    #: Another turn follows in the same sandbox: what a verification given a secret
    #: started ends with it (a process it left holds the secret in its environment).
    more_turns: bool = False
    #: The agent's final answer (None for the oracle): a Python verifier's `response`.
    response: str | None = None
    #: The harness's folder of the turn on this machine: the transcript is kept there too
    #: (as `trajectory.json`, unless the harness left one of its own).
    agent_into: Path | None = None


#: The transcript's name on this machine, in the harness's folder and the verifier's.
TRAJECTORY_FILE = "trajectory.json"


def keep_transcript(verification: Verification, transcript: bytes) -> None:
    """The turn's transcript as `trajectory.json` with the harness's files, and (read by
    tools made for the earlier layout, for one release more) in the verifier's folder;
    a file the harness or the verifier wrote under that name is kept as it is."""
    for folder in (verification.agent_into, verification.into):
        if folder is None:
            continue
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / TRAJECTORY_FILE
        if path.is_symlink():
            path.unlink()  # never written through: a link could point anywhere here
        if path.exists():
            continue
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(transcript)


def verifier_environment(turn: Turn, settings: HarborSettings) -> dict[str, str]:
    """The environment `turn`'s verifier runs with: each secret it is given filled from
    `settings` here, the one place a secret's value joins it (refuse_at_seed refused a
    reference these settings cannot fill)."""
    secrets, host = settings.revealed_secrets(), settings.host_variables()
    return {
        name: value.fill(secrets, host) if isinstance(value, SecretReference) else value
        for name, value in turn.verifier_env.items()
    }


def run_verifier(
    sandbox: Sandbox,
    verification: Verification,
    context: EpisodeContext,
    *,
    workdir: str | None,
    upload_tests: bool = True,
) -> VerifierRun:
    """Verify `verification.turn` in `sandbox` from `workdir`: check what the agent may
    have broken, end every process of the user `agent_id` (`uid:gid`, a non-root agent's),
    make /tests and /logs/verifier anew, upload the tests (unless the image ships them)
    and the transcript, run test.sh within the turn's share of the episode's clock, read
    the reward through the engine.

    An image that lacked bash or timeout at the seed masks the sample (nothing the agent
    did); a folder or a bash the agent replaced or removed, or an agent's process that
    would not end, scores 0 (`harbor:verifier_tampered`). Any other failure of the engine's
    steps raises SandboxError, for the caller to blame (engine/faults.py). As root this is
    one exec; a verifier user needs a second. What the verifier left is copied into the
    folder `into` (with the transcript, as `trajectory.json`), with secrets masked. A turn
    graded by a Python `verify(...)` gets the engine's runner beside its tests, and the
    agent's final answer (`response`; none for the oracle) with them
    (engine/python_verifiers.py).
    """
    turn, seed, into = verification.turn, verification.seed, verification.into
    trajectory, redactor = verification.transcript, context.redactor
    grace_s = context.settings.verifier_grace_s
    budget_s = context.clock.verifier_budget(turn)
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
    env = verifier_environment(turn, context.settings)
    budget = max(budget_s, 1.0)
    payload = pack_tree(
        {"tests": turn.tests_dirs if upload_tests else ()},
        {TRAJECTORY.lstrip("/"): trajectory, **verifier_files(turn, verification.response)},
    )
    user = verification.verifier_user or turn.verifier_user
    as_root = is_root_user(user or "")
    arguments = (
        seed.bash,
        "1" if upload_tests else "0",
        "" if as_root else user or "",
        verification.agent_id or "",
    )
    run_arguments = (seed.bash, _decimal(budget), _decimal(grace_s))
    started = time.monotonic()
    if as_root:
        # One exec: the run's arguments follow the preparation's.
        script = PREPARE + 'set -- "$5" "$6" "$7"\n' + RUN_TEST
        first = sandbox.exec(
            trusted(script, *arguments, *run_arguments),
            user=ROOT_USER,
            workdir=workdir,
            env=env,
            timeout=budget + grace_s + 60.0,
            stdin=payload,
        )
    else:
        first = sandbox.exec(
            trusted(PREPARE, *arguments),
            user=ROOT_USER,
            workdir=workdir,
            timeout=60.0,
            stdin=payload,
        )
    try:
        check(first, "the verifier's preparation", then_ran=as_root)
    except Tampered as tampered:
        return VerifierRun(
            RewardReading.failed(
                FailureKind.VERIFIER_TAMPERED,
                f"the sandbox was changed where the verifier needs it: {tampered}",
            )
        )
    result = first
    if not as_root:
        started = time.monotonic()
        result = sandbox.exec(
            trusted(RUN_TEST, *run_arguments),
            user=user,
            workdir=workdir,
            env=env,
            timeout=budget + grace_s + 60.0,
        )
    elapsed = time.monotonic() - started
    # busybox timeout: 143 after SIGTERM worked, 137 when SIGKILL was needed.
    timed_out = result.timed_out or (result.exit_code in (124, 137, 143) and elapsed >= budget)
    copied = copy_verifier_folder(sandbox, into, redactor)
    keep_transcript(verification, redactor.bytes(trajectory))
    if timed_out:
        reading = RewardReading.failed(
            FailureKind.VERIFIER_TIMEOUT,
            f"the verifier did not finish within its budget of {budget:g} s and was killed",
        )
    else:
        reading = read_reward(copied.rewards, copied.unusable)
        unmet = contract_error(into) if turn.python_verifier and reading.rewards is None else None
        if unmet is not None:
            reading = RewardReading.failed(FailureKind.VERIFIER_CONTRACT, unmet)
    return VerifierRun(reading, result.exit_code, timed_out, copied.cut)


@dataclass
class _Copied:
    """What copy_verifier_folder() found: the reward files' bytes, why a reward file
    could not be read, and the files cut short or left out."""

    rewards: dict[str, bytes] = field(default_factory=dict)
    unusable: dict[str, str] = field(default_factory=dict)
    cut: list[str] = field(default_factory=list)
    #: How many more were cut or left out than `cut` names.
    unnamed: int = 0

    def note(self, name: str) -> None:
        if len(self.cut) < CUT_NAMES_CAP:
            self.cut.append(name)
        else:
            self.unnamed += 1

    @property
    def full(self) -> bool:
        """As many names noted as are kept: the rest of the folder is not read."""
        return self.unnamed > 0


def copy_verifier_folder(sandbox: Sandbox, into: Path, redactor: Redactor) -> _Copied:
    """Copy /logs/verifier into `into` (emptied first), read through the engine's archive
    API as a stream and written file by file with secrets masked, in content and names
    (MaskedPaths): nothing of it is held whole. The copy is bounded by
    VERIFIER_FOLDER_COPY (bytes read, which counts a sparse file at its full length,
    entries and seconds): a file is cut at FILE_CAP_BYTES; past TOTAL_CAP_BYTES or
    FILE_COUNT_CAP, files are left out (the reward files are never left out for these).
    A reward file that is not a regular file, or is larger than REWARD_CAP_BYTES, is not
    read (`unusable` says why). When the copy stops before the folder's end (a cap, a
    stream that broke off), each reward file it had not reached is read on its own within
    REWARD_FILE_COPY: nothing beside them can delay the reward past that, or lose it;
    a copy that reaches the end costs no second read.

    Nothing the folder holds or does while it is read can fail the copy: a file this
    machine cannot write (a path too long for it, say) is left out and named; a stream
    that breaks off (a file growing or shrinking as it is read) or reaches a cap ends the
    copy, and the reason is named. Raises SandboxError only when the engine could not be
    asked for the folder at all.
    """
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True, exist_ok=True)
    copied = _Copied()
    names = MaskedPaths(redactor)
    seen: set[str] = set()
    if not _copy_folder(sandbox, into, redactor, copied, names, seen):
        for name in REWARD_FILES:
            if name not in seen:
                _read_reward_alone(sandbox, name, into, redactor, copied, names)
    if copied.full:
        copied.cut.append(f"(and {copied.unnamed} more, not read)")
    return copied


def _copy_folder(
    sandbox: Sandbox,
    into: Path,
    redactor: Redactor,
    copied: _Copied,
    names: MaskedPaths,
    seen: set[str],
) -> bool:
    """The copy of /logs/verifier (copy_verifier_folder); the reward files it meets are
    named in `seen`. Whether it read the folder to its end (or found no folder)."""
    chunks = sandbox.iter_archive(VERIFIER_LOGS)
    if chunks is None:
        return True
    total = files = 0
    stream = bounded(chunks, VERIFIER_FOLDER_COPY, VERIFIER_LOGS)
    try:
        for archive, member in members(stream):
            if copied.full:
                return False
            parts = member.name.split("/")[1:]
            if not parts or any(part in ("", ".", "..") for part in parts):
                continue
            name = _shown("/".join(parts))
            if name in REWARD_FILES:
                seen.add(name)
                _take_reward(archive, member, name, into, redactor, copied, names)
                continue
            if not member.isreg():
                continue
            if files >= FILE_COUNT_CAP or total >= TOTAL_CAP_BYTES:
                copied.note(name)
                continue
            source = archive.extractfile(member)
            if source is None:
                continue
            room = min(FILE_CAP_BYTES, TOTAL_CAP_BYTES - total)
            placed = names.place(parts)
            written = _shown("/".join(placed))
            cut = member.size > room
            body = redactor.stream(_read_up_to(source, room), cut=cut)
            tail = [f"\n[... cut: {member.size - room} more bytes ...]\n".encode()]
            _write(into, placed, _chain(body, tail if cut else []), copied, written)
            if cut:
                copied.note(written)
            total += min(member.size, room)
            files += 1
    except CopyCapped as error:
        copied.note(f"(the rest of the folder: not read: {_shown(str(error))})")
        return False
    except (tarfile.TarError, OSError, SandboxError, ValueError) as error:
        copied.note(f"(the rest of the folder: reading it broke off: {_shown(str(error))})")
        return False
    finally:
        stream.close()  # a copy left early (the names' cap) frees the engine at once
    return True


def _unreadable_reward(member: tarfile.TarInfo) -> str | None:
    if not member.isreg():
        return f"is not a regular file ({_kind(member)})"
    if member.size > REWARD_CAP_BYTES:
        return f"is larger than {REWARD_CAP_BYTES} bytes ({member.size} bytes)"
    return None


def _read_reward_alone(
    sandbox: Sandbox,
    name: str,
    into: Path,
    redactor: Redactor,
    copied: _Copied,
    names: MaskedPaths,
) -> None:
    """One reward file, read on its own within REWARD_FILE_COPY (_take_reward). Not
    there: nothing to add."""
    try:
        chunks = sandbox.iter_archive(f"{VERIFIER_LOGS}/{name}")
        if chunks is None:
            return
        stream = bounded(chunks, REWARD_FILE_COPY, f"{VERIFIER_LOGS}/{name}")
        try:
            for archive, member in members(stream):
                _take_reward(archive, member, name, into, redactor, copied, names)
                return
        finally:
            stream.close()
    except (tarfile.TarError, OSError, SandboxError, ValueError) as error:
        copied.unusable[name] = f"could not be read ({_shown(str(error))})"


def _take_reward(
    archive: tarfile.TarFile,
    member: tarfile.TarInfo,
    name: str,
    into: Path,
    redactor: Redactor,
    copied: _Copied,
    names: MaskedPaths,
) -> None:
    """The reward file `member` checked, kept as written for reading, and written below
    `into` masked."""
    reason = _unreadable_reward(member)
    if reason is not None:
        copied.unusable[name] = reason
        if member.isreg():
            copied.note(name)
        return
    source = archive.extractfile(member)
    if source is not None:
        # Read as written (a masked copy could no longer be a number).
        copied.rewards[name] = source.read(REWARD_CAP_BYTES + 1)
        placed = names.place([name])
        data = [redactor.bytes(copied.rewards[name])]
        _write(into, placed, data, copied, _shown("/".join(placed)))


def _write(
    into: Path, parts: list[str], chunks: Iterator[bytes] | list[bytes], copied: _Copied, name: str
) -> None:
    """Write one file below `into`; one this machine refuses (a path too long for it, a
    name it cannot hold, a file where a folder was) is left out and named instead."""
    try:
        target = into.joinpath(*parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("wb") as handle:
            for chunk in chunks:
                handle.write(chunk)
    except (OSError, ValueError) as error:
        copied.note(f"{name} (not written here: {type(error).__name__})")
        # The rest of the member is skipped by the archive itself.


def _decimal(seconds: float) -> str:
    """Seconds as `timeout` reads them: a plain decimal (never `3e+09`), at most 2**31 - 1
    (a task may ask for any finite timeout)."""
    return f"{min(seconds, 2**31 - 1):.3f}".rstrip("0").rstrip(".")


def _chain(*parts: Iterator[bytes] | list[bytes]) -> Iterator[bytes]:
    for part in parts:
        yield from part


def _read_up_to(source: IO[bytes], limit: int) -> Iterator[bytes]:
    while limit > 0:
        chunk = source.read(min(_CHUNK, limit))
        if not chunk:
            return
        limit -= len(chunk)
        yield chunk


def _shown(name: str) -> str:
    """A name from the sandbox as text a results file can hold: bytes that are not UTF-8
    as U+FFFD, at most 500 characters."""
    text = name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return text if len(text) <= 500 else text[:480] + "[...]"


def _kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return f"a symbolic link to {_shown(member.linkname)}"
    if member.islnk():
        return f"a hard link to {_shown(member.linkname)}"
    if member.isfifo():
        return "a FIFO"
    if member.isdev():
        return "a device"
    if member.isdir():
        return "a folder"
    return "not a file"
