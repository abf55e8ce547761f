"""A second Docker engine on this machine, for tests that spread a run over two engines:
its own socket, data root, exec root, pid file and bridge (no iptables rules of its own),
started for the test and stopped after it.

The host's FORWARD chain is the first engine's: its policy is DROP, and bridged frames pass
through it (bridge-nf-call-iptables), so without a rule of ours two containers on one
network of the second engine could not reach each other (a sandbox its egress, say). The
second engine's networks take their addresses from a pool of its own, and one rule,
added as it starts and removed as it stops, lets the pool's addresses reach each other."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors

#: The engine .ci/setup starts.
FIRST_ENGINE = "unix:///var/run/docker.sock"
_START_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 60.0


class SecondEngine:
    """A dockerd of the test's own; `url` is its socket. Images it needs come from the
    first engine through pytest-harbor itself (the fleet loads what an engine lacks)."""

    def __init__(self, tls: bool = False, data_size: str | None = None) -> None:
        token = uuid.uuid4().hex[:8]
        # Short: a unix socket path has a length limit, a bridge name one of 15.
        self.root = Path(tempfile.mkdtemp(prefix=f"hb2-{token}-", dir="/tmp"))
        self.socket = self.root / "docker.sock"
        self.url = f"unix://{self.socket}"
        self.bridge = f"hb2{token}"
        self.subnet = f"10.213.{random.randint(1, 254)}.1/24"
        #: The pool its own networks take their addresses from, apart from the first
        #: engine's: the FORWARD chain accepts traffic within it (the module's docstring),
        #: and an engine whose disk is full leaves the bridges of networks it could not
        #: record, which are found by address. Given to its first start only: dockerd
        #: started again with address pools deletes the host's docker0 (as it clears its
        #: stale default network), so networks made after a restart() come from Docker's
        #: default pools, and their containers do not reach each other.
        self.pool = _free_pool()
        self.process: subprocess.Popen[bytes] | None = None
        self.log = self.root / "dockerd.log"
        #: With `tls`, the engine also listens on tcp://127.0.0.1:<port> and verifies its
        #: clients: `tcp_url`, and `client_tls` (ca.pem, cert.pem, key.pem, as Docker names
        #: them) for the client.
        self.tls = tls
        #: With `data_size` ("600m", say), its data root is a tmpfs of that size: a disk
        #: a test can fill.
        self.data_size = data_size
        self.tcp_url: str | None = None
        self.client_tls = self.root / "client-tls"
        #: stop() has begun (a failed start in it does not start it again).
        self._stopping = False
        #: dockerd has been started once (on its data root as it is now).
        self._launched = False

    def start(self) -> SecondEngine:
        sweep_abandoned()
        (self.root / "owner").write_text(f"{os.getpid()}\n{self.bridge}\n{self.pool}\n")
        _forward_within(self.pool)
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", self.subnet, "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        if self.data_size is not None:
            (self.root / "data").mkdir()
            _run(
                "mount",
                "-t",
                "tmpfs",
                "-o",
                f"size={self.data_size}",
                "tmpfs",
                str(self.root / "data"),
            )
        return self._launch()

    def kill(self) -> None:
        """SIGKILL to dockerd alone, as a crash: its containers' processes go on under
        their shims until it starts again."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(10)

    def restart(self) -> SecondEngine:
        """dockerd again, on the same data root, after kill()."""
        return self._launch()

    def _launch(self) -> SecondEngine:
        listen = []
        if self.tls:
            self.tcp_url = f"tcp://127.0.0.1:{_free_port()}"
            server = _certificates(self.root / "tls", self.client_tls)
            listen = [
                "--host",
                self.tcp_url,
                "--tlsverify",
                "--tlscacert",
                str(server / "ca.pem"),
                "--tlscert",
                str(server / "server-cert.pem"),
                "--tlskey",
                str(server / "server-key.pem"),
            ]
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    "dockerd",
                    *listen,
                    "--host",
                    self.url,
                    "--data-root",
                    str(self.root / "data"),
                    "--exec-root",
                    str(self.root / "exec"),
                    "--pidfile",
                    str(self.root / "docker.pid"),
                    "--bridge",
                    self.bridge,
                    *(
                        []
                        if self._launched
                        else ["--default-address-pool", f"base={self.pool},size=24"]
                    ),
                    "--iptables=false",
                    "--ip-masq=false",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._launched = True
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            with contextlib.suppress(docker.errors.DockerException, OSError):
                docker.APIClient(base_url=self.url, timeout=5).ping()
                return self
            time.sleep(0.2)
        log_tail = self.log.read_text(errors="replace")[-3000:]
        self.stop()
        raise RuntimeError(f"the second dockerd did not start:\n{log_tail}")

    def client(self) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.url, timeout=60)

    def stop(self) -> None:
        """Stop the engine (its containers with it) and remove everything it had."""
        if self.process is not None and self.process.poll() is not None and not self._stopping:
            # Killed (kill()) and not started again: its containers still run under their
            # shims and its networks' bridges hold address pools. Started again on its data
            # root, it stops them and names the bridges.
            self._stopping = True
            with contextlib.suppress(RuntimeError):
                self._launch()
        self._stopping = True
        process, self.process = self.process, None
        # The bridges of its own networks (pytest-harbor's isolated one) outlive it on the
        # host, and each holds an address pool every engine here avoids: named while it
        # answers, deleted once it is gone.
        bridges = self._network_bridges() if process is not None else []
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        # The engine's containerd and shims, when it did not come back to stop them (a run
        # that reaches the engine names its folder too, so the pattern names containerd).
        subprocess.run(
            ["pkill", "-9", "-f", f"containerd.*{self.root}"], check=False, capture_output=True
        )
        _remove(self.root, self.bridge)
        for bridge in {*bridges, *bridges_in(self.pool)}:
            subprocess.run(["ip", "link", "delete", bridge], check=False, capture_output=True)
        _forward_within(self.pool, remove=True)

    def _network_bridges(self) -> list[str]:
        with contextlib.suppress(docker.errors.DockerException, OSError):
            networks = docker.APIClient(base_url=self.url, timeout=5).networks()
            return [
                (network.get("Options") or {}).get("com.docker.network.bridge.name")
                or f"br-{network['Id'][:12]}"
                for network in networks
                if network.get("Driver") == "bridge" and network.get("Name") != "bridge"
            ]
        return []


def sweep_abandoned() -> None:
    """Engines a test process started and could not stop (it was killed): their
    processes, containers included, mounts, folders and bridges go."""
    for root in Path("/tmp").glob("hb2-*"):
        try:
            pid_text, bridge, pool = (root / "owner").read_text().split()
            os.kill(int(pid_text), 0)
            continue  # its test process still runs
        except ProcessLookupError:
            pass
        except (OSError, ValueError):
            continue  # not one of ours, or just being made
        # dockerd, its containerd and the shims name the engine's folders.
        subprocess.run(["pkill", "-9", "-f", str(root)], check=False, capture_output=True)
        _kill_orphaned_containers()
        _remove(root, bridge)
        if pool != "-":
            for left in bridges_in(ipaddress.ip_network(pool)):
                subprocess.run(["ip", "link", "delete", left], check=False, capture_output=True)
            _forward_within(ipaddress.ip_network(pool), remove=True)


def bridges_in(pool: ipaddress.IPv4Network | ipaddress.IPv6Network) -> list[str]:
    """The host's bridges with an address in `pool`."""
    listed = subprocess.run(
        ["ip", "-o", "-4", "addr", "show", "type", "bridge"],
        check=False,
        capture_output=True,
        text=True,
    ).stdout
    found = []
    for line in listed.splitlines():
        fields = line.split()
        with contextlib.suppress(IndexError, ValueError):
            if ipaddress.ip_interface(fields[fields.index("inet") + 1]).ip in pool:
                found.append(fields[1])
    return found


def _kill_orphaned_containers() -> None:
    """Processes of containers the first engine does not know (their engine is gone):
    both engines put containers in cgroups named /docker/<id>."""
    known = {
        container["Id"]
        for container in docker.APIClient(base_url=FIRST_ENGINE, timeout=30).containers(all=True)
    }
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError):
            found = re.search(r"/docker/([0-9a-f]{64})", (entry / "cgroup").read_text())
            if found and found.group(1) not in known:
                os.kill(int(entry.name), signal.SIGKILL)


def _remove(root: Path, bridge: str) -> None:
    # Whatever the engine left mounted under its roots goes before the folders do.
    mounts = Path("/proc/mounts").read_text().splitlines()
    for line in reversed(mounts):
        target = line.split()[1]
        if target.startswith(str(root)):
            subprocess.run(["umount", "-l", target], check=False, capture_output=True)
    shutil.rmtree(root, ignore_errors=True)
    subprocess.run(["ip", "link", "delete", bridge], check=False, capture_output=True)


def _free_pool() -> ipaddress.IPv4Network:
    """A /16 in 10.100-199 that no address of the host and no FORWARD rule (another
    engine's pool) holds yet."""
    taken = (
        subprocess.run(
            ["ip", "-o", "-4", "addr", "show"], check=False, capture_output=True, text=True
        ).stdout
        + subprocess.run(
            ["iptables", "-S", "FORWARD"], check=False, capture_output=True, text=True
        ).stdout
    )
    used = []
    for found in re.findall(r"\d+\.\d+\.\d+\.\d+", taken):
        with contextlib.suppress(ValueError):
            used.append(ipaddress.IPv4Address(found))
    candidates = [ipaddress.IPv4Network(f"10.{second}.0.0/16") for second in range(100, 200)]
    free = [pool for pool in candidates if not any(address in pool for address in used)]
    return random.choice(free or candidates)


def _forward_within(
    pool: ipaddress.IPv4Network | ipaddress.IPv6Network, *, remove: bool = False
) -> None:
    """The host's FORWARD chain accepts traffic from `pool` to `pool` (a rule put first),
    or, with `remove`, that rule goes (one copy: another engine may hold the same pool)."""
    rule = ["FORWARD", "-s", str(pool), "-d", str(pool), "-j", "ACCEPT"]
    if remove:
        subprocess.run(["iptables", "-D", *rule], check=False, capture_output=True)
    else:
        _run("iptables", "-I", *rule)


def _run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _certificates(server: Path, client: Path) -> Path:
    """A CA of the test's own, a server certificate for 127.0.0.1 and a client one."""
    server.mkdir()
    client.mkdir()
    ca, ca_key = server / "ca.pem", server / "ca-key.pem"

    def openssl(*arguments: str) -> None:
        _run("openssl", *arguments)

    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(ca_key),
        "-out",
        str(ca),
        "-days",
        "2",
        "-subj",
        "/CN=pytest-harbor test CA",
    )
    for name, subject, usage, key, cert in (
        (
            "server",
            "/CN=127.0.0.1",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth",
            server / "server-key.pem",
            server / "server-cert.pem",
        ),
        (
            "client",
            "/CN=client",
            "extendedKeyUsage=clientAuth",
            client / "key.pem",
            client / "cert.pem",
        ),
    ):
        request = server / f"{name}.csr"
        extensions = server / f"{name}.ext"
        extensions.write_text(usage + "\n")
        openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(request),
            "-subj",
            subject,
        )
        openssl(
            "x509",
            "-req",
            "-in",
            str(request),
            "-CA",
            str(ca),
            "-CAkey",
            str(ca_key),
            "-CAcreateserial",
            "-out",
            str(cert),
            "-days",
            "2",
            "-extfile",
            str(extensions),
        )
    shutil.copy(ca, client / "ca.pem")
    return server


def image_archive(client: docker.DockerClient, name: str) -> Iterator[bytes]:
    """The image `name` of `client`'s engine as `docker save` writes it, under that name
    (not under whichever of its tags comes first: a test may have added another)."""
    tag = name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"
    return client.images.get(tag).save(named=tag)
