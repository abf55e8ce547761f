"""A task as an adversary beyond its Compose file: Dockerfiles that ask the builder for
the engine's shared cache, the host's network or a frontend of their own; a volume on
the engine named like the trusted tools' that pytest-harbor did not make; a task folder
named with control characters. Each is refused naming the file (and line or key), the
rest of the run goes on, and nothing was built or mounted."""

from __future__ import annotations

import json
import uuid
import xml.dom.minidom
from collections.abc import Iterator

import docker
import pytest

from pytest_harbor.labels import RUN_LABEL
from pytest_harbor.sandboxes.base import SandboxStartError
from pytest_harbor.sandboxes.docker import images as engine_images
from pytest_harbor.sandboxes.docker import networks
from pytest_harbor.sandboxes.images import image_tag_for
from tests.fixtures import BASE_IMAGE, Dataset, run_harbor

pytestmark = pytest.mark.docker

POISON = "FROM {image}\nRUN --mount=type=cache,target=/root/.cache echo planted > /root/.cache/x\n"


def test_a_dockerfile_asking_for_more_than_its_context_is_refused_and_not_built(
    pytester: pytest.Pytester, harbor_dataset: Dataset, docker_client: docker.DockerClient
) -> None:
    """A task's own Dockerfile, a separate verifier's, and a Compose service's: each
    refused by file and line (or key) before any build; the fine task runs."""
    own = harbor_dataset.task("cache-mount", toml="", dockerfile=POISON.format(image=BASE_IMAGE))
    frontend = harbor_dataset.task(
        "frontend", toml="", dockerfile=f"# syntax=attacker/frontend:1\nFROM {BASE_IMAGE}\n"
    )
    verifier = harbor_dataset.task(
        "verifier-host-network",
        toml=f'[environment]\ndocker_image = "{BASE_IMAGE}"\n',
        extra_files={"tests/Dockerfile": f"FROM {BASE_IMAGE}\nRUN --network=host true\n"},
    )
    service = harbor_dataset.task(
        "service-cache-mount",
        toml=f'[environment]\ndocker_image = "{BASE_IMAGE}"\n',
        extra_files={
            "environment/db/Dockerfile": POISON.format(image=BASE_IMAGE),
            "environment/docker-compose.yaml": (
                "services:\n  main:\n    depends_on: [db]\n  db:\n    build: ./db\n"
            ),
        },
    )
    syntax_arg = harbor_dataset.task(
        "syntax-argument",
        toml=f'[environment]\ndocker_image = "{BASE_IMAGE}"\n',
        extra_files={
            "environment/db/Dockerfile": f"FROM {BASE_IMAGE}\n",
            "environment/docker-compose.yaml": (
                "services:\n  main: {}\n  db:\n    build:\n      context: ./db\n"
                "      args: {BUILDKIT_SYNTAX: attacker/frontend:1}\n"
            ),
        },
    )
    harbor_dataset.task("fine")
    result = run_harbor(pytester, harbor_dataset, "--harbor-skip-unloadable")
    result.assert_outcomes(passed=1)
    folder = harbor_dataset.results_folder(pytester.path / "out")
    skipped = json.loads((folder / "skipped.json").read_text())
    expected = {
        "cache-mount": f"{own}/environment/Dockerfile: line 2: RUN --mount=type=cache",
        "frontend": f"{frontend}/environment/Dockerfile: line 1: # syntax=attacker/frontend",
        "verifier-host-network": f"{verifier}/tests/Dockerfile: line 2: RUN --network=host",
        "service-cache-mount": (
            f"{service}/environment/docker-compose.yaml: services.db.build.dockerfile: "
            f"{service}/environment/db/Dockerfile, line 2: RUN --mount=type=cache"
        ),
        "syntax-argument": (
            f"{syntax_arg}/environment/docker-compose.yaml: "
            "services.db.build.args.BUILDKIT_SYNTAX: the build argument BUILDKIT_SYNTAX"
        ),
    }
    assert sorted(skipped) == sorted(expected)
    for name, words in expected.items():
        assert skipped[name].startswith(words), skipped[name]
    for context in (own / "environment", service / "environment" / "db"):
        with pytest.raises(docker.errors.ImageNotFound):
            docker_client.images.get(image_tag_for(context))


def test_what_the_engine_would_fetch_from_this_machine_is_refused_and_the_rest_runs(
    pytester: pytest.Pytester, harbor_dataset: Dataset, docker_client: docker.DockerClient
) -> None:
    """An ADD of a URL on this machine's loopback, a task image and a Compose service's
    image from registries on this machine or a private network: each refused by file and
    line (or key) before the engine fetches anything; the fine task runs."""
    add = harbor_dataset.task(
        "remote-add", toml="", dockerfile=f"FROM {BASE_IMAGE}\nADD http://127.0.0.1:1/x /x\n"
    )
    image = harbor_dataset.task(
        "loopback-image", toml='[environment]\ndocker_image = "127.0.0.1:5000/x"\n'
    )
    service = harbor_dataset.task(
        "private-service",
        extra_files={
            "environment/docker-compose.yaml": (
                "services:\n  main:\n    depends_on: [db]\n  db:\n    image: 192.168.1.4:5000/x\n"
            ),
        },
    )
    harbor_dataset.task("fine")
    result = run_harbor(pytester, harbor_dataset, "--harbor-skip-unloadable")
    result.assert_outcomes(passed=1)
    folder = harbor_dataset.results_folder(pytester.path / "out")
    skipped = json.loads((folder / "skipped.json").read_text())
    expected = {
        "remote-add": f"{add}/environment/Dockerfile: line 2: ADD http://127.0.0.1:1/x: ",
        "loopback-image": (
            f"{image}/task.toml: environment.docker_image: 127.0.0.1:5000/x names the "
            "registry 127.0.0.1:5000"
        ),
        "private-service": (
            f"{service}/environment/docker-compose.yaml: services.db.image: "
            "192.168.1.4:5000/x names the registry 192.168.1.4:5000"
        ),
    }
    assert sorted(skipped) == sorted(expected)
    for name, words in expected.items():
        assert skipped[name].startswith(words), skipped[name]
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(image_tag_for(add / "environment"))


@pytest.fixture
def other_tools_image(docker_client: docker.DockerClient) -> Iterator[str]:
    """A tools image of its own (busybox:musl with one more layer), so the tools volume's
    name is this test's alone."""
    run = f"test-tools-{uuid.uuid4().hex[:8]}"
    container = docker_client.containers.create("busybox:musl", ["true"], labels={RUN_LABEL: run})
    image = container.commit(repository="pytest-harbor-test-tools", tag=run)
    container.remove()
    yield f"pytest-harbor-test-tools:{run}"
    docker_client.images.remove(image.id, force=True)


def test_a_volume_named_like_the_tools_volume_that_pytest_harbor_did_not_make_is_refused(
    docker_client: docker.DockerClient, other_tools_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planted before the engine made its own, with no label of ours: never mounted into
    a sandbox; the error says what to remove."""
    monkeypatch.setattr(engine_images, "TOOLS_IMAGE", other_tools_image)
    digest = docker_client.images.get(other_tools_image).id.split(":")[-1]
    name = f"pytest-harbor-tools-{digest[:16]}"
    planted = [
        docker_client.volumes.create(name, labels={RUN_LABEL: "planted"}),
        docker_client.volumes.create(f"{name}-ready", labels={RUN_LABEL: "planted"}),
    ]
    try:
        with pytest.raises(SandboxStartError) as caught:
            engine_images.EngineImages().tools_volume()
        assert f"the volume {name}-ready on this engine was not made by pytest-harbor" in str(
            caught.value
        )
        planted[1].remove()
        with pytest.raises(SandboxStartError) as caught:
            engine_images.EngineImages().tools_volume()
        assert f"the volume {name} on this engine was not made by pytest-harbor" in str(
            caught.value
        )
    finally:
        for volume in docker_client.volumes.list(filters={"name": name}):
            volume.remove(force=True)


def test_a_task_folder_named_with_control_characters_or_at_length_is_refused(
    pytester: pytest.Pytester, harbor_dataset: Dataset
) -> None:
    """A terminal escape, a bell and a carriage return in a task folder's name: the task is
    refused, its id shown escaped in the terminal and the junit XML (still valid XML); a
    name of 200 bytes (which crashed the run when its results were written) is refused;
    the rest of the run goes on."""
    hostile = "esc\x1b]0;PWNED\x07\x1b[31mred\rX"
    long = "L" * 200
    harbor_dataset.task(hostile)
    harbor_dataset.task(long)
    harbor_dataset.task("fine")
    result = run_harbor(
        pytester, harbor_dataset, "--harbor-skip-unloadable", "--junitxml=junit.xml"
    )
    result.assert_outcomes(passed=1)
    output = "\n".join(result.outlines + result.errlines)
    assert "\x1b" not in output and "\x07" not in output
    assert "esc\\x1b]0;PWNED\\x07\\x1b[31mred\\rX" in output
    skipped = json.loads(
        (harbor_dataset.results_folder(pytester.path / "out") / "skipped.json").read_text()
    )
    assert "control or format characters" in skipped[hostile]
    assert "name is 200 bytes long (at most 128)" in skipped[long]
    xml.dom.minidom.parse(str(pytester.path / "junit.xml"))
    unrefused = run_harbor(pytester, harbor_dataset, "--junitxml=junit2.xml")
    unrefused.assert_outcomes(errors=2)
    assert "\x1b" not in "\n".join(unrefused.outlines)
    xml.dom.minidom.parse(str(pytester.path / "junit2.xml"))


def test_a_network_named_like_the_isolated_one_that_pytest_harbor_did_not_make_is_refused(
    docker_client: docker.DockerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sandboxes join the engine's isolated network by name only when it carries
    pytest-harbor's label and keeps its containers apart: a planted one (where they
    would reach each other) is refused, never joined."""
    name = f"pytest-harbor-test-isolated-{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(networks, "ISOLATED_NETWORK", name)
    planted = docker_client.networks.create(name, labels={RUN_LABEL: "planted"})
    try:
        with pytest.raises(SandboxStartError) as caught:
            networks.IsolatedNetwork(None).name()
        assert f"the network {name} on this engine was not made by pytest-harbor" in str(
            caught.value
        )
    finally:
        planted.remove()
    made = networks.IsolatedNetwork(None).name()
    try:
        attrs = docker_client.networks.get(made).attrs
        assert attrs["Options"]["com.docker.network.bridge.enable_icc"] == "false"
        assert networks.IsolatedNetwork(None).name() == made  # found, not made again
    finally:
        docker_client.networks.get(made).remove()


def test_files_nested_past_a_parsers_depth_leave_every_other_tasks_row_written(
    pytester: pytest.Pytester, harbor_dataset: Dataset
) -> None:
    """A task.toml nested 20,000 deep and a task_data.json nested 100,000 deep beside a
    canary task, and a second dataset whose dataset.toml nests 20,000 deep: with
    --harbor-skip-unloadable the run ends normally, the canary's row is written, and each
    hostile file is named."""
    harbor_dataset.task("canary")
    harbor_dataset.task(
        "deep-toml",
        toml=f'[environment]\ndocker_image = "{BASE_IMAGE}"\n[metadata]\nx = '
        + "[" * 20_000
        + "]" * 20_000
        + "\n",
    )
    harbor_dataset.task("deep-data", extra_files={"task_data.json": "[" * 100_000 + "]" * 100_000})
    other = Dataset(pytester.path / f"ds-deep-{uuid.uuid4().hex[:6]}")
    other.path.mkdir()
    other.task("other-canary")
    (other.path / "dataset.toml").write_text("[gym]\nx = " + "[" * 20_000 + "]" * 20_000)
    result = run_harbor(
        pytester, harbor_dataset, f"--harbor-dataset={other.path}", "--harbor-skip-unloadable"
    )
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.assert_outcomes(passed=1)
    rows = harbor_dataset.rows(pytester.path / "out")
    assert [row["task_id"] for row in rows] == ["canary"]
    skipped = json.loads(
        (harbor_dataset.results_folder(pytester.path / "out") / "skipped.json").read_text()
    )
    assert "nests arrays or tables deeper than 100 levels" in json.dumps(skipped)
    assert "nests arrays or objects deeper than 100 levels" in json.dumps(skipped)
    result.stdout.fnmatch_lines(["*left out: *dataset.toml: nests arrays or tables deeper*"])
