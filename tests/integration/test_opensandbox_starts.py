"""Starts on an OpenSandbox server never storm it: a cap on sandboxes being created at
once and a pace of creates, shared by every process of the run on this machine, and a
server's "not now" (429) asked again. The fake enforces a limit of its own as a hosted
server does, and counts what it refused."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
import pytest

from pytest_harbor.labels import RUN_LABEL
from pytest_harbor.sandboxes.base import ProviderContext, SandboxSpec
from pytest_harbor.sandboxes.opensandbox import OpenSandboxSandbox, opensandbox_provider
from tests.fixtures import BASE_IMAGE, QUICKSTART, Dataset, run_harbor
from tests.opensandbox_fake import FakeOpenSandbox

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(
        bool(os.environ.get("OPENSANDBOX_DOMAIN")), reason="the fake counts what it refused"
    ),
]


@pytest.fixture
def fake(docker_client: docker.DockerClient) -> Iterator[FakeOpenSandbox]:
    server = FakeOpenSandbox(docker_client, api_key="start-key", max_creating=2)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch, fake: FakeOpenSandbox) -> None:
    monkeypatch.setenv("OPENSANDBOX_DOMAIN", fake.domain)
    monkeypatch.setenv("OPENSANDBOX_API_KEY", "start-key")


def _start_many(scratch: Path, count: int, **options: object) -> list[OpenSandboxSandbox]:
    """`count` sandboxes started at once, each by a provider of its own (as the workers
    of one run make theirs), sharing the run's scratch folder."""
    run = f"starts-{uuid.uuid4().hex[:8]}"
    context = ProviderContext(run_id=run, scratch_dir=scratch)

    def start(_: int) -> OpenSandboxSandbox:
        provider = opensandbox_provider(options=options, context=context)
        return provider.start(SandboxSpec(image=BASE_IMAGE, labels={RUN_LABEL: run}))

    with ThreadPoolExecutor(count) as pool:
        started = list(pool.map(start, range(count)))
    return started


def test_starts_beyond_the_cap_wait_their_turn(
    fake: FakeOpenSandbox, environ: None, tmp_path: Path
) -> None:
    started = _start_many(tmp_path, 6, max_starting=2)
    try:
        assert len({sandbox.id for sandbox in started}) == 6
        assert all(sandbox.exec(["true"]).exit_code == 0 for sandbox in started)
    finally:
        for sandbox in started:
            sandbox.stop()
    assert fake.refused_creates == 0
    assert fake.most_creating <= 2


def test_a_server_that_says_not_now_is_asked_again(
    fake: FakeOpenSandbox, environ: None, tmp_path: Path
) -> None:
    """Past the server's own limit (2 at once here), a create is refused with 429 and
    made again later: every start succeeds."""
    started = _start_many(tmp_path, 6, max_starting=6, starts_per_second=1000)
    try:
        assert len({sandbox.id for sandbox in started}) == 6
    finally:
        for sandbox in started:
            sandbox.stop()
    assert fake.refused_creates > 0
    assert fake.sandbox_containers() == []


def test_the_workers_of_a_run_share_the_cap(
    pytester: pytest.Pytester, fake: FakeOpenSandbox, environ: None
) -> None:
    """Three workers, three tasks, one start at a time across them all: the server never
    sees two creates at once, and refuses none."""
    dataset = Dataset(pytester.path / "quickstart")
    dataset.path.mkdir()
    for task in ("hello-world", "fizzbuzz-report", "greeting-workdir"):
        shutil.copytree(QUICKSTART / task, dataset.path / task)
    result = run_harbor(
        pytester,
        dataset,
        "--harbor-sandbox=opensandbox",
        "--harbor-set=sandbox_provider_options.max_starting=1",
        "-n",
        "3",
        "-p",
        "no:cacheprovider",
    )
    assert result.ret == 0, result.stdout.str()[-2000:]
    assert len(dataset.rows(pytester.path / "out")) == 3
    assert (fake.most_creating, fake.refused_creates) == (1, 0)
