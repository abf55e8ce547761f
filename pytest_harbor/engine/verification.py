"""Running tests/test.sh in a sandbox, and the folders and scripts that takes."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pytest_harbor.engine.failures import FailureKind
from pytest_harbor.engine.rewards import RewardReading, read_reward
from pytest_harbor.sandboxes.archives import pack_tree, unpack_files
from pytest_harbor.sandboxes.base import Sandbox, SandboxError
from pytest_harbor.tasks import Turn

__all__ = [
    "CLEAR_FOR_NEXT_TURN",
    "ENTRYPOINT_EXIT",
    "RUN_DIR",
    "SANDBOX_DIRECTORIES",
    "TRAJECTORY",
    "VerifierRun",
    "run_verifier",
]

TESTS_DIR = "/tests"
#: Where the verifier finds the agent's transcript (ATIF), written just before it runs.
TRAJECTORY = "/logs/agent/trajectory.json"
VERIFIER_LOGS = "/logs/verifier"
REQUIRED_TOOLS = ("bash", "timeout", "tar")
#: The engine's own notes inside a sandbox (the ENTRYPOINT's log and exit code).
RUN_DIR = "/run/pytest-harbor"
ENTRYPOINT_EXIT = "entrypoint.exit"

#: Made before the sandbox starts; the log folders are writable by any agent or verifier user.
SANDBOX_DIRECTORIES = {
    "/logs": 0o755,
    "/logs/agent": 0o777,
    "/logs/verifier": 0o777,
    "/logs/artifacts": 0o777,
    TESTS_DIR: 0o755,
    "/solution": 0o755,
    "/run": 0o755,
    RUN_DIR: 0o1777,
}

#: Before a later turn, as root: the previous turn's tests, reward files and transcript go.
CLEAR_FOR_NEXT_TURN = (
    f"for dir in {TESTS_DIR} {VERIFIER_LOGS}; do "
    'rm -rf "$dir"/* "$dir"/.[!.]* "$dir"/..?*; done; rm -f /logs/agent/trajectory.json'
)

_MISSING = "pytest-harbor-missing:"
_BROKEN = "pytest-harbor-error:"

# As root: check the tools, empty /logs/verifier (dotfiles too) and, unless the image ships
# its tests, /tests, then unpack the tests from stdin. Marker lines on stderr say what broke.
_PREPARE = f"""
missing=""
for tool in {" ".join(REQUIRED_TOOLS)}; do
  command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
done
if [ -n "$missing" ]; then echo "{_MISSING}$missing" >&2; exit 0; fi
for dir in {{folders}}; do
  rm -rf "$dir"/* "$dir"/.[!.]* "$dir"/..?* \
    || {{{{ echo "{_BROKEN} cannot empty $dir" >&2; exit 1; }}}}
done
mkdir -p {TESTS_DIR} {VERIFIER_LOGS} && chmod 777 {VERIFIER_LOGS} \\
  || {{{{ echo "{_BROKEN} cannot make {VERIFIER_LOGS}" >&2; exit 1; }}}}
"""
# Unpacks stdin at / : the tests under tests/, the transcript as logs/agent/trajectory.json.
_UNPACK = f'tar -x -f - -C / || {{ echo "{_BROKEN} cannot unpack the tests" >&2; exit 1; }}\n'

# Runs test.sh under `timeout`, then writes /logs/verifier as a tar to stdout.
_RUN = (
    "timeout -k {grace} {budget} bash {tests}/test.sh > {logs}/test-stdout.txt 2>&1; "
    "code=$?; tar -c -f - -C {logs} .; exit $code"
)


@dataclass(frozen=True)
class VerifierRun:
    """What one verification gave: the reward reading and everything in /logs/verifier."""

    reading: RewardReading
    exit_code: int | None = None
    timed_out: bool = False
    files: dict[str, bytes] = field(default_factory=dict)


def run_verifier(
    sandbox: Sandbox,
    turn: Turn,
    *,
    workdir: str | None,
    grace_s: float,
    budget_s: float,
    trajectory: bytes,
    upload_tests: bool = True,
) -> VerifierRun:
    """Empty /tests and /logs/verifier, upload the tests (unless the image ships them),
    write the transcript to /logs/agent/trajectory.json, run test.sh, read the reward.

    As root this is one exec; a verifier user needs a second one, since emptying the
    folders needs root. The files returned include the transcript as `trajectory.json`.
    """
    budget = max(budget_s, 1.0)
    run = _RUN.format(
        grace=f"{grace_s:g}", budget=f"{budget:g}", tests=TESTS_DIR, logs=VERIFIER_LOGS
    )
    folders = f"{TESTS_DIR} {VERIFIER_LOGS}" if upload_tests else VERIFIER_LOGS
    prepare = _PREPARE.format(folders=folders) + _UNPACK
    payload = pack_tree(
        {"tests": turn.tests_dirs if upload_tests else ()},
        {TRAJECTORY.lstrip("/"): trajectory},
    )
    as_root = turn.verifier_user in (None, "root", "0")
    started = time.monotonic()
    first = sandbox.exec(
        ["/bin/sh", "-c", prepare + (run if as_root else "")],
        user="root",
        workdir=workdir,
        env=turn.verifier_env if as_root else None,
        timeout=budget + grace_s + 10.0 if as_root else 60.0,
        stdin=payload,
    )
    problem = _marked(first.stderr, _BROKEN)
    if problem is not None:
        raise SandboxError(problem)
    missing = _marked(first.stderr, _MISSING)
    if missing is not None:
        tools = " and ".join(missing.split())
        return VerifierRun(
            RewardReading.failed(
                FailureKind.VERIFIER_ERROR,
                f"the image lacks {tools}, which the verifier needs",
                masked=True,
            )
        )
    result = first
    if not as_root:
        started = time.monotonic()
        result = sandbox.exec(
            ["/bin/sh", "-c", run],
            user=turn.verifier_user,
            workdir=workdir,
            env=turn.verifier_env,
            timeout=budget + grace_s + 10.0,
        )
    elapsed = time.monotonic() - started
    # `timeout` exits 124 after SIGTERM worked, 137 when SIGKILL was needed.
    timed_out = result.timed_out or (result.exit_code in (124, 137) and elapsed >= budget)
    files = unpack_files(result.stdout_bytes) if result.stdout_bytes else {}
    files.setdefault("trajectory.json", trajectory)
    if timed_out:
        reading = RewardReading.failed(
            FailureKind.VERIFIER_TIMEOUT,
            f"the verifier did not finish within its budget of {budget:g} s and was killed",
        )
    else:
        reading = read_reward(files)
    return VerifierRun(reading, result.exit_code, timed_out, files)


def _marked(stderr: str, marker: str) -> str | None:
    """The text after `marker` on the first stderr line that carries it."""
    for line in stderr.splitlines():
        if line.startswith(marker):
            return line[len(marker) :].strip()
    return None
