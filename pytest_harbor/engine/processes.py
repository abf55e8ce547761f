"""What runs in a sandbox, as the engine sees it and ends it: the survey at the end of the
seed, the users of the task as numbers, and the end of what an agent started."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pytest_harbor.display import harbor_logger
from pytest_harbor.engine.scripts import (
    END_PROCESSES,
    RESOLVE_USERS,
    SURVEY,
    Tampered,
    check,
    trusted,
    with_helpers,
)
from pytest_harbor.sandboxes.base import (
    ROOT_USER,
    ExecResult,
    ReportsStart,
    Sandbox,
    SandboxError,
)

__all__ = [
    "SURVEY_SCRIPT",
    "ProcessesSurvived",
    "SandboxSurvey",
    "end_processes_since",
    "end_user_processes",
    "survey",
]

log = harbor_logger()

#: How long an engine script that walks /proc may take.
_SCRIPT_TIMEOUT_S = 60.0
#: The survey for the trusted shell; its arguments are the users to read as numbers.
SURVEY_SCRIPT = with_helpers(SURVEY + RESOLVE_USERS)


class ProcessesSurvived(Tampered):
    """Processes the engine set out to end were still there after every round of kills."""


@dataclass(frozen=True)
class SandboxSurvey:
    """What a sandbox was before any agent had it."""

    #: The image's bash and timeout, as found on its PATH (None: it has none).
    bash: str | None
    timeout: str | None
    #: `pid:start` of every process then.
    processes: frozenset[str] = frozenset()
    #: The users asked about (as a task names one), as `uid:gid` (`uid` when its group is
    #: unknown); a user the image does not have is left out.
    ids: Mapping[str, str] = field(default_factory=dict)

    @property
    def lacking(self) -> list[str]:
        return [tool for tool, path in (("bash", self.bash), ("timeout", self.timeout)) if not path]


def survey(sandbox: Sandbox, users: Iterable[str] = (), *, at_start: bool = False) -> SandboxSurvey:
    """Look at a sandbox before the agent has it (the end of the seed), and read `users`
    (as a task names one: `name`, `uid`, `name:group`, `uid:gid`) as numbers from the
    image's /etc/passwd and /etc/group. With `at_start` (nothing has started in the
    sandbox since it started), the survey the sandbox ran as it started (SURVEY_SCRIPT as
    its spec's start script, ReportsStart) is taken when it is complete and names every
    user asked for. An answer that lists no process (there is always one: the keep-alive)
    was lost on its way: it is asked again, once, rather than taken to say that the image
    lacks its tools."""
    wanted = sorted({user for user in users if user})
    if at_start and isinstance(sandbox, ReportsStart):
        output = sandbox.start_output()
        found = None if output is None else _parsed(output)
        if found is not None and set(wanted) <= _named(output or ""):
            return _warned(sandbox, found, output or "")
    for _ in range(2):
        done = sandbox.exec(
            trusted(SURVEY + RESOLVE_USERS, *wanted), user=ROOT_USER, timeout=_SCRIPT_TIMEOUT_S
        )
        if done.exit_code != 0:
            raise SandboxError(f"cannot survey the sandbox: {done.stderr.strip()[-300:]}")
        found = _parsed(done.stdout)
        if found is not None:
            return _warned(sandbox, found, done.stdout)
        log.warning(
            "the survey of sandbox %s gave an incomplete answer (stdout %r, stderr %r)",
            sandbox.id[:12],
            done.stdout[-300:],
            done.stderr[-300:],
        )
    raise SandboxError(f"the survey of sandbox {sandbox.id[:12]} gave no complete answer")


def _parsed(stdout: str) -> SandboxSurvey | None:
    """The survey SURVEY + RESOLVE_USERS printed; None when it is incomplete."""
    tools: dict[str, str | None] = {}
    processes = set()
    for line in stdout.splitlines():
        kind, _, value = line.partition(":")
        if kind == "proc":
            processes.add(value)
        elif kind in ("bash", "timeout"):
            tools[kind] = value or None
    if not processes or len(tools) != 2:
        return None
    return SandboxSurvey(tools["bash"], tools["timeout"], frozenset(processes), _ids(stdout))


def _named(stdout: str) -> set[str]:
    """The users the survey printed a line for (known or not)."""
    return {
        line[5:].rsplit(":", 2)[0]
        for line in stdout.splitlines()
        if line.count(":") >= 3 and line.startswith("user:")
    }


def _warned(sandbox: Sandbox, found: SandboxSurvey, stdout: str) -> SandboxSurvey:
    if found.lacking:
        log.warning(
            "sandbox %s: no %s on its PATH (%s) or in the usual folders",
            sandbox.id[:12],
            " or ".join(found.lacking),
            next((line[5:] for line in stdout.splitlines() if line.startswith("path:")), ""),
        )
    return found


def _ids(stdout: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in stdout.splitlines():
        if not line.startswith("user:"):
            continue
        spec, uid, gid = line[5:].rsplit(":", 2)
        if uid.isdigit():
            found[spec] = f"{uid}:{gid}" if gid.isdigit() else uid
    return found


def end_user_processes(sandbox: Sandbox, agent: str) -> None:
    """End every process of the agent's user `agent` (`uid:gid`, or `uid`): those the
    kernel lets that uid signal, ended by a process of that uid (see END_PROCESSES);
    raises ProcessesSurvived when some could not be ended."""
    uid, _, gid = agent.partition(":")
    script = (
        END_PROCESSES
        + f'end_user "$1" "$2" || tampered "processes of the agent\'s user (uid {uid}) survived"\n'
        + "done_\n"
    )
    done = sandbox.exec(trusted(script, uid, gid or uid), user=ROOT_USER, timeout=_SCRIPT_TIMEOUT_S)
    _checked(done, f"ending the processes of the agent's user (uid {uid})")


def end_processes_since(sandbox: Sandbox, before: frozenset[str]) -> None:
    """End, as root, every process of any user that is not in `before` (`pid:start` of
    the processes there when the agent's turn began): all the agent started, however it
    detached. An agent's turn that ran out of time ends this way."""
    what = "processes the agent's turn started"
    script = END_PROCESSES + f'end_processes_since "$1" || tampered "{what} survived"\ndone_\n'
    done = sandbox.exec(
        trusted(script, " ".join(sorted(before))), user=ROOT_USER, timeout=_SCRIPT_TIMEOUT_S
    )
    _checked(done, f"ending the {what}")


def _checked(done: ExecResult, what: str) -> None:
    try:
        check(done, what)
    except Tampered as survived:
        raise ProcessesSurvived(f"{survived} every round of kills") from None
