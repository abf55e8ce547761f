"""Who runs what in an episode's sandbox: the task's agent and verifier users as the
survey read them (numbers), and the hand-over of the working directory to the agent's
user."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from pytest_harbor.engine.failures import EpisodeError, FailureKind
from pytest_harbor.engine.scripts import HAND_WORKDIR, check, trusted
from pytest_harbor.sandboxes.base import ROOT_USER, Sandbox, is_root_user
from pytest_harbor.tasks import Task, Turn
from pytest_harbor.tasks.config import RESERVED_ID

__all__ = ["SandboxUsers", "named_users"]


def named_users(task: Task, image_user: str) -> set[str]:
    """The users the engine runs or ends processes as, but root (nothing to look up)."""
    named = {image_user, *(u for t in task.turns for u in (t.agent_user, t.verifier_user))}
    return {user for user in named if user and not is_root_user(user)}


class SandboxUsers:
    """The users of one attempt's sandbox, as the survey read them at the seed: each
    named user's `uid:gid`, and who owns the working directory.

    Agents run as these numbers, never by name: the survey's reading of /etc/passwd is
    the only one that decides who a user is, so the uid whose processes the engine ends
    before verification is the uid the agent ran as, whatever the image's files say to
    the engine's exec or to the image's own tools."""

    def __init__(self, task: Task) -> None:
        self._task = task
        #: The task's users (and the image's) as `uid:gid`, read at the end of the seed.
        self.ids: dict[str, str] = {}
        self._image_user = ""
        self._workdir_owner: str | None = None

    def learn(self, ids: Mapping[str, str], image_user: str) -> None:
        """Take the survey's numbers; EpisodeError (`harbor:task_refused`) for a user the
        image does not have (a name not in its /etc/passwd, a group not in its
        /etc/group) or one that is the sandbox keep-alive's own id."""
        self.ids = dict(ids)
        self._image_user = image_user
        multi = self._task.config.is_multi_step
        for turn in self._task.turns:
            where = f"step {turn.name!r}: " if multi else ""
            for role, user in (
                ("agent", turn.agent_user or image_user),
                ("verifier", turn.verifier_user or image_user),
            ):
                if not user or is_root_user(user):
                    continue
                whose = f"the {role} user {user!r}"
                if user == image_user and user not in (turn.agent_user, turn.verifier_user):
                    whose = f"the image's USER {user!r} (the {role}'s)"
                found = self.ids.get(user)
                if found is None or (":" in user and ":" not in found):
                    lacking = "/etc/group" if found else "/etc/passwd"
                    raise EpisodeError(
                        FailureKind.TASK_REFUSED,
                        f"{where}{whose} is not in the image's {lacking}",
                    )
                if str(RESERVED_ID) in found.split(":"):
                    raise EpisodeError(
                        FailureKind.TASK_REFUSED,
                        f"{where}{whose} is {found} in the image, and {RESERVED_ID} is the "
                        "sandbox's own keep-alive's id, which no task's user may share",
                    )

    def as_agent(
        self, sandbox: Sandbox, turn: Turn, workdir_now: Callable[[], str], first: bool
    ) -> Turn:
        """The turn, its agent user given as the numbers the survey read (a user that is
        root stays as named); the working directory handed to the turn's agent user (by
        number) when it names one; `first` turn of the attempt or not."""
        named = turn.agent_user
        if named is not None and named != self._workdir_owner:
            workdir = workdir_now()
            owner = self.ids.get(named, named)
            handed = sandbox.exec(
                trusted(HAND_WORKDIR, owner, workdir, "1" if first else "0"), user=ROOT_USER
            )
            check(handed, f"handing {workdir} to {named}")
            self._workdir_owner = named
        user = named or self._image_user
        if not user or is_root_user(user) or user not in self.ids:
            return turn
        uid, _, gid = self.ids[user].partition(":")
        # With a group named, the exec gets that group alone; without one, the exec finds
        # the user's group and supplementary groups by the uid.
        exec_as = f"{uid}:{gid}" if ":" in user else uid
        return dataclasses.replace(turn, agent_user=exec_as)

    def verifier_id(self, turn: Turn) -> str | None:
        """The turn's verifier user as `uid:gid`, when the seed read one."""
        return self.ids.get(turn.verifier_user or "")

    def agent_id(self, turn: Turn, image_user: Callable[[], str]) -> str | None:
        """The user (`uid:gid`) whose every process ends before the turn's shared
        verification: the turn's agent user's (else the image's), unless that is root, whose
        processes cannot be told from the image's own services (see `verify_from_snapshot`).
        A user the image did not have at the seed is given by name, for the engine's script
        to refuse then."""
        user = turn.agent_user or image_user()
        if not user or is_root_user(user):
            return None
        uid, _, gid = self.ids.get(user, user).partition(":")
        if uid == "0":
            return None
        return f"{uid}:{gid or uid}"
