"""An ssh server on 127.0.0.1 that leads to a Docker engine, as `ssh://` engine URLs
expect: its key only lets a client run `docker system dial-stdio` against that engine.
The client side is the machine's own ssh, given this server's key and settings through a
small wrapper first on PATH (what a user's ~/.ssh/config would say)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

_START_TIMEOUT_S = 20.0


class SshServer:
    def __init__(self, engine_url: str) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="hbssh-", dir="/tmp"))
        self.engine_url = engine_url
        self.port = _free_port()
        self.url = f"ssh://root@127.0.0.1:{self.port}"
        #: Put first on PATH: `ssh` with this server's client key and settings.
        self.client_bin = self.root / "bin"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> SshServer:
        _sweep_abandoned()
        root = self.root
        (root / "owner").write_text(f"{os.getpid()}\n")
        for name in ("host_key", "client_key"):
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / name))
        forced = f'command="DOCKER_HOST={self.engine_url} docker system dial-stdio"'
        limits = "no-pty,no-port-forwarding,no-agent-forwarding,no-X11-forwarding"
        public = (root / "client_key.pub").read_text().strip()
        (root / "authorized_keys").write_text(f"{forced},{limits} {public}\n")
        (root / "sshd_config").write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {root / 'host_key'}\n"
            f"AuthorizedKeysFile {root / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
            f"PidFile {root / 'sshd.pid'}\nStrictModes no\n"
        )
        (root / "ssh_config").write_text(
            "Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
            f"  IdentityFile {root / 'client_key'}\n  LogLevel ERROR\n"
        )
        self.client_bin.mkdir()
        ssh = self.client_bin / "ssh"
        ssh.write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {root / "ssh_config"} "$@"\n')
        ssh.chmod(0o755)
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation folder
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        self.process = subprocess.Popen(
            [sshd, "-D", "-f", str(root / "sshd_config"), "-E", str(root / "sshd.log")],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("sshd did not start")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)


def _sweep_abandoned() -> None:
    """Servers a test process started and could not stop (it was killed)."""
    for root in Path("/tmp").glob("hbssh-*"):
        try:
            os.kill(int((root / "owner").read_text()), 0)
            continue
        except ProcessLookupError:
            pass
        except (OSError, ValueError):
            continue
        subprocess.run(["pkill", "-f", str(root)], check=False, capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True)
