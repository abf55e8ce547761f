"""Attacks on how a hostile task's image build is contained (tasks/dockerfiles.py, which
judges a task's Dockerfile; sandboxes/docker/images.py and builders.py, which build it).
Each test is a task's file trying to get past a promise of the threat model, and passes
when the promise holds; an attack that gets through is marked xfail (strict)."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from pytest_harbor.labels import RUN_LABEL
from pytest_harbor.sandboxes.base import BuildOptions, ImageSource, SandboxStartError
from pytest_harbor.sandboxes.docker.builders import ClassicBuild
from pytest_harbor.sandboxes.docker.provider import DockerProvider
from pytest_harbor.sandboxes.images import image_tag_for
from tests.fixtures import BASE_IMAGE, Dataset, run_harbor
from tests.integration.test_border import LineServer
from tests.unit.test_border_rules import watchdog

pytestmark = pytest.mark.docker

RUN = f"build-attack-{uuid.uuid4().hex[:8]}"
#: This machine's loopback, and its address on the engine's default bridge.
HOST_ADDRESSES = ("127.0.0.1", "172.17.0.1")
DOCKER_SOCKET = "/var/run/docker.sock"


@pytest.fixture
def dataset(harbor_dataset: Dataset) -> Dataset:
    return harbor_dataset


@pytest.fixture(params=HOST_ADDRESSES)
def host_server(request: pytest.FixtureRequest) -> Iterator[LineServer]:
    """A server of the test process on an address only this machine serves."""
    server = LineServer(request.param, "host-secret")
    server.address = request.param  # type: ignore[attr-defined]
    try:
        yield server
    finally:
        server.close()


def _run_task(
    pytester: pytest.Pytester, dataset: Dataset, built_images: list[Path], dockerfile: str
) -> pytest.RunResult:
    task = dataset.task(
        "hostile",
        toml="[verifier]\ntimeout_sec = 60\n[environment]\nbuild_timeout_sec = 60\n",
        dockerfile=dockerfile,
    )
    built_images.append(task / "environment")
    return run_harbor(pytester, dataset)


@pytest.mark.parametrize(
    "hidden",
    [
        "FROM {base}\nADD \\\n\nhttp://{host}/leak /leak\n",  # the engine would fetch it
        "FROM \\\n\n{host}/stolen:latest\nRUN true\n",  # the engine would pull from it
    ],
    ids=["add", "from"],
)
def test_an_empty_continuation_line_does_not_let_the_engine_reach_this_machine(
    pytester: pytest.Pytester,
    dataset: Dataset,
    built_images: list[Path],
    host_server: LineServer,
    hidden: str,
) -> None:
    address = host_server.address  # type: ignore[attr-defined]
    host = f"{address}:{host_server.port}"
    _run_task(pytester, dataset, built_images, hidden.format(base=BASE_IMAGE, host=host))
    assert host_server.answered == 0, "the engine reached a server of this machine"


def test_a_checked_add_of_a_url_of_this_machine_is_refused_before_the_build(
    pytester: pytest.Pytester,
    dataset: Dataset,
    built_images: list[Path],
    host_server: LineServer,
) -> None:
    # The same ADD written plainly, or with the escape directive's games: the check
    # reads it and the build never starts.
    address = host_server.address  # type: ignore[attr-defined]
    url = f"http://{address}:{host_server.port}/leak"
    _run_task(
        pytester,
        dataset,
        built_images,
        f"# syntax=docker/dockerfile:1\n# escape=`\nFROM {BASE_IMAGE}\nRUN echo \\\nADD {url} /l\n",
    )
    assert host_server.answered == 0


# ------------------------------------------------------------ the fallback to BuildKit


@pytest.fixture
def provider_and_context(
    tmp_path: Path, docker_client: docker.DockerClient
) -> Iterator[tuple[DockerProvider, Path]]:
    context = tmp_path / "environment"
    context.mkdir()
    yield DockerProvider(), context
    for tag in (image_tag_for(context),):
        with contextlib.suppress(docker.errors.APIError):
            docker_client.images.remove(tag, force=True)


def _source(context: Path, budget: float) -> ImageSource:
    return ImageSource(
        docker_image=None,
        context_dir=context,
        build_timeout_sec=budget,
        labels={RUN_LABEL: RUN},
    )


def test_a_build_takes_no_more_than_its_budget_under_the_fallback(
    provider_and_context: tuple[DockerProvider, Path],
) -> None:
    provider, context = provider_and_context
    (context / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nRUN sleep 5; echo {uuid.uuid4().hex}; exit 1 # requires BuildKit\n"
    )
    # A step that ran and failed is no refusal of the file's form: BuildKit does not build
    # it again (with what would have been a budget of its own).
    with pytest.raises(SandboxStartError) as failed:
        provider.prepare_image(_source(context, 6))
    assert "returned a non-zero code" in str(failed.value)
    assert "BuildKit built it" not in str(failed.value)


def test_a_build_that_never_ends_is_stopped_under_the_fallback(
    provider_and_context: tuple[DockerProvider, Path],
) -> None:
    # COPY --chmod makes the classic builder refuse the file, so BuildKit builds it; its
    # step never ends.
    provider, context = provider_and_context
    (context / "a").write_text("a\n")
    (context / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nCOPY --chmod=644 a /a\nRUN echo {uuid.uuid4().hex}; sleep 3600\n"
    )
    started = time.monotonic()
    with pytest.raises(SandboxStartError, match="longer than"):
        provider.prepare_image(_source(context, 5))
    assert time.monotonic() - started < 20


@pytest.mark.parametrize("builder", ["classic", "fallback"])
def test_a_symlink_in_the_context_copies_no_file_of_this_machine(
    provider_and_context: tuple[DockerProvider, Path],
    docker_client: docker.DockerClient,
    builder: str,
) -> None:
    provider, context = provider_and_context
    secret = context.parent / "secret.txt"
    secret.write_text("host-secret\n")
    (context / "link").symlink_to(secret)
    (context / "folder").symlink_to(context.parent)
    flag = "--chmod=644 " if builder == "fallback" else ""
    (context / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\n"
        f"COPY {flag}link folder/secret.txt* /copied/\n"
        "RUN cat /copied/* 2>/dev/null > /found.txt; true\n"
    )
    with contextlib.suppress(SandboxStartError):
        image = provider.prepare_image(_source(context, 60))
        output = docker_client.containers.run(
            image, ["cat", "/found.txt"], remove=True, labels={RUN_LABEL: RUN}, network_mode="none"
        )
        assert b"host-secret" not in output


@pytest.mark.parametrize("flag", ["", "--chmod=644 "])
def test_a_copy_from_outside_the_context_is_refused(
    provider_and_context: tuple[DockerProvider, Path],
    docker_client: docker.DockerClient,
    flag: str,
) -> None:
    provider, context = provider_and_context
    (context.parent / "secret.txt").write_text("host-secret\n")
    (context / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nCOPY {flag}../secret.txt ../../secret.txt* /copied/\n"
        "RUN cat /copied/* 2>/dev/null > /found.txt; true\n"
    )
    with contextlib.suppress(SandboxStartError):
        image = provider.prepare_image(_source(context, 60))
        output = docker_client.containers.run(
            image, ["cat", "/found.txt"], remove=True, labels={RUN_LABEL: RUN}, network_mode="none"
        )
        assert b"host-secret" not in output


# ------------------------------------------------------------ one task's build, another's image


@pytest.fixture
def two_contexts(
    tmp_path: Path, docker_client: docker.DockerClient
) -> Iterator[tuple[DockerProvider, list[ImageSource]]]:
    """Two tasks' contexts; the images built from them (by the sources the test adds to
    the list) are removed afterwards."""
    sources: list[ImageSource] = []
    yield DockerProvider(), sources
    for source in sources:
        assert source.context_dir is not None
        with contextlib.suppress(docker.errors.APIError):
            docker_client.images.remove(image_tag_for(source.context_dir, source.build), force=True)


def _context(root: Path, name: str, dockerfile: str) -> Path:
    context = root / name / "environment"
    context.mkdir(parents=True)
    (context / "Dockerfile").write_text(dockerfile)
    return context


def _read(client: docker.DockerClient, image: str, path: str) -> bytes:
    output: bytes = client.containers.run(
        image,
        ["sh", "-c", f"cat {path} 2>/dev/null; true"],
        remove=True,
        labels={RUN_LABEL: RUN},
        network_mode="none",
    )
    return output


def test_a_build_with_extra_hosts_does_not_decide_another_tasks_layer(
    tmp_path: Path,
    docker_client: docker.DockerClient,
    two_contexts: tuple[DockerProvider, list[ImageSource]],
) -> None:
    provider, sources = two_contexts
    step = f"RUN getent hosts deb.debian.org > /resolved; echo {uuid.uuid4().hex}\n"
    dockerfile = f"FROM {BASE_IMAGE}\n{step}"
    hostile = ImageSource(
        docker_image=None,
        context_dir=_context(tmp_path, "hostile", dockerfile),
        build_timeout_sec=60,
        labels={RUN_LABEL: RUN},
        build=BuildOptions(extra_hosts=(("deb.debian.org", "10.66.66.66"),)),
    )
    honest = _source(_context(tmp_path, "honest", dockerfile), 60)
    sources += [hostile, honest]
    provider.prepare_image(hostile)
    image = provider.prepare_image(honest)
    assert b"10.66.66.66" not in _read(docker_client, image, "/resolved")


@pytest.mark.parametrize(
    "options",
    [BuildOptions(extra_hosts=(("deb.debian.org", "10.66.66.66"),)), BuildOptions(network="none")],
    ids=["extra_hosts", "no-network"],
)
def test_the_classic_builder_alone_builds_no_step_its_cache_cannot_tell_apart(
    tmp_path: Path, options: BuildOptions
) -> None:
    """With builder=classic, a build whose steps differ from another's of the same lines
    by what the classic builder's cache does not key is refused, naming why."""
    source = ImageSource(
        docker_image=None,
        context_dir=_context(tmp_path, "hostile", f"FROM {BASE_IMAGE}\nRUN true\n"),
        build_timeout_sec=60,
        labels={RUN_LABEL: RUN},
        build=options,
    )
    with pytest.raises(SandboxStartError, match="is built with BuildKit, whose cache keys"):
        DockerProvider(builder="classic").prepare_image(source)


@pytest.mark.parametrize("space", ["\r", "\f", "\v"], ids=["cr", "form-feed", "vertical-tab"])
def test_a_character_docker_reads_as_white_space_does_not_let_add_fetch_from_this_machine(
    pytester: pytest.Pytester,
    dataset: Dataset,
    built_images: list[Path],
    space: str,
) -> None:
    server = LineServer("127.0.0.1", "host-secret")
    try:
        _run_task(
            pytester,
            dataset,
            built_images,
            f"FROM {BASE_IMAGE}\nADD{space}http://127.0.0.1:{server.port}/leak /leak\n",
        )
        assert server.answered == 0, "the build fetched a URL of this machine"
    finally:
        server.close()


# ------------------------------------------------------------ what a build's output costs the run


def test_what_a_build_step_prints_costs_the_run_a_bounded_memory(
    provider_and_context: tuple[DockerProvider, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    provider, context = provider_and_context
    builds: list[ClassicBuild] = []
    real = ClassicBuild.__init__

    def kept(self: ClassicBuild, *args: object, **kwargs: object) -> None:
        real(self, *args, **kwargs)  # type: ignore[arg-type]
        builds.append(self)

    monkeypatch.setattr(ClassicBuild, "__init__", kept)
    # 40 MB in 200-character lines, then the step fails.
    (context / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nRUN echo {uuid.uuid4().hex}; "
        "head -c 40000000 /dev/zero | tr '\\0' a | fold -w 200; exit 1\n"
    )
    with pytest.raises(SandboxStartError):
        provider.prepare_image(_source(context, 60))
    assert builds
    kept_bytes = sum(len(line) for build in builds for line in build.log)
    assert kept_bytes < 8_000_000, f"{kept_bytes} bytes of a step's output kept in memory"


@pytest.mark.xfail(
    strict=True,
    reason="the classic builder's context is made and sent by docker-py in the build's "
    "thread; a large (sparse) file in the task folder keeps it writing a tar to this "
    "machine's disk after the build's budget is past and the task has failed (and the "
    "build then goes on, and tags an image nothing removes): the budget stops only a RUN "
    "step's container",
)
def test_a_build_past_its_budget_leaves_nothing_working(
    provider_and_context: tuple[DockerProvider, Path], docker_client: docker.DockerClient
) -> None:
    provider, context = provider_and_context
    (context / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nRUN echo {uuid.uuid4().hex}\n")
    big = context / "big"
    with big.open("wb") as handle:
        handle.truncate(2 << 30)  # sparse: nothing on disk
    tag = image_tag_for(context)
    try:
        with pytest.raises(SandboxStartError, match="longer than"):
            provider.prepare_image(_source(context, 2))
        time.sleep(1)
        working = [thread.name for thread in threading.enumerate() if thread.name == "harbor-build"]
        assert not working, "the build goes on after its budget"
    finally:
        big.unlink()
        # The build thread ends once its context is sent (or it fails).
        for thread in threading.enumerate():
            if thread.name == "harbor-build":
                thread.join(60)
        # What the build made once its budget was past.
        with contextlib.suppress(docker.errors.APIError):
            docker_client.images.remove(tag, force=True)


# ------------------------------------------------------------ labels a task's image gives


def test_a_tasks_image_cannot_keep_its_sandboxes_from_the_sweep(
    provider_and_context: tuple[DockerProvider, Path], docker_client: docker.DockerClient
) -> None:
    provider, context = provider_and_context
    (context / "Dockerfile").write_text(
        f'FROM {BASE_IMAGE}\nLABEL pytest-harbor.cache="tools" nonce="{uuid.uuid4().hex}"\n'
    )
    run = f"{RUN}-{uuid.uuid4().hex[:6]}"
    image = provider.prepare_image(
        ImageSource(
            docker_image=None,
            context_dir=context,
            build_timeout_sec=60,
            labels={RUN_LABEL: run},
        )
    )
    # A sandbox of the run, as the provider labels it.
    container = docker_client.containers.create(
        image, ["sleep", "60"], labels={RUN_LABEL: run}, network_mode="none"
    )
    try:
        watchdog.sweep(watchdog.Engine(DOCKER_SOCKET), [f"{RUN_LABEL}={run}"])
        left = docker_client.containers.list(all=True, filters={"label": f"{RUN_LABEL}={run}"})
        assert not left, "a sandbox of the crashed run is left behind"
    finally:
        with contextlib.suppress(docker.errors.APIError):
            container.remove(force=True)


def test_a_byte_order_mark_does_not_let_add_fetch_from_this_machine(
    pytester: pytest.Pytester, dataset: Dataset, built_images: list[Path]
) -> None:
    server = LineServer("127.0.0.1", "host-secret")
    try:
        _run_task(
            pytester,
            dataset,
            built_images,
            f"\ufeff# escape=`\nFROM {BASE_IMAGE}\nRUN echo \\\n"
            f"ADD http://127.0.0.1:{server.port}/leak /leak\n",
        )
        assert server.answered == 0, "the build fetched a URL of this machine"
    finally:
        server.close()
