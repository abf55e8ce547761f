"""What a step of a multi-step task does before its agent, in Harbor 0.26's order: its
`workdir/` copied into the working directory, its `workdir/setup.sh` run there, then its
healthcheck, each as the step's agent user.

Harbor runs `setup.sh` without a bound and leaves it in the working directory; here, as
the reference documents ask, it is bounded (`step_setup_timeout_s`, else the step's agent
budget) and removed once it has run, so the agent never meets it. A step whose set-up or
healthcheck fails runs no agent and no verifier: it scores 0 with the failure named, and
the episode stops after it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pytest_harbor.engine.failures import EpisodeError, FailureKind
from pytest_harbor.engine.readiness import wait_healthy
from pytest_harbor.engine.rewards import RewardReading
from pytest_harbor.engine.scripts import trusted
from pytest_harbor.redaction import Redactor, clip_tail
from pytest_harbor.sandboxes.archives import pack_folder
from pytest_harbor.sandboxes.base import Sandbox
from pytest_harbor.tasks import Turn

__all__ = ["UNPACK_WORKDIR", "prepare_step"]

#: As the step's agent user: the step's files, from stdin, into the working directory $1
#: (unpacked as that user, so they are the user's and land only where the user may write),
#: once none of the folders they go into ($2...) is a link (an earlier agent's, which the
#: unpacking would follow: for a root step, into any folder of the sandbox).
UNPACK_WORKDIR = """
W=$1; shift
for folder in "$@"; do
  if [ -L "$W/$folder" ]; then echo "$W/$folder is a link, not a folder" >&2; exit 3; fi
done
$B tar -x -f - -C "$W"
"""
#: As the step's agent user: `bash <workdir>/setup.sh` from the working directory $1 with
#: the image's bash $2, then the script removed (whatever it did to itself).
RUN_SETUP = """
cd "$1" || exit 126
"$2" "$1/setup.sh"
status=$?
$B rm -f "$1/setup.sh"
exit $status
"""


def _folders(root: Path) -> list[str]:
    """The folders below `root`, relative, parents first."""
    return sorted(str(path.relative_to(root)) for path in root.rglob("*") if path.is_dir())


def prepare_step(
    sandbox: Sandbox,
    turn: Turn,
    *,
    workdir: str,
    user: str | None,
    bash: str | None,
    setup_s: float,
    remaining: Callable[[], float],
    redactor: Redactor,
) -> RewardReading | None:
    """Copy the step's files, run its set-up and its healthcheck; None when all went
    well, else the failed reading the turn scores. `user` is the step's agent user as
    numbers (None: root); `bash` the image's, as the seed found it (an image without
    one masks a step with a set-up script). Raises SandboxError when the engine could
    not be asked."""
    if turn.setup_script is not None and bash is None:
        lacking = f"step {turn.name}: the image lacks bash, which its workdir/setup.sh needs"
        return RewardReading.failed(FailureKind.STEP_SETUP_FAILED, lacking, masked=True)
    if turn.workdir_dir is not None:
        unpacked = sandbox.exec(
            trusted(UNPACK_WORKDIR, workdir, *_folders(turn.workdir_dir)),
            user=user,
            timeout=min(120.0, max(remaining(), 1.0)),
            stdin=pack_folder(turn.workdir_dir),
        )
        if unpacked.exit_code != 0 or unpacked.timed_out:
            detail = redactor.text(clip_tail((unpacked.stderr or unpacked.stdout).strip(), 300))
            return RewardReading.failed(
                FailureKind.STEP_SETUP_FAILED,
                f"step {turn.name}: its workdir/ could not be copied into {workdir} "
                f"(exit {unpacked.exit_code}; {detail})",
            )
    if turn.setup_script is not None and bash is not None:
        bound = max(min(setup_s, remaining()), 1.0)
        ran = sandbox.exec(trusted(RUN_SETUP, workdir, bash), user=user, timeout=bound)
        if ran.timed_out or ran.exit_code != 0:
            why = f"timed out after {bound:g} s" if ran.timed_out else f"exited {ran.exit_code}"
            detail = redactor.text(clip_tail((ran.stderr or ran.stdout).strip(), 500))
            return RewardReading.failed(
                FailureKind.STEP_SETUP_FAILED,
                f"step {turn.name}: workdir/setup.sh {why}" + (f": {detail}" if detail else ""),
            )
    if turn.healthcheck is not None:
        try:
            wait_healthy(sandbox, turn.healthcheck, workdir=workdir, user=user, remaining=remaining)
        except EpisodeError as error:
            return RewardReading.failed(
                FailureKind.HEALTHCHECK_FAILED, f"step {turn.name}: {redactor.text(error.reason)}"
            )
    return None
