"""The harness side of an episode: its session, opened and closed under the engine's clock,
and each turn's work judged as the contract says (overruns are timeouts, exceptions are
crashes, a sandbox gone is the engine's failure)."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar, cast
from urllib.parse import urlsplit

from pytest_harbor.display import harbor_logger
from pytest_harbor.engine.context import EpisodeContext
from pytest_harbor.engine.failures import EpisodeError, FailureKind
from pytest_harbor.engine.harness_calls import (
    HARNESS_GRACE_S,
    CallOutcome,
    SandboxWindow,
    call_harness,
)
from pytest_harbor.engine.model_access import ModelAccess
from pytest_harbor.harnesses.base import (
    AGENT_LOGS,
    AgentFailure,
    AgentLogs,
    AgentRun,
    AgentSetupError,
    Deadline,
    HarnessSession,
    ModelGate,
    SessionContext,
    TurnContext,
)
from pytest_harbor.harnesses.mcp.turns import describe_task, unreachable_servers
from pytest_harbor.sandboxes.base import ImageConfig, Sandbox, SandboxError, for_agent
from pytest_harbor.tasks import Turn

__all__ = ["AgentPhase"]

log = harbor_logger()

#: The least time a session gets to open, whatever `harness_setup_allowance_s` leaves.
MIN_SETUP_S = 1.0

T = TypeVar("T")


class AgentPhase:
    """Opens the harness session when a turn needs one, runs turns, closes it."""

    def __init__(
        self,
        context: EpisodeContext,
        model: ModelAccess,
        *,
        model_gate: ModelGate,
        logs_dir: Path | None,
        image: Callable[[], ImageConfig] = ImageConfig,
    ) -> None:
        """The harness is handed the context's task: the settings' overlay merged in (its
        MCP servers among the task's own), and what the agent's image declares (`image`,
        asked when a call is made: the image is made after the phase)."""
        self.harness = harness = context.harness
        self.mcp = context.mcp
        self.episode_id = context.id
        self.task = context.task
        self.model = model
        self.model_gate = model_gate
        self._image = image
        self.redactor = context.redactor
        self._logs_dir = logs_dir
        self._own_logs_dir: Path | None = None
        self._session: HarnessSession | None = None
        self._who = "solve.sh" if harness.validates else "the agent"
        #: A root agent has had the sandbox in this attempt: it can stop it (end its first
        #: process, whose limits root may lower), so a stopped sandbox is not the engine's.
        self.root_had_sandbox = False

    def allowed_hosts(self, hosts: tuple[str, ...] | None) -> tuple[str, ...] | None:
        """An agent phase's allow-list, with the model endpoint's host added (as Harbor
        adds it) when no relay carries the agent's calls: an agent that works in the
        sandbox must reach its model. Behind the relay, the relay's route is all it gets."""
        model = self.model.model
        if hosts is None or model is None or self.model.relayed:
            return hosts
        host = urlsplit(model.base_url).hostname
        return hosts if not host or host in hosts else (*hosts, host.lower())

    @property
    def has_session(self) -> bool:
        return self._session is not None

    # ------------------------------------------------------------------------ calls

    def open_session(
        self, sandbox: Sandbox, turn: Turn, *, workdir: str | None, seconds: float
    ) -> AgentRun | None:
        """Open a session unless one is open; None when it is ready, else the failed turn
        (the set-up crashed or ran past `seconds`)."""
        if self._session is not None:
            return None
        seconds = max(seconds, MIN_SETUP_S)
        opened = self._call(
            "the harness set-up",
            sandbox,
            seconds,
            lambda window, deadline, cancel: self.harness.open_session(
                self._context(window, deadline, cancel, workdir, turn.agent_user, turn=None)
            ),
            host_dir=self.host_dir(None),
        )
        # A session that came up, even late, is closed with the episode.
        self._session = opened.value if opened.error is None else None
        if opened.overran:
            return self._timed_out(
                f"the {self.harness.name} harness did not set up within {seconds:g} s", None
            )
        if opened.error is not None:
            return self._crashed(sandbox, opened, "setting up")
        return None

    def run_turn(
        self,
        sandbox: Sandbox,
        turn: Turn,
        *,
        index: int,
        workdir: str | None,
        seconds: float,
        grace_s: float = HARNESS_GRACE_S,
    ) -> AgentRun:
        """The harness's turn, cut off `seconds` from now (and left behind `grace_s`
        later if it has not returned by then)."""
        session = self._session
        assert session is not None, "open_session() first"
        describe_task(sandbox, self.mcp, self.task, turn, turn.agent_user)
        # The oracle runs solve.sh, which takes no tools (as Harbor's oracle ignores them).
        unreachable = None
        if not self.harness.validates:
            unreachable = unreachable_servers(
                sandbox, self.mcp, user=turn.agent_user, workdir=workdir, redactor=self.redactor
            )
        if unreachable is not None:
            # After a first turn the agent has had the sandbox (and the servers): a claim.
            failure = AgentFailure("tools_unavailable", unreachable, claimed=index > 0)
            return AgentRun(failure=failure)
        ran = self._call(
            f"turn {turn.name}",
            sandbox,
            seconds,
            lambda window, deadline, cancel: session.run_turn(
                self._turn_context(window, deadline, cancel, workdir, turn, index)
            ),
            host_dir=self.host_dir(turn),
            grace_s=grace_s,
        )
        returned = ran.value if isinstance(ran.value, AgentRun) else None
        if ran.overran or (returned is not None and returned.timed_out):
            return self._timed_out(
                f"{self._who} did not finish within its budget of {seconds:g} s and was "
                + ("killed" if self.harness.validates else "stopped"),
                returned,
            )
        if ran.error is not None:
            return self._crashed(sandbox, ran, f"turn {turn.name}")
        if returned is None:
            return self._failed(
                "agent_crashed",
                f"the {self.harness.name} harness returned {type(ran.value).__name__}, "
                "not an AgentRun",
            )
        if returned.failure is not None:
            failure = dataclasses.replace(
                returned.failure, message=self.redactor.text(returned.failure.message)
            )
            returned = dataclasses.replace(returned, failure=failure)
        return returned

    def close(self, sandbox: Sandbox | None, *, workdir: str | None, seconds: float) -> None:
        """Close the open session, if any; a close that fails or hangs is logged, never
        fatal. Without a sandbox (it is gone) the session gets one that refuses every call."""
        session, self._session = self._session, None
        if session is None:
            return
        target = sandbox if sandbox is not None else cast(Sandbox, _GoneSandbox())
        closed = self._call(
            "closing the harness session",
            target,
            seconds,
            lambda window, deadline, cancel: session.close(
                self._context(window, deadline, cancel, workdir, None, turn=None)
            ),
            host_dir=self.host_dir(None),
        )
        if closed.error is not None or closed.overran:
            why = "ran past its deadline" if closed.overran else repr(closed.error)
            log.warning(
                "%s: closing the %s session failed: %s",
                self.episode_id,
                self.harness.name,
                self.redactor.text(why),
            )

    def discard_logs(self) -> None:
        """Remove the host log folder when the episode made a temporary one."""
        if self._own_logs_dir is not None:
            shutil.rmtree(self._own_logs_dir, ignore_errors=True)
            self._own_logs_dir = None

    # ------------------------------------------------------------------------ helpers

    def _call(
        self,
        what: str,
        sandbox: Sandbox,
        seconds: float,
        work: Callable[[SandboxWindow, Deadline, threading.Event], T],
        *,
        host_dir: Path,
        grace_s: float = HARNESS_GRACE_S,
    ) -> CallOutcome[T]:
        """call_harness(), then the host folder pruned when the call left nothing there."""
        # A harness's commands may go by its provider's own route (for_agent), but not a
        # validating harness's: solve.sh's exit status is part of the result, and a root
        # solve.sh could end such a route's processes under its own command.
        carried = sandbox if self.harness.validates else for_agent(sandbox)
        try:
            return call_harness(
                what,
                carried,
                seconds,
                work,
                grace_s=grace_s,
                host_dir=host_dir,
                redactor=self.redactor,
            )
        finally:
            for folder in (host_dir, host_dir.parent):
                if folder == self._root.parent:
                    break
                with contextlib.suppress(OSError):
                    folder.rmdir()  # only when empty

    @property
    def _root(self) -> Path:
        if self._logs_dir is not None:
            return self._logs_dir
        if self._own_logs_dir is None:
            self._own_logs_dir = Path(tempfile.mkdtemp(prefix="harbor-agent-"))
        return self._own_logs_dir

    def host_dir(self, turn: Turn | None) -> Path:
        """The harness's folder on this machine: the episode's, or a step's below it. It
        is made for each call and removed after it when the call left it empty."""
        root = self._root
        folder = root if turn is None or not self.task.config.is_multi_step else root / turn.name
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def _context(
        self,
        window: SandboxWindow,
        deadline: Deadline,
        cancel: threading.Event,
        workdir: str | None,
        agent_user: str | None,
        *,
        turn: Turn | None,
    ) -> SessionContext:
        return SessionContext(
            episode_id=self.episode_id,
            sandbox=window,
            task=self.task,
            workdir=workdir,
            agent_user=agent_user,
            model=self.model.for_harness(),
            logs=AgentLogs(sandbox_dir=AGENT_LOGS, host_dir=self.host_dir(turn)),
            deadline=deadline,
            cancel=cancel,
            model_gate=self.model_gate,
            mcp=self.mcp,
            image=self._image(),
        )

    def _turn_context(
        self,
        window: SandboxWindow,
        deadline: Deadline,
        cancel: threading.Event,
        workdir: str | None,
        turn: Turn,
        index: int,
    ) -> TurnContext:
        base = self._context(window, deadline, cancel, workdir, turn.agent_user, turn=turn)
        return TurnContext(
            episode_id=base.episode_id,
            sandbox=base.sandbox,
            task=base.task,
            workdir=base.workdir,
            agent_user=base.agent_user,
            model=base.model,
            logs=base.logs,
            deadline=base.deadline,
            cancel=base.cancel,
            model_gate=base.model_gate,
            mcp=base.mcp,
            image=base.image,
            turn=turn,
            index=index,
        )

    def _timed_out(self, message: str, returned: AgentRun | None) -> AgentRun:
        run = returned or AgentRun()
        return dataclasses.replace(
            run, timed_out=True, failure=AgentFailure(cause="timeout", message=message)
        )

    def _failed(self, cause: str, message: str) -> AgentRun:
        return AgentRun(
            failure=AgentFailure(cause=cause, message=self.redactor.text(message))  # type: ignore[arg-type]
        )

    def _crashed(self, sandbox: Sandbox, call: CallOutcome[T], doing: str) -> AgentRun:
        """An exception from the harness: a crash, unless the sandbox itself is gone. Gone
        is what its engine says (status()), never the answer of a command in it: an agent
        can keep a command from starting (its pids cap) but not its sandbox from being."""
        error = call.error
        assert error is not None
        if isinstance(error, AgentSetupError):
            return self._failed(error.cause, str(error))
        if isinstance(error, SandboxError) and not call.error_after_close:
            try:
                status = sandbox.status()
                stopped = status.present and not status.running and not status.out_of_memory
                gone = not status.present or stopped
            except SandboxError:
                stopped, gone = False, True
            if stopped and self.root_had_sandbox:
                return AgentRun(
                    failure=AgentFailure(
                        cause="agent_crashed",
                        message=(
                            f"the sandbox stopped during {doing}, which a root agent can "
                            f"bring about: {self.redactor.text(str(error))}"
                        ),
                        claimed=True,
                    )
                )
            if gone:
                raise EpisodeError(
                    FailureKind.SANDBOX_LOST,
                    f"the sandbox was lost during {doing}: {self.redactor.text(str(error))}",
                ) from None
        return self._failed(
            "agent_crashed",
            f"the {self.harness.name} harness raised {type(error).__name__} during {doing}: "
            f"{error}",
        )


class _GoneSandbox:
    """Stands in for a sandbox that no longer exists."""

    id = "gone"

    def __getattr__(self, name: str) -> object:
        raise SandboxError("the sandbox is gone")
