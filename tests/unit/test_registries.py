"""What the engine would fetch for a task from this machine or a private network: an image
whose registry is one (task.toml's `docker_image`, a Compose service's `image`, a
Dockerfile's), an `ADD` of a URL; each refused naming the file and the key or line, and
the run's `allow_remote_add` setting reaching every Dockerfile check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_harbor.run.planning import plan_taskset
from pytest_harbor.sandboxes.compose import project as compose_project
from pytest_harbor.sandboxes.compose import tasks as compose_tasks
from pytest_harbor.sandboxes.compose.project import ComposeRefused, check_config, overlay_images
from pytest_harbor.sandboxes.docker import DockerProvider
from pytest_harbor.settings import HarborSettings
from pytest_harbor.tasks import load_task
from pytest_harbor.tasks.errors import TaskLoadError
from pytest_harbor.tasks.registries import registry_host, registry_problem
from tests.fixtures import BASE_IMAGE, write_task

REMOTE_ADD = f"FROM {BASE_IMAGE}\nADD http://127.0.0.1:1/x /x\n"


@pytest.mark.parametrize(
    ("reference", "registry"),
    [
        ("debian", None),
        ("debian:bookworm-slim", None),
        ("library/debian", None),
        ("builder", None),
        ("0", None),
        ("localhost:5000", None),  # the Hub's `localhost`, tag 5000
        ("docker.io/library/debian", "docker.io"),
        ("ghcr.io/a/b:1", "ghcr.io"),
        ("localhost/x", "localhost"),
        ("Registry/x", "Registry"),  # a capital letter: a host, as Docker reads it
        ("127.0.0.1:5000/x@sha256:" + "0" * 64, "127.0.0.1:5000"),
        ("[::1]:5000/x", "[::1]:5000"),
    ],
)
def test_the_registry_is_the_first_component_as_docker_reads_it(
    reference: str, registry: str | None
) -> None:
    assert registry_host(reference) == registry


@pytest.mark.parametrize(
    "reference",
    [
        "debian",
        "ghcr.io/a/b:1",
        "8.8.8.8:5000/x",
        "[2001:4860:4860::8888]/x",
        "registry.example.com:5000/team/x",
        "1.2.3.4.5/x",  # not an address: a name
    ],
)
def test_a_public_registry_is_pulled_from(reference: str) -> None:
    assert registry_problem(reference) is None


@pytest.mark.parametrize(
    ("reference", "kind"),
    [
        ("localhost:5000/x", "a name of this machine"),
        ("LocalHost/x", "a name of this machine"),
        ("localhost./x", "a name of this machine"),
        ("127.0.0.1:5000/x", "a loopback address"),
        ("127.1/x", "a loopback address"),
        ("2130706433:80/x", "a loopback address"),
        ("[::1]/x", "a loopback address"),
        ("[::]:5000/x", "the unspecified address"),
        ("10.1.2.3/x", "a private-network address"),
        ("[fd12::1]/x", "a private-network address"),
        ("169.254.169.254/x", "a link-local address"),
        ("[fe80::1]/x", "a link-local address"),
        ("100.100.100.100/x", "not a public address"),
        ("[ff02::1]/x", "a multicast address"),
    ],
)
def test_a_registry_on_this_machine_or_a_private_network_is_refused(
    reference: str, kind: str
) -> None:
    problem = registry_problem(reference)
    assert problem is not None and kind in problem, problem
    assert "this machine's own network" in problem
    assert "a registry the engine reaches over the public network" in problem


_HOSTS = st.sampled_from(["localhost", "127.1", "0x7f.1", "[::1]", "[fe80::1%eth0]", "10.0.0.5"])


@given(st.lists(st.one_of(_HOSTS, st.text(max_size=6), st.sampled_from(":/.@[]")), max_size=12))
def test_any_reference_is_judged_without_raising(parts: list[str]) -> None:
    problem = registry_problem("".join(parts))
    assert problem is None or problem.startswith("names the registry ")


# ---------------------------------------------------------------- task.toml and the loader


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ('[environment]\ndocker_image = "127.0.0.1:5000/x"\n', "environment.docker_image"),
        (
            f'[environment]\ndocker_image = "{BASE_IMAGE}"\n'
            '[verifier]\nenvironment_mode = "separate"\n'
            '[verifier.environment]\ndocker_image = "localhost:5000/v"\n',
            "verifier.environment.docker_image",
        ),
    ],
)
def test_a_docker_image_from_a_private_registry_is_refused_naming_task_toml_and_key(
    tmp_path: Path, toml: str, key: str
) -> None:
    task = write_task(tmp_path, "private-image", toml=toml)
    with pytest.raises(TaskLoadError) as caught:
        load_task(task)
    assert caught.value.path == task / "task.toml" and caught.value.key == key
    assert "names the registry" in caught.value.message


def test_the_loader_refuses_a_remote_add_naming_the_dockerfile_and_line(tmp_path: Path) -> None:
    task = write_task(tmp_path, "remote-add", toml="", dockerfile=REMOTE_ADD)
    with pytest.raises(TaskLoadError) as caught:
        load_task(task)
    assert caught.value.path == task / "environment" / "Dockerfile"
    assert caught.value.message.startswith("line 2: ADD http://127.0.0.1:1/x")
    assert load_task(task, allow_remote_add=True).path == task


def test_a_separate_verifiers_dockerfile_is_checked_alike(tmp_path: Path) -> None:
    task = write_task(tmp_path, "verifier-add", extra_files={"tests/Dockerfile": REMOTE_ADD})
    with pytest.raises(TaskLoadError) as caught:
        load_task(task)
    assert caught.value.path == task / "tests" / "Dockerfile"
    load_task(task, allow_remote_add=True)


def test_planning_hands_allow_remote_add_to_the_loader(tmp_path: Path) -> None:
    dataset = tmp_path / "tasks"
    write_task(dataset, "remote-add", toml="", dockerfile=REMOTE_ADD)
    write_task(dataset, "fine")

    def plan(**kwargs: Any) -> tuple[list[str], list[str]]:
        planned = plan_taskset(
            dataset,
            harness="oracle",
            capabilities=DockerProvider.capabilities,
            provider="docker",
            **kwargs,
        )
        return [task.id for task in planned.tasks], [path.name for path in planned.failures]

    assert plan() == (["fine"], ["remote-add"])
    assert plan(allow_remote_add=True) == (["fine", "remote-add"], [])


def test_the_setting_is_off_unless_given() -> None:
    assert HarborSettings().allow_remote_add is False
    assert HarborSettings(allow_remote_add=True).allow_remote_add is True


# ---------------------------------------------------------------- Compose


@pytest.fixture
def compose_task(tmp_path: Path) -> Path:
    environment = tmp_path / "task" / "environment"
    (environment / "side").mkdir(parents=True)
    (environment / "side" / "Dockerfile").write_text(REMOTE_ADD)
    (environment / "docker-compose.yaml").write_text("services: {}\n")
    return tmp_path / "task"


def _services(**services: Any) -> dict[str, Any]:
    return {"services": {"main": {"image": BASE_IMAGE}, **services}}


def test_a_service_image_from_a_private_registry_is_refused_naming_file_and_key(
    compose_task: Path,
) -> None:
    file = compose_task / "environment" / "docker-compose.yaml"
    config = _services(db={"image": "192.168.1.4:5000/x"})
    with pytest.raises(ComposeRefused) as caught:
        check_config(compose_task, file, config)
    assert caught.value.file == file and caught.value.key == "services.db.image"
    assert str(caught.value).startswith("192.168.1.4:5000/x names the registry 192.168.1.4:5000")


def test_a_built_services_image_only_names_the_build(compose_task: Path) -> None:
    """With a build, `image` is the built image's name, never pulled."""
    file = compose_task / "environment" / "docker-compose.yaml"
    build = {"context": str(compose_task / "environment"), "dockerfile_inline": "FROM debian\n"}
    config = _services(db={"image": "localhost/db", "build": build})
    assert "db" in check_config(compose_task, file, config).builds


def test_a_builds_remote_add_is_refused_unless_allowed(compose_task: Path) -> None:
    file = compose_task / "environment" / "docker-compose.yaml"
    side = compose_task / "environment" / "side"
    config = _services(side={"build": {"context": str(side)}})
    with pytest.raises(ComposeRefused) as caught:
        check_config(compose_task, file, config)
    assert caught.value.key == "services.side.build.dockerfile"
    assert f"{side / 'Dockerfile'}, line 2: ADD http://127.0.0.1:1/x" in str(caught.value)
    assert "side" in check_config(compose_task, file, config, allow_remote_add=True).builds


def test_a_builds_arguments_are_read_into_its_image_references(compose_task: Path) -> None:
    file = compose_task / "environment" / "docker-compose.yaml"
    build = {
        "context": str(compose_task / "environment"),
        "dockerfile_inline": "ARG BASE=debian\nFROM ${BASE}\n",
        "args": {"BASE": "10.0.0.5:5000/x"},
    }
    with pytest.raises(ComposeRefused) as caught:
        check_config(compose_task, file, _services(db={"build": build}))
    assert "its dockerfile_inline, line 2: FROM ${BASE} (as 10.0.0.5:5000/x)" in str(caught.value)


def test_the_compose_reading_is_given_the_setting(
    compose_task: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """compose_spec hands the run's `allow_remote_add` to the Compose reading (and reads
    again when it differs)."""
    given: list[bool] = []

    def read_compose(*args: Any, allow_remote_add: bool = False, **kwargs: Any) -> Any:
        given.append(allow_remote_add)
        return object()

    monkeypatch.setattr(compose_project, "read_compose", read_compose)
    compose = {"environment/docker-compose.yaml": "services: {main: {}}\n"}
    task = write_task(compose_task.parent, "compose", extra_files=compose)
    loaded = load_task(task)
    compose_tasks.compose_spec(loaded, HarborSettings())
    compose_tasks.compose_spec(loaded, HarborSettings(allow_remote_add=True))
    assert given == [False, True]


def test_an_image_the_runs_own_overlay_names_is_the_users_to_pull(
    compose_task: Path, tmp_path: Path
) -> None:
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("services:\n  db:\n    image: 192.168.1.4:5000/x\n")
    file = compose_task / "environment" / "docker-compose.yaml"
    config = _services(db={"image": "192.168.1.4:5000/x"})
    users = overlay_images([overlay])
    assert users == {"192.168.1.4:5000/x"}
    check_config(compose_task, file, config, users_images=users)
    # Another image from a private registry, in the task's file, is still refused.
    config = _services(db={"image": "192.168.1.4:5000/y"})
    with pytest.raises(ComposeRefused):
        check_config(compose_task, file, config, users_images=users)
