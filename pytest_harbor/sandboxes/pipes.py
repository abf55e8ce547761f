"""Commands in a sandbox with their input and output joined to this process: the relay an
agent's tool connections (MCP) take, so that they reach what the agent reaches."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

__all__ = ["OpensPipes", "Pipe"]


class Pipe(Protocol):
    """A command running in a sandbox with its stdin and stdout joined to this process
    (OpensPipes): what an agent's tool connections run through."""

    def send(self, data: bytes) -> None:
        """Write to the command's stdin; SandboxError when the pipe is closed or broke."""
        ...

    def receive(self, timeout: float | None = None) -> bytes:
        """The command's next output; b"" once it ended or the pipe closed; TimeoutError
        when nothing came within `timeout` seconds."""
        ...

    def stderr_tail(self) -> str:
        """The last of what the command wrote to stderr."""
        ...

    def close(self) -> None:
        """End the command and the pipe; safe twice and from any thread."""
        ...


@runtime_checkable
class OpensPipes(Protocol):
    """A sandbox that can run a command with its input and output joined to this process
    (the docker provider's can)."""

    def open_pipe(
        self,
        command: Sequence[str],
        *,
        user: str | None = None,
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Pipe: ...
