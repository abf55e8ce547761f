"""Attacks on the border (sandboxes/docker/egress/border.py), written by a second red team:
each test is a task's file trying to reach what the border promises no build step or
sandbox reaches, and passes when the border holds.

The target is a server of the test process on this machine's address on a network the
test makes (its gateway): the border refuses anything a build step sends to any address
of this machine."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from pytest_harbor.labels import RUN_LABEL
from pytest_harbor.sandboxes.base import ImageSource, SandboxStartError
from pytest_harbor.sandboxes.docker import Endpoint
from pytest_harbor.sandboxes.docker.provider import DockerProvider
from pytest_harbor.sandboxes.docker.watchdog import prepare_helper_image
from pytest_harbor.sandboxes.images import image_tag_for
from pytest_harbor.sandboxes.opensandbox.images import RegistryImages
from tests.fixtures import BASE_IMAGE
from tests.integration.test_border import SERVE, TARGET_PORT, LineServer
from tests.integration.test_border_attacks import HostTarget
from tests.second_engine import SecondEngine, image_archive

pytestmark = pytest.mark.docker

RUN = f"border-attack-2-{uuid.uuid4().hex[:8]}"


@pytest.fixture()
def host_target(docker_client: docker.DockerClient) -> Iterator[tuple[HostTarget, LineServer]]:
    # An address of this machine no rule of Docker's rewrites: the gateway of a network of
    # the test's, its traffic out not masqueraded.
    network = docker_client.networks.create(
        f"harbor-attack-{uuid.uuid4().hex[:8]}",
        labels={"pytest-harbor.run": RUN},
        options={"com.docker.network.bridge.enable_ip_masquerade": "false"},
    )
    try:
        network.reload()
        address = str(network.attrs["IPAM"]["Config"][0]["Gateway"])
        server = LineServer(address, "host-secret")
        try:
            yield HostTarget(address, server.port), server
        finally:
            server.close()
    finally:
        network.remove()


def test_a_task_image_built_for_opensandbox_reaches_nothing_of_this_machine(
    tmp_path: Path,
    docker_client: docker.DockerClient,
    host_target: tuple[HostTarget, LineServer],
) -> None:
    # The OpenSandbox provider builds a task's Dockerfile on this machine's own engine
    # (opensandbox/images.py) before pushing it; its steps run wherever that build puts
    # them. A RUN step tries this machine's address over TCP and UDP.
    target, server = host_target
    (tmp_path / "probe.sh").write_text(
        f"(timeout 5 bash -c 'exec 3<>/dev/tcp/{target.address}/{target.port} && head -n1 <&3'"
        " || echo unreachable) > /probe.txt\n"
        f"(timeout 3 bash -c 'exec 3<>/dev/udp/{target.address}/{target.port} && echo ping >&3"
        " && head -n1 <&3' || echo unreachable) >> /probe.txt\n"
    )
    (tmp_path / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nCOPY probe.sh /probe.sh\n"
        f"RUN echo {uuid.uuid4().hex} && bash /probe.sh\n"
    )
    images = RegistryImages("127.0.0.1:9")  # nothing listens: the push fails, after the build
    source = ImageSource(
        docker_image=None,
        context_dir=tmp_path,
        build_timeout_sec=300.0,
        labels={RUN_LABEL: RUN},
    )
    try:
        with contextlib.suppress(SandboxStartError):
            images.prepare_image(source)
        assert server.answered == 0, "a build step of the task reached this machine"
    finally:
        # The build, and what was made of it to push (a commit, tagged for the registry).
        tag = image_tag_for(tmp_path, source.build)
        for name in (f"127.0.0.1:9/pytest-harbor:{tag}-cluster", f"{tag}-cluster", tag):
            with contextlib.suppress(docker.errors.APIError):
                docker_client.images.remove(name)


def test_on_a_second_engine_a_sandbox_reaches_no_other_sandbox(
    docker_client: docker.DockerClient,
) -> None:
    # Every sandbox with the network on an engine joins its one sandboxes' network
    # (`pytest-harbor-isolated`, its bridge `phbi…`), made with inter-container traffic
    # off; an engine with --iptables=false (the second engine, a remote one configured so)
    # has no rule that turns it off, and the border lets two containers of one bridge reach
    # each other. A sandbox of one episode serves; one of another episode connects.
    mark = {"pytest-harbor.run": RUN}
    helper = prepare_helper_image()
    engine = SecondEngine().start()
    try:
        second = engine.client()
        second.images.load(image_archive(docker_client, helper))
        provider = DockerProvider(endpoint=Endpoint(engine.url))
        try:
            network = provider._guarded_network()  # what _network_of() gives a sandbox
            server = second.containers.create(
                helper,
                entrypoint=["python3", "-c", SERVE, "other-episode-secret", str(TARGET_PORT)],
                labels=mark,
                network=network,
            )
            server.start()
            server.reload()
            address = server.attrs["NetworkSettings"]["Networks"][network]["IPAddress"]
            probe = (
                "import socket\ntry:\n"
                f"    s = socket.create_connection(({address!r}, {TARGET_PORT}), timeout=4)\n"
                "    print(s.recv(100).decode().strip())\n"
                "except OSError:\n    print('unreachable')\n"
            )
            time.sleep(1)
            found = second.containers.run(
                helper,
                entrypoint=["python3", "-c", probe],
                labels=mark,
                network=network,
                remove=True,
            )
            assert found.decode().strip() == "unreachable", "a sandbox reached another's server"
        finally:
            provider.unwatch()
            for container in second.containers.list(
                all=True, filters={"label": f"pytest-harbor.run={RUN}"}
            ):
                container.remove(force=True)
    finally:
        engine.stop()
