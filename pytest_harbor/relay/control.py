"""The run's side of the relay: its process started and stopped, and the questions every
process of the run asks it (a token for an episode, what that token's calls took, the
run's spend) over its Unix socket."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from pytest_harbor.relay.reports import (
    RELAY_FOLDER_PREFIX,
    GrantReport,
    GrantRequest,
    RelayStart,
    RunSpend,
)
from pytest_harbor.relay.upstream import RELAY_BASE

__all__ = ["RelayAddress", "RelayClient", "RelayError", "RelayProcess"]

_START_S = 30.0
_ASK_S = 30.0


class RelayError(Exception):
    """The relay did not start, or does not answer."""


class RelayAddress(BaseModel):
    """Where the run's processes find the relay (handed to each xdist worker)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    control_socket: str
    port: int


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("relay", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


class RelayClient:
    """Asks the relay at `address` (a connection per question: any thread may ask)."""

    def __init__(self, address: RelayAddress) -> None:
        self.address = address

    @property
    def host_url(self) -> str:
        """The model URL a harness on this machine is given."""
        return f"http://127.0.0.1:{self.address.port}{RELAY_BASE}"

    def grant(self, request: GrantRequest) -> str:
        """A token for one attempt of an episode."""
        return str(self._ask("POST", "/grants", request.model_dump(mode="json"))["token"])

    def report(self, token: str) -> GrantReport:
        return GrantReport.model_validate(self._ask("GET", f"/grants/{token}"))

    def open(self, token: str) -> None:
        """The token serves from now on (its episode's agent is at work)."""
        self._ask("POST", f"/grants/{token}/open")

    def close(self, token: str) -> GrantReport:
        """The token serves no further call until opened again; its calls under way end
        (each counted as far as it went). Its report."""
        return GrantReport.model_validate(self._ask("POST", f"/grants/{token}/close"))

    def end(self, token: str) -> GrantReport:
        """The token dies (its calls under way end as at `close`); its last report."""
        return GrantReport.model_validate(self._ask("DELETE", f"/grants/{token}"))

    def spend(self) -> RunSpend:
        return RunSpend.model_validate(self._ask("GET", "/spend"))

    def listen(self, address: str) -> int:
        """Have the relay serve harnesses at `address` too; the port it serves on."""
        return int(self._ask("POST", "/listen", {"address": address})["port"])

    def _ask(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        connection = _UnixConnection(self.address.control_socket, _ASK_S)
        try:
            headers = {"content-type": "application/json"} if data is not None else {}
            connection.request(method, path, body=data, headers=headers)
            answer = connection.getresponse()
            payload = answer.read()
        except OSError as error:
            raise RelayError(f"the model relay does not answer: {error}") from None
        finally:
            connection.close()
        try:
            found = json.loads(payload)
        except ValueError:
            raise RelayError(f"the model relay answered {method} {path} with no JSON") from None
        if answer.status != 200:
            raise RelayError(f"the model relay refused {method} {path}: {found.get('error')}")
        return found


class RelayProcess:
    """The relay's process, started by the run (the controller, or the sole process) and
    ended with it: its input is a pipe this process holds, and it ends when that closes,
    so a run killed at any moment leaves no relay behind."""

    def __init__(self, process: subprocess.Popen[bytes], address: RelayAddress, folder: Path):
        self.process = process
        self.address = address
        self._folder = folder

    @classmethod
    def start(cls, start: RelayStart | dict[str, Any], *, log: Path) -> RelayProcess:
        """Start the relay with `start` (its control socket chosen here, in a folder only
        this user may enter, when `start` is a dict without one); raises RelayError."""
        _sweep_stale_folders(Path(tempfile.gettempdir()))
        folder = Path(tempfile.mkdtemp(prefix=RELAY_FOLDER_PREFIX))
        values = start.model_dump() if isinstance(start, RelayStart) else dict(start)
        values.setdefault("control_socket", str(folder / "control.sock"))
        config = RelayStart.model_validate(values)
        env = {key: value for key, value in os.environ.items() if not key.startswith("HARBOR_")}
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as errors:
            process = subprocess.Popen(
                [sys.executable, "-m", "pytest_harbor.relay.server"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                env=env,
                start_new_session=True,
            )
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(config.model_dump_json().encode() + b"\n")
        process.stdin.flush()
        line = _read_line(process, _START_S)
        try:
            port = int(json.loads(line)["port"])
        except (ValueError, KeyError, TypeError):
            process.kill()
            process.wait()
            said = ""
            with contextlib.suppress(OSError):
                said = log.read_text(errors="replace")[-2000:]
            raise RelayError(
                f"the model relay did not start: {line.decode(errors='replace')[:500]} {said}"
            ) from None
        return cls(process, RelayAddress(control_socket=config.control_socket, port=port), folder)

    def client(self) -> RelayClient:
        return RelayClient(self.address)

    def stop(self) -> None:
        """End the relay (closing its input) and wait for it."""
        process = self.process
        if process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
        with contextlib.suppress(OSError):
            os.unlink(self.address.control_socket)
        with contextlib.suppress(OSError):
            self._folder.rmdir()


#: A relay's folder younger than this may be a run's that is still starting its relay.
_STALE_S = 120.0


def _sweep_stale_folders(temp: Path) -> None:
    """The folders of relays that are gone (killed with their run, before they could
    remove their own): this user's, older than _STALE_S, whose socket no one answers."""
    for folder in temp.glob(f"{RELAY_FOLDER_PREFIX}*"):
        try:
            info = folder.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
                continue
            if time.time() - info.st_mtime < _STALE_S:
                continue
            control = folder / "control.sock"
            if control.exists() and _answers(control):
                continue
            control.unlink(missing_ok=True)
            folder.rmdir()
        except OSError:
            continue  # another run's sweep took it, or something else is in it


def _answers(control: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(control))
        except OSError:
            return False
    return True


def _read_line(process: subprocess.Popen[bytes], seconds: float) -> bytes:
    """The first line of the relay's output, or b"" when it says nothing in time."""
    found: list[bytes] = []

    def read() -> None:
        assert process.stdout is not None
        found.append(process.stdout.readline())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(seconds)
    return found[0] if found else b""
