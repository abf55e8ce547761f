"""A real image registry on 127.0.0.1 for tests: Debian's `docker-registry` (Distribution
v2) serving from a folder. Docker treats 127.0.0.0/8 registries as insecure by itself, so
pushes and pulls over plain HTTP need no engine configuration."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

__all__ = ["LocalRegistry"]

_BINARY = "/usr/bin/docker-registry"
_START_TIMEOUT_S = 20.0
_STOP_TIMEOUT_S = 10.0


class LocalRegistry:
    """One `docker-registry serve` process; `address` is "127.0.0.1:PORT" once started."""

    def __init__(self) -> None:
        self.address = ""
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, folder: Path) -> None:
        """Writes a config under `folder`, starts the registry and waits until /v2/ answers."""
        port = _free_port()
        self.address = f"127.0.0.1:{port}"
        storage = folder / "storage"
        storage.mkdir(parents=True, exist_ok=True)
        config = folder / "config.yml"
        config.write_text(
            "version: 0.1\n"
            "log:\n  level: warn\n"
            f"storage:\n  filesystem:\n    rootdirectory: {storage}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.address}\n"
        )
        log = (folder / "registry.log").open("wb")
        self._process = subprocess.Popen(
            [_BINARY, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                text = (folder / "registry.log").read_text(errors="replace")
                raise RuntimeError(f"docker-registry exited at start: {text}")
            if _answers(f"http://{self.address}/v2/"):
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"docker-registry did not answer on {self.address} within 20 s")

    def stop(self) -> None:
        """Terminates the process (killed if it does not end in 10 s)."""
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False
