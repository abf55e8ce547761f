"""A Compose service's `build`: its options read from the canonical configuration, the
keys refused (named by file and key path), the Dockerfile kept inside the task folder, the
content hash each option that says what the image is changes, and the flags each builder
gets."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from pytest_harbor.sandboxes.base import BuildOptions
from pytest_harbor.sandboxes.compose.project import ComposeRefused, ComposeSpec, check_config
from pytest_harbor.sandboxes.docker.builders import buildx_options, classic_options
from pytest_harbor.sandboxes.images import build_hash, context_hash, image_tag_for


@pytest.fixture
def task(tmp_path: Path) -> Path:
    """A task folder whose environment holds two Dockerfiles and a Compose file."""
    environment = tmp_path / "task" / "environment"
    (environment / "api").mkdir(parents=True)
    (environment / "Dockerfile").write_text("FROM busybox:musl\n")
    (environment / "stages.Dockerfile").write_text("FROM busybox:musl AS one\n")
    (environment / "api" / "Dockerfile").write_text("FROM busybox:musl\n")
    (environment / "docker-compose.yaml").write_text("services: {}\n")
    return tmp_path / "task"


def check(task: Path, **build: Any) -> ComposeSpec:
    """The canonical configuration of a task whose `side` service has `build`."""
    environment = task / "environment"
    config = {
        "services": {
            "main": {"image": "busybox:musl"},
            "side": {"build": {"context": str(environment), **build}},
        }
    }
    return check_config(task, environment / "docker-compose.yaml", config)


def options(task: Path, **build: Any) -> BuildOptions:
    return check(task, **build).builds["side"].options


# ---------------------------------------------------------------- reading the options


def test_every_supported_option_is_read(task: Path) -> None:
    read = options(
        task,
        dockerfile="stages.Dockerfile",
        args={"B": "2", "A": "1", "EMPTY": ""},
        target="one",
        labels={"org.example.kind": "api"},
        extra_hosts=["db=10.0.0.2", "v6=::1"],
        network="none",
        platforms=["linux/amd64"],
        no_cache=True,
        pull=True,
        cache_from=["ignored:1"],
        tags=["ignored:2"],
        isolation="default",
    )
    assert read == BuildOptions(
        dockerfile=task / "environment" / "stages.Dockerfile",
        args=(("A", "1"), ("B", "2"), ("EMPTY", "")),
        target="one",
        labels=(("org.example.kind", "api"),),
        extra_hosts=(("db", "10.0.0.2"), ("v6", "::1")),
        network="none",
        platform="linux/amd64",
        no_cache=True,
        pull=True,
    )


def test_args_as_a_list_follow_composes_rule_for_a_bare_name(task: Path) -> None:
    """`B` with no value is set by the environment when Compose resolves the file; when
    nothing sets it, it is not passed at all (and `C=` is the empty string)."""
    assert options(task, args=["A=1", "B", "C=", "D=x=y"]).args == (
        ("A", "1"),
        ("C", ""),
        ("D", "x=y"),
    )
    assert options(task, args={"A": "1", "B": None}).args == (("A", "1"),)


def test_the_default_build_is_as_before(task: Path) -> None:
    """`dockerfile: Dockerfile` (which Compose writes when none is given) and empty or
    false options are the defaults: the image keeps the name of its context alone."""
    environment = task / "environment"
    spec = check(task, dockerfile="Dockerfile", args={}, no_cache=False, network="default")
    build = spec.builds["side"]
    assert build.context == environment.resolve()
    assert build.options == BuildOptions()
    assert image_tag_for(environment, build.options) == image_tag_for(environment)
    assert image_tag_for(environment) == f"hb__{context_hash(environment)[:32]}"


def test_an_inline_dockerfile_is_read(task: Path) -> None:
    read = options(task, dockerfile_inline="FROM busybox:musl\nRUN true\n")
    assert read.dockerfile_inline == "FROM busybox:musl\nRUN true\n"
    assert read.dockerfile is None


def test_a_dockerfile_outside_the_context_but_inside_the_task_is_taken(task: Path) -> None:
    spec = check(task, context=str(task / "environment" / "api"), dockerfile="../stages.Dockerfile")
    assert spec.builds["side"].options.dockerfile == task / "environment" / "stages.Dockerfile"


# ---------------------------------------------------------------- refusals


def refusal(task: Path, **build: Any) -> ComposeRefused:
    with pytest.raises(ComposeRefused) as caught:
        check(task, **build)
    assert caught.value.file == task / "environment" / "docker-compose.yaml"
    return caught.value


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("ssh", ["default"], "SSH agent"),
        ("secrets", [{"source": "token"}], "secrets"),
        ("additional_contexts", {"base": "/elsewhere"}, "named contexts"),
        ("cache_to", ["type=local,dest=/tmp/cache"], "outside the engine"),
        ("privileged", True, "reaches the host"),
        ("entitlements", ["network.host"], "host privileges"),
        ("ulimits", {"nofile": 100}, "classic builder"),
        ("shm_size", "268435456", "BuildKit ignores"),
        ("network", "host", "reaches the host"),
        ("network", "backend", "joins none of the project's networks"),
        ("platforms", ["linux/amd64", "linux/arm64"], "several platforms"),
        ("isolation", "hyperv", "Windows containers"),
        ("no_such_option", "x", "not supported"),
    ],
)
def test_a_build_option_that_cannot_be_honoured_is_refused_by_file_and_key(
    task: Path, key: str, value: object, words: str
) -> None:
    refused = refusal(task, **{key: value})
    assert refused.key == f"services.side.build.{key}"
    assert words in str(refused)


def test_a_dockerfile_outside_the_task_folder_is_refused(task: Path, tmp_path: Path) -> None:
    (tmp_path / "outside.Dockerfile").write_text("FROM busybox:musl\n")
    refused = refusal(task, dockerfile="../../outside.Dockerfile")
    assert refused.key == "services.side.build.dockerfile"
    assert "outside the task folder" in str(refused)
    absolute = refusal(task, dockerfile=str(tmp_path / "outside.Dockerfile"))
    assert absolute.key == "services.side.build.dockerfile"


def test_a_missing_dockerfile_is_refused(task: Path) -> None:
    refused = refusal(task, dockerfile="nope.Dockerfile")
    assert refused.key == "services.side.build.dockerfile"
    assert "nope.Dockerfile is missing" in str(refused)


def test_a_context_outside_the_task_folder_is_refused(task: Path, tmp_path: Path) -> None:
    refused = refusal(task, context=str(tmp_path))
    assert refused.key == "services.side.build.context"


# ---------------------------------------------------------------- the content hash

#: One change to each option that says what the image is.
CHANGES: dict[str, dict[str, Any]] = {
    "dockerfile": {"dockerfile": "stages.Dockerfile"},
    "dockerfile_inline": {"dockerfile_inline": "FROM busybox:musl\n"},
    "args": {"args": {"A": "1"}},
    "args value": {"args": {"A": "2"}},
    "target": {"target": "one"},
    "labels": {"labels": {"k": "v"}},
    "extra_hosts": {"extra_hosts": ["db=10.0.0.2"]},
    "network": {"network": "none"},
    "platforms": {"platforms": ["linux/amd64"]},
}


def test_each_option_that_says_what_the_image_is_changes_its_hash(task: Path) -> None:
    environment = task / "environment"
    tags = {
        name: image_tag_for(environment, options(task, **build)) for name, build in CHANGES.items()
    }
    tags["none"] = image_tag_for(environment)
    assert len(set(tags.values())) == len(tags), tags


def test_the_same_options_share_one_image_and_fetching_flags_do_not_count(task: Path) -> None:
    environment = task / "environment"
    build = {"dockerfile": "stages.Dockerfile", "args": {"A": "1"}, "target": "one"}
    first = options(task, **build)
    assert image_tag_for(environment, first) == image_tag_for(environment, options(task, **build))
    assert image_tag_for(environment, first) == image_tag_for(
        environment, options(task, **build, no_cache=True, pull=True)
    )


def test_a_dockerfile_counts_by_its_content(task: Path) -> None:
    """A Dockerfile outside the context is not in the context's hash: its content is."""
    api = task / "environment" / "api"
    read = check(task, context=str(api), dockerfile="../stages.Dockerfile").builds["side"]
    before = build_hash(api, read.options)
    (task / "environment" / "stages.Dockerfile").write_text("FROM busybox:musl AS two\n")
    assert build_hash(api, read.options) != before


def test_two_services_of_one_context_differ_by_their_options(task: Path) -> None:
    environment = task / "environment"
    config = {
        "services": {
            "main": {
                "build": {
                    "context": str(environment),
                    "dockerfile": "stages.Dockerfile",
                    "target": "one",
                    "args": {"WHO": "main"},
                }
            },
            "side": {
                "build": {
                    "context": str(environment),
                    "dockerfile": "stages.Dockerfile",
                    "target": "one",
                    "args": {"WHO": "side"},
                }
            },
        }
    }
    builds = check_config(task, environment / "docker-compose.yaml", config).builds
    assert image_tag_for(environment, builds["main"].options) != image_tag_for(
        environment, builds["side"].options
    )
    same = dataclasses.replace(builds["side"].options, args=(("WHO", "main"),))
    assert image_tag_for(environment, same) == image_tag_for(environment, builds["main"].options)


# ---------------------------------------------------------------- what the builders get

FULL = BuildOptions(
    args=(("A", "1"), ("B", "")),
    target="one",
    labels=(("k", "v"),),
    extra_hosts=(("db", "10.0.0.2"),),
    network="none",
    platform="linux/amd64",
    no_cache=True,
    pull=True,
)


def test_buildkit_gets_every_option_as_a_flag() -> None:
    flags = buildx_options(FULL, Path("/task/environment/stages.Dockerfile"))
    assert flags == [
        "--file",
        "/task/environment/stages.Dockerfile",
        "--build-arg",
        "A=1",
        "--build-arg",
        "B=",
        "--target",
        "one",
        "--add-host",
        "db:10.0.0.2",
        "--network",
        "none",
        "--platform",
        "linux/amd64",
        "--pull",
    ]
    assert buildx_options(BuildOptions(), None) == []


def test_the_classic_builder_gets_every_option_as_an_argument() -> None:
    arguments = classic_options(FULL, Path("/task/environment/stages.Dockerfile"))
    assert arguments == {
        "dockerfile": "/task/environment/stages.Dockerfile",
        "buildargs": {"A": "1", "B": ""},
        "target": "one",
        "extra_hosts": {"db": "10.0.0.2"},
        "network_mode": "none",
        "platform": "linux/amd64",
        "pull": True,
    }
    assert classic_options(BuildOptions(), None) == {"buildargs": {}, "pull": False}
