"""A pytest-harbor sandbox presented to Harbor's agents as a Harbor environment.

Harbor's agents are written against `harbor.environments.base.BaseEnvironment`; this one
hands each call to the episode's sandbox: commands to its exec (the turn's deadline, user,
working directory and environment), files to its archive calls. It never starts, stops or
removes anything: the episode owns the sandbox, so the engine's guarantees (the deadline,
the end of every process the agent started, trusted verification, key masking) hold as for
any harness. Imported only by the `harbor:` harness, and only where Harbor is installed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.models.environment_type import EnvironmentType
from harbor.models.task.config import EnvironmentConfig
from harbor.models.trial.paths import TrialPaths

from pytest_harbor.harnesses.base import Deadline
from pytest_harbor.harnesses.harbor_agents.private import (
    DefinitionChecked,
    merge_env,
    resolve_user,
)
from pytest_harbor.sandboxes.base import Sandbox, SandboxError

__all__ = ["SandboxEnvironment"]

#: What an exec asked past the turn's deadline gets: Harbor's own docker environment
#: raises the same on a timeout.
_TIMED_OUT = "Command timed out after {seconds} seconds"


class SandboxEnvironment(DefinitionChecked, BaseEnvironment):  # type: ignore[misc]
    """One episode's sandbox, for one Harbor agent. `attach()` gives it the sandbox and
    deadline of the call in progress (a sandbox works only during the call it came with)."""

    def __init__(
        self, *, task_dir: Path, name: str, session_id: str, trial_dir: Path, workdir: str | None
    ) -> None:
        self._sandbox: Sandbox | None = None
        self._deadline: Deadline | None = None
        self._workdir = workdir
        super().__init__(
            environment_dir=task_dir / "environment",
            environment_name=name,
            session_id=session_id,
            trial_paths=TrialPaths(trial_dir),
            task_env_config=EnvironmentConfig(workdir=workdir),
        )

    def attach(self, sandbox: Sandbox, deadline: Deadline) -> None:
        self._sandbox, self._deadline = sandbox, deadline

    def detach(self) -> None:
        self._sandbox = self._deadline = None

    @staticmethod
    def type() -> Any:
        return EnvironmentType.DOCKER

    async def start(self, force_build: bool) -> None:
        pass  # the episode started the sandbox

    async def stop(self, delete: bool) -> None:
        pass  # the episode removes the sandbox

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            raise RuntimeError("the sandbox is used outside the call it was given to")
        return self._sandbox

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        remaining = self._deadline.remaining() if self._deadline is not None else None
        timeout = timeout_sec if timeout_sec else remaining
        if remaining is not None and timeout is not None:
            timeout = min(float(timeout), remaining)
        if timeout is not None and timeout <= 0:
            raise RuntimeError(_TIMED_OUT.format(seconds=timeout_sec or 0))
        resolved = resolve_user(self, user)
        result = await asyncio.to_thread(
            self.sandbox.exec,
            ["bash", "-c", command],
            user=None if resolved is None else str(resolved),
            workdir=cwd or self._workdir,
            env=merge_env(self, env) or None,
            timeout=timeout,
        )
        if result.timed_out:
            raise RuntimeError(_TIMED_OUT.format(seconds=timeout_sec or int(timeout or 0)))
        return ExecResult(stdout=result.stdout, stderr=result.stderr, return_code=result.exit_code)

    async def _make_folder(self, folder: str) -> None:
        done = await asyncio.to_thread(
            self.sandbox.exec, ["mkdir", "-p", "--", folder], user="root"
        )
        if done.exit_code != 0:
            raise SandboxError(f"cannot make {folder}: {done.stderr.strip()}")

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        target = Path(target_path)
        await self._make_folder(str(target.parent))
        data = Path(source_path).read_bytes()
        await asyncio.to_thread(self.sandbox.upload, {target.name: data}, str(target.parent))

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        await self._make_folder(target_dir)
        await asyncio.to_thread(self.sandbox.upload, Path(source_dir), target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        files = await asyncio.to_thread(self.sandbox.download, source_path)
        name = Path(source_path).name
        if name not in files:
            raise FileNotFoundError(f"{source_path} is not a file of the sandbox")
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(files[name])

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        files = await asyncio.to_thread(self.sandbox.download, source_dir)
        for relative, data in files.items():
            target = Path(target_dir) / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
