"""Phases without the network and allow-lists on OpenSandbox, held by each sandbox's
egress sidecar (`sandbox_provider_options.network_policy`): its policy replaced per
phase through its API, on addresses as its dns+nft mode holds it. The fake serves the
sidecar's API and enforces its policy in the sandbox's own network namespace; the
targets are listeners of the test's own on the engine's default bridge, beside the
fake's sandboxes."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import docker
import pytest

from pytest_harbor.labels import RUN_LABEL
from pytest_harbor.sandboxes.base import (
    TRUSTED_BUSYBOX,
    ProviderContext,
    SandboxError,
    SandboxSpec,
    SandboxStartError,
)
from pytest_harbor.sandboxes.opensandbox import OpenSandboxSandbox, opensandbox_provider
from tests.fixtures import BASE_IMAGE, Dataset, run_harbor
from tests.opensandbox_fake import FakeOpenSandbox

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(
        bool(os.environ.get("OPENSANDBOX_DOMAIN")),
        reason="the targets sit beside the fake's sandboxes",
    ),
]

RUN = f"egress-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def targets(docker_client: docker.DockerClient) -> Iterator[tuple[str, str]]:
    """Two listeners on the default bridge, each answering `reached`: their addresses."""
    made = []
    try:
        for _ in range(2):
            made.append(
                docker_client.containers.run(
                    "busybox:musl",
                    [
                        "/bin/busybox",
                        "nc",
                        "-ll",
                        "-p",
                        "8080",
                        "-e",
                        "/bin/busybox",
                        "echo",
                        "reached",
                    ],
                    detach=True,
                    labels={RUN_LABEL: RUN},
                    network_mode="bridge",
                )
            )
        addresses = []
        for container in made:
            container.reload()
            addresses.append(container.attrs["NetworkSettings"]["IPAddress"])
        yield addresses[0], addresses[1]
    finally:
        for container in made:
            container.remove(force=True)


@pytest.fixture(scope="module")
def fake(docker_client: docker.DockerClient) -> Iterator[FakeOpenSandbox]:
    server = FakeOpenSandbox(docker_client, api_key="egress-key", egress_mode="dns+nft")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch, fake: FakeOpenSandbox) -> None:
    monkeypatch.setenv("OPENSANDBOX_DOMAIN", fake.domain)
    monkeypatch.setenv("OPENSANDBOX_API_KEY", "egress-key")


def start(network: bool = True, allowed: tuple[str, ...] | None = None) -> OpenSandboxSandbox:
    provider = opensandbox_provider(options={"network_policy": True}, context=ProviderContext())
    return provider.start(
        SandboxSpec(
            image=BASE_IMAGE,
            labels={RUN_LABEL: RUN},
            network=network,
            filtered=allowed is not None,
            allowed_hosts=allowed,
        )
    )


def reaches(sandbox: OpenSandboxSandbox, address: str, user: str = "0:0") -> bool:
    said = sandbox.exec(
        [TRUSTED_BUSYBOX, "nc", "-w", "3", address, "8080"], user=user, stdin=b"", timeout=30
    )
    return "reached" in said.stdout


def test_a_phase_without_the_network_reaches_nothing_and_gets_it_back(
    environ: None, targets: tuple[str, str]
) -> None:
    sandbox = start(network=False)
    try:
        assert not reaches(sandbox, targets[0])
        assert not reaches(sandbox, targets[0], user="nobody")
        sandbox.set_network(True)
        assert reaches(sandbox, targets[0])
        sandbox.set_network(False)
        assert not reaches(sandbox, targets[0])
    finally:
        sandbox.stop()


def test_an_allow_list_lets_through_what_it_names_and_nothing_else(
    environ: None, targets: tuple[str, str]
) -> None:
    sandbox = start(allowed=(targets[0],))
    try:
        assert reaches(sandbox, targets[0])
        assert not reaches(sandbox, targets[1])
        sandbox.set_egress(True, (f"{targets[1]}/32",))
        assert (reaches(sandbox, targets[0]), reaches(sandbox, targets[1])) == (False, True)
        sandbox.set_egress(True, None)
        assert reaches(sandbox, targets[0]) and reaches(sandbox, targets[1])
        with pytest.raises(SandboxError, match="model relay"):
            sandbox.set_egress(True, None, relay="127.0.0.1:9")
    finally:
        sandbox.stop()


def test_a_root_command_cannot_lift_the_policy(environ: None, targets: tuple[str, str]) -> None:
    """The policy lives outside what the sandbox can change: root in it holds no
    CAP_NET_ADMIN, so neither routes nor rules of its own lead out."""
    sandbox = start(network=False)
    try:
        lifted = sandbox.exec(
            [TRUSTED_BUSYBOX, "sh", "-c", f"{TRUSTED_BUSYBOX} ip route del default; echo $?"],
            user="0:0",
        )
        assert lifted.stdout.strip() != "0"
        assert not reaches(sandbox, targets[0])
    finally:
        sandbox.stop()


def test_a_sidecar_that_filters_names_only_is_refused_by_name(
    docker_client: docker.DockerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    names_only = FakeOpenSandbox(docker_client, api_key="dns-key", egress_mode="dns")
    names_only.start()
    try:
        monkeypatch.setenv("OPENSANDBOX_DOMAIN", names_only.domain)
        monkeypatch.setenv("OPENSANDBOX_API_KEY", "dns-key")
        with pytest.raises(SandboxStartError, match="dns\\+nft"):
            start(network=False)
        assert names_only.sandbox_containers() == []
    finally:
        names_only.stop()


def test_a_task_without_the_network_runs_and_cannot_reach_out(
    pytester: pytest.Pytester, environ: None, targets: tuple[str, str]
) -> None:
    """The oracle of a no-network task tries the listener: it scores 1 only when it
    could not reach it; the same task on the public network reaches it (0)."""
    dataset = Dataset(pytester.path / f"offline-{uuid.uuid4().hex[:6]}")
    probe = f"{TRUSTED_BUSYBOX} nc -w 3 {targets[0]} 8080 </dev/null"
    for name, mode in (("offline", "no-network"), ("online", "public")):
        dataset.task(
            name,
            toml=f'[environment]\ndocker_image = "{BASE_IMAGE}"\nnetwork_mode = "{mode}"\n',
            solve_sh=f"if {probe} | grep -q reached; then echo out; else echo held; fi"
            " > /tmp/answer\n",
            test_sh="grep -q held /tmp/answer && echo 1 > /logs/verifier/reward.txt "
            "|| echo 0 > /logs/verifier/reward.txt\n",
        )
    result = run_harbor(
        pytester,
        dataset,
        "--harbor-sandbox=opensandbox",
        "--harbor-set=sandbox_provider_options.network_policy=true",
        "-p",
        "no:cacheprovider",
    )
    rewards = {row["task_id"]: row["reward"] for row in dataset.rows(pytester.path / "out")}
    assert rewards == {"offline": 1.0, "online": 0.0}, result.stdout.str()[-2000:]
