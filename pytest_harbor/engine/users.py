"""Who runs what in an episode's sandbox: the task's agent and verifier users, by name and
by number, and the hand-over of the working directory to the agent's user."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from pytest_harbor.engine.scripts import HAND_WORKDIR, check, trusted
from pytest_harbor.sandboxes.base import ROOT_USER, Sandbox
from pytest_harbor.tasks import Task, Turn

__all__ = ["SandboxUsers", "named_users"]


def named_users(task: Task, image_user: str) -> set[str]:
    """The users the engine runs or ends processes as, but root (nothing to look up)."""
    named = {image_user, *(u for t in task.turns for u in (t.agent_user, t.verifier_user))}
    return {user for user in named if user and user.split(":")[0] not in ("root", "0")}


class SandboxUsers:
    """The users of one attempt's sandbox, as the seed read them: numeric agent users
    resolved to names, each named user's `uid:gid`, and who owns the working directory."""

    def __init__(self, task: Task) -> None:
        self._task = task
        #: Numeric agent users, resolved to names at the seed.
        self._names: dict[str, str] = {}
        #: The task's users (and the image's) as `uid:gid`, read at the end of the seed.
        self.ids: dict[str, str] = {}
        self._workdir_owner: str | None = None

    def resolve_uids(self, sandbox: Sandbox) -> None:
        """Numeric agent users, as names (once per attempt); an unknown uid stays a
        number."""
        turns = self._task.turns
        uids = sorted({t.agent_user for t in turns if t.agent_user and t.agent_user.isdigit()})
        for uid in uids:
            found = sandbox.exec(["getent", "passwd", uid], user=ROOT_USER)
            name = found.stdout.split(":", 1)[0].strip() if found.exit_code == 0 else ""
            self._names[uid] = name or uid

    def as_agent(
        self, sandbox: Sandbox, turn: Turn, workdir_now: Callable[[], str], first: bool
    ) -> Turn:
        """The turn's agent user (a uid resolved to its name) owns the working directory
        (handed over by number, as the seed read it); `first` turn of the attempt or not."""
        user = self._names.get(turn.agent_user or "", turn.agent_user)
        if user is not None and user != self._workdir_owner:
            workdir = workdir_now()
            owner = self.ids.get(turn.agent_user or "", user)
            handed = sandbox.exec(
                trusted(HAND_WORKDIR, owner, workdir, "1" if first else "0"), user=ROOT_USER
            )
            check(handed, f"handing {workdir} to {user}")
            self._workdir_owner = user
        return turn if user == turn.agent_user else dataclasses.replace(turn, agent_user=user)

    def verifier_id(self, turn: Turn) -> str | None:
        """The turn's verifier user as `uid:gid`, when the seed read one."""
        return self.ids.get(turn.verifier_user or "")

    def agent_id(self, turn: Turn, image_user: Callable[[], str]) -> str | None:
        """The user (`uid:gid`) whose every process ends before the turn's shared
        verification: the turn's agent user's (else the image's), unless that is root, whose
        processes cannot be told from the image's own services (see `verify_from_snapshot`).
        A user the image did not have at the seed is given by name, for the engine's script
        to look up then."""
        user = turn.agent_user or image_user()
        if (user or "").split(":")[0] in ("", "root", "0"):
            return None
        uid, _, gid = self.ids.get(user, user).partition(":")
        if uid == "0":
            return None
        return f"{uid}:{gid or uid}"
