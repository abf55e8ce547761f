"""A sandbox provider that runs nothing: its sandboxes answer the engine's commands from a
script the test writes, and record what they were asked. No Docker, no subprocess.

The engine's own scripts (the survey, the verifier's preparation and run, the clearing
between turns, the ending of processes) are told apart by the text of
pytest_harbor.engine.scripts and answered as the trusted shell would answer them when all
goes well; every other command is an agent's (or a hook's) and is answered by
`SandboxScript.commands`. What `/logs/verifier` holds after each verification comes from
`SandboxScript.verdicts`, one per verification in order.
"""

from __future__ import annotations

import io
import itertools
import tarfile
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_harbor.engine.scripts import (
    CLEAR,
    DONE,
    END_PROCESSES,
    HAND_WORKDIR,
    PREPARE,
    RUN_TEST,
    SURVEY,
    VERIFIER_LOGS,
)
from pytest_harbor.sandboxes.base import (
    TRUSTED_BUSYBOX,
    ArchiveStream,
    ExecResult,
    ImageConfig,
    ImageLayer,
    ImageSource,
    SandboxCapabilities,
    SandboxError,
    SandboxSpec,
    SandboxStartError,
    SandboxStatus,
)

__all__ = ["Call", "FakeProvider", "FakeSandbox", "SandboxScript", "Verdict"]

#: The image a prepared source is named by when it names none.
BUILT_IMAGE = "fake-built:latest"


@dataclass(frozen=True)
class Verdict:
    """What one verification leaves: the files of `/logs/verifier` (the reward file,
    `test-stdout.txt`, ...) and test.sh's exit code."""

    files: Mapping[str, bytes] = field(default_factory=dict)
    exit_code: int = 0

    @classmethod
    def reward(cls, value: str, *, stdout: bytes = b"ok\n") -> Verdict:
        """A verifier that wrote `value` to reward.txt."""
        return cls({"reward.txt": value.encode(), "test-stdout.txt": stdout})


@dataclass(frozen=True)
class Call:
    """One command a sandbox was asked to run, and which kind it was."""

    sandbox: str
    #: `survey`, `verify` (the preparation and test.sh in one exec, as root), `prepare`,
    #: `run_test`, `clear`, `end_processes`, `hand_workdir`, `engine` (another engine
    #: script), or `command` (anything else: an agent's, a hook's).
    kind: str
    command: tuple[str, ...]
    user: str | None = None
    workdir: str | None = None
    env: Mapping[str, str] | None = None
    stdin: bytes | None = None
    #: Asked through the view the engine hands a harness (CarriesAgentCommands).
    by_agent: bool = False

    @property
    def arguments(self) -> tuple[str, ...]:
        """An engine script's arguments (after `sh -c SCRIPT sh`)."""
        return self.command[5:] if self.kind != "command" else ()


@dataclass
class SandboxScript:
    """How the fake's sandboxes answer."""

    #: One per verification, in order; the last one answers every later verification.
    verdicts: Sequence[Verdict] = (Verdict.reward("1"),)
    #: The answer to a command, asked first, the engine's scripts included (None: the
    #: usual answer: an engine script's as when all goes well, exit 0 for the rest).
    commands: Callable[[Call], ExecResult | None] = lambda call: None
    #: The call at which the sandbox is lost (the engine says it is gone): that call and
    #: every later one raise SandboxError.
    lose_on: Callable[[Call], bool] = lambda call: False
    #: Every start fails with SandboxStartError, saying this.
    start_error: str | None = None
    #: The image's tools, as the survey finds them (None: the image lacks it).
    bash: str | None = "/bin/bash"
    timeout: str | None = "/usr/bin/timeout"
    #: The image's users, `name -> uid:gid`, as the survey reads them.
    users: Mapping[str, str] = field(default_factory=dict)
    image_config: ImageConfig = field(default_factory=ImageConfig)


class FakeSandbox:
    """One sandbox of the fake: a verifier folder, the files the engine uploaded, and the
    calls it was asked."""

    def __init__(self, sandbox_id: str, spec: SandboxSpec, provider: FakeProvider) -> None:
        self._id = sandbox_id
        self.spec = spec
        self._provider = provider
        self._script = provider.script
        self.lost = False
        self.stopped = False
        #: What `/logs/verifier` holds now.
        self.verifier_files: dict[str, bytes] = {}
        #: Every file the engine unpacked at a verification's preparation (tests, the
        #: transcript), by its path below /.
        self.uploaded: dict[str, bytes] = {}
        self.networks: list[bool] = []

    @property
    def id(self) -> str:
        return self._id

    @property
    def calls(self) -> list[Call]:
        return [call for call in self._provider.calls if call.sandbox == self._id]

    def _answer(self, call: Call) -> None:
        """Record `call`; raise SandboxError when the sandbox is, or is now, lost."""
        self._provider.calls.append(call)
        if not self.lost and self._script.lose_on(call):
            self.lost = True
        if self.lost or self.stopped:
            raise SandboxError(f"sandbox {self._id} is gone")

    def exec(
        self,
        command: Sequence[str],
        *,
        user: str | None = None,
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
        by_agent: bool = False,
    ) -> ExecResult:
        call = Call(self._id, _kind(command), tuple(command), user, workdir, env, stdin, by_agent)
        self._answer(call)
        scripted = self._script.commands(call)
        if scripted is not None:
            return scripted
        done = ExecResult(0, stderr_bytes=f"{DONE}\n".encode())
        if call.kind == "survey":
            return ExecResult(0, self._survey(call.arguments).encode())
        if call.kind in ("prepare", "verify"):
            self._unpack(stdin or b"")
            self.verifier_files = {}
        if call.kind in ("verify", "run_test"):
            verdict = self._provider.next_verdict()
            self.verifier_files = dict(verdict.files)
            return ExecResult(verdict.exit_code, stderr_bytes=done.stderr_bytes)
        if call.kind == "clear":
            self.verifier_files = {}
        return ExecResult(0) if call.kind == "command" else done

    def for_agent(self) -> AgentView:
        return AgentView(self)

    def _survey(self, users: Iterable[str]) -> str:
        lines = [
            "path:/usr/local/bin:/usr/bin:/bin",
            f"bash:{self._script.bash or ''}",
            f"timeout:{self._script.timeout or ''}",
            "proc:1:100",
        ]
        for spec in users:
            uid, _, gid = self._script.users.get(spec, ":").partition(":")
            lines.append(f"user:{spec}:{uid}:{gid}")
        return "\n".join(lines) + "\n"

    def _unpack(self, payload: bytes) -> None:
        with tarfile.open(fileobj=io.BytesIO(payload)) as archive:
            for member in archive.getmembers():
                source = archive.extractfile(member) if member.isreg() else None
                if source is not None:
                    self.uploaded[member.name] = source.read()

    def spawn(
        self, command: Sequence[str], *, user: str | None = None, workdir: str | None = None
    ) -> _Exited:
        self._answer(Call(self._id, "spawn", tuple(command), user, workdir))
        return _Exited()

    def upload(self, source: Path | Mapping[str, bytes], target: str) -> None:
        self._answer(Call(self._id, "upload", (str(target),)))

    def read_archive(self, source: str) -> bytes | None:
        chunks = self.iter_archive(source)
        return None if chunks is None else b"".join(chunks)

    def write_archive(self, data: bytes | Iterable[bytes], into: str) -> None:
        self._answer(Call(self._id, "write_archive", (into,)))

    def download(self, source: str) -> dict[str, bytes]:
        self._answer(Call(self._id, "download", (source,)))
        return {}

    def iter_archive(self, source: str) -> ArchiveStream | None:
        """`/logs/verifier` as the engine's archive API gives it; nothing else exists."""
        self._answer(Call(self._id, "read", (source,)))
        if source.rstrip("/") != VERIFIER_LOGS:
            return None
        return _chunks(_tar("verifier", self.verifier_files))

    def set_network(self, enabled: bool) -> None:
        self._answer(Call(self._id, "network", (str(enabled),)))
        self.networks.append(enabled)

    def snapshot(self, labels: Mapping[str, str]) -> str:
        self._answer(Call(self._id, "snapshot", ()))
        return f"{self._id}-snapshot"

    def status(self) -> SandboxStatus:
        gone = self.lost or self.stopped
        return SandboxStatus(present=not gone, running=not gone)

    def stop(self) -> None:
        self.stopped = True


class AgentView:
    """A FakeSandbox as a harness's commands reach it: the same sandbox, its calls marked
    `by_agent` (where the docker provider would carry them by command channel)."""

    def __init__(self, sandbox: FakeSandbox) -> None:
        self._sandbox = sandbox

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sandbox, name)

    def exec(self, command: Sequence[str], **options: Any) -> ExecResult:
        return self._sandbox.exec(command, by_agent=True, **options)


class FakeProvider:
    """A provider whose sandboxes answer from `script`; `calls` holds every command each
    of them was asked, in order, and `sandboxes` every sandbox it started."""

    name = "fake"
    capabilities = SandboxCapabilities()

    def __init__(self, script: SandboxScript | None = None) -> None:
        self.script = script or SandboxScript()
        self.calls: list[Call] = []
        self.sandboxes: list[FakeSandbox] = []
        self.specs: list[SandboxSpec] = []
        self.images: list[ImageSource] = []
        self._verdicts = 0
        self._ids = itertools.count(1)

    def next_verdict(self) -> Verdict:
        verdicts = self.script.verdicts
        verdict = verdicts[min(self._verdicts, len(verdicts) - 1)]
        self._verdicts += 1
        return verdict

    def calls_of(self, kind: str) -> list[Call]:
        return [call for call in self.calls if call.kind == kind]

    def prepare_image(self, source: ImageSource) -> str:
        self.images.append(source)
        return source.docker_image or BUILT_IMAGE

    def image_config(self, image: str) -> ImageConfig:
        return self.script.image_config

    def prepare_layer(self, layer: ImageLayer) -> str:
        return layer.base

    def start(self, spec: SandboxSpec) -> FakeSandbox:
        self.specs.append(spec)
        if self.script.start_error is not None:
            raise SandboxStartError(self.script.start_error)
        sandbox = FakeSandbox(f"fake-{next(self._ids)}", spec, self)
        self.sandboxes.append(sandbox)
        return sandbox

    def remove_labelled(self, labels: Mapping[str, str]) -> int:
        return 0

    def labelled(self, key: str) -> list[tuple[str, dict[str, str]]]:
        return []

    def remove(self, sandbox_id: str) -> None:
        for sandbox in self.sandboxes:
            if sandbox.id == sandbox_id:
                sandbox.stop()

    def remove_image(self, image: str) -> None:
        return None


class _Exited:
    """An ENTRYPOINT that ran and exited 0."""

    def exit_code(self) -> int | None:
        return 0

    def output_tail(self) -> str:
        return ""


def _kind(command: Sequence[str]) -> str:
    """Which of the engine's scripts `command` runs (`command` when none)."""
    if len(command) < 4 or list(command[:3]) != [TRUSTED_BUSYBOX, "sh", "-c"]:
        return "command"
    script = command[3]
    if SURVEY in script:
        return "survey"
    if PREPARE in script:
        return "verify" if RUN_TEST in script else "prepare"
    if RUN_TEST in script:
        return "run_test"
    if CLEAR in script:
        return "clear"
    if HAND_WORKDIR in script:
        return "hand_workdir"
    if END_PROCESSES in script:
        return "end_processes"
    return "engine"


def _chunks(data: bytes) -> Generator[bytes, None, None]:
    """`data` as a stream of chunks that can be closed (a generator is an ArchiveStream)."""
    yield data


def _tar(top: str, files: Mapping[str, bytes]) -> bytes:
    """A tar stream of `files` below the folder `top`, as an engine's archive API sends
    a folder."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        folder = tarfile.TarInfo(top)
        folder.type, folder.mode = tarfile.DIRTYPE, 0o755
        archive.addfile(folder)
        for name, data in sorted(files.items()):
            member = tarfile.TarInfo(f"{top}/{name}")
            member.size = len(data)
            archive.addfile(member, io.BytesIO(data))
    return buffer.getvalue()
