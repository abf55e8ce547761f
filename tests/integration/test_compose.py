"""Compose tasks on the real Docker engine and Compose v2: the example dataset with the
oracle and nop, refusals in skipped.json (each naming its file and key, the rest of the run
going on), published ports under parallel episodes, compose_variables, compose_overlay,
resources on main only, labels on everything a project makes, separate verification with
a service's artifact, the reaper taking a killed run's project, and services built with
their own Dockerfile, target and args."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import docker
import pytest

from pytest_harbor.labels import RUN_LABEL, TASK_LABEL
from pytest_harbor.run.reaper import reap_orphans
from pytest_harbor.sandboxes import BuildOptions, make_provider
from pytest_harbor.sandboxes.images import image_tag_for
from tests.fixtures import BASE_IMAGE, REPO_ROOT, Dataset, run_harbor, start_run

pytestmark = pytest.mark.docker


COMPOSE = REPO_ROOT / "example_datasets" / "compose"
PROJECT = "com.docker.compose.project"

#: A sidecar HTTP service serving $TOKEN at /token (busybox by its full path).
API = """\
  api:
    image: busybox:musl
    environment:
      TOKEN: "${API_TOKEN:-default-token}"
    command:
      - /bin/busybox
      - sh
      - -c
      - >-
        /bin/busybox mkdir -p /www && echo "$$TOKEN" > /www/token
        && exec /bin/busybox httpd -f -p 8080 -h /www
    healthcheck:
      test: ["CMD", "/bin/busybox", "wget", "-q", "-O", "/dev/null", "http://127.0.0.1:8080/token"]
      interval: 1s
      retries: 30
"""
MAIN_WAITS = """\
  main:
    depends_on:
      api:
        condition: service_healthy
"""
#: test.sh: reward 1 when the api service's token is $1.
TOKEN_IS = """\
exec 3<>/dev/tcp/api/8080
printf 'GET /token HTTP/1.0\\r\\n\\r\\n' >&3
token=$(sed '1,/^\\r$/d' <&3)
echo "token: $token"
if [ "$token" = "{token}" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


@pytest.fixture
def dataset(harbor_dataset: Dataset) -> Dataset:
    return harbor_dataset


def compose_task(
    dataset: Dataset, name: str, compose: str, *, toml: str | None = None, **kwargs: Any
) -> Path:
    task = dataset.task(
        name,
        toml=toml or f'[environment]\ndocker_image = "{BASE_IMAGE}"\n',
        **kwargs,
    )
    (task / "environment").mkdir(exist_ok=True)
    (task / "environment" / "docker-compose.yaml").write_text(compose)
    return task


def left_by(client: docker.DockerClient, taskset: str) -> list[str]:
    """Containers, networks and volumes of `taskset`'s projects still on the engine."""

    def ours(labels: dict[str, str] | None) -> bool:
        return str((labels or {}).get(TASK_LABEL, "")).startswith(f"{taskset}/")

    found = [
        c.name
        for c in client.containers.list(
            all=True, filters={"label": TASK_LABEL}, ignore_removed=True
        )
        if ours(c.labels)
    ]
    found += [
        n.name
        for n in client.networks.list(filters={"label": TASK_LABEL})
        if ours(n.attrs["Labels"])
    ]
    found += [
        v.name
        for v in client.volumes.list(filters={"label": TASK_LABEL})
        if ours(v.attrs["Labels"])
    ]
    return found


# ---------------------------------------------------------------- the example dataset


@pytest.mark.parametrize("agent", ["oracle", "nop"])
def test_the_compose_examples(
    pytester: pytest.Pytester, docker_client: docker.DockerClient, agent: str
) -> None:
    copy = pytester.path / f"compose-{uuid.uuid4().hex[:8]}"
    shutil.copytree(COMPOSE, copy)
    dataset = Dataset(copy)
    result = run_harbor(pytester, dataset, f"--harbor-agent={agent}", "-n", "2")
    rows = dataset.rows(pytester.path / "out", agent == "oracle")
    assert sorted(row["task_id"] for row in rows) == ["redis-fill", "sidecar-api"]
    if agent == "oracle":
        result.assert_outcomes(passed=2)
    else:
        result.assert_outcomes(failed=2)
        assert all(row["reward"] == 0.0 for row in rows)
    assert left_by(docker_client, dataset.name) == []


# ---------------------------------------------------------------- refusals


def test_bad_compose_files_are_refused_naming_file_and_key(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    bad = {
        "no-parse": ("services: [what", None),
        "no-main": ("services:\n" + API, "[environment]\nbuild_timeout_sec = 60\n"),
        "privileged": ("services:\n  main:\n    privileged: true\n", None),
        "host-bind": ("services:\n  main:\n    volumes:\n      - /etc:/host-etc\n", None),
        "external-volume": (
            "services:\n  main:\n    volumes:\n      - shared:/data\n"
            "volumes:\n  shared:\n    external: true\n",
            None,
        ),
        "missing-image": ("services:\n  db:\n    image: pytest-harbor-no-such-image:1\n", None),
        "build-ssh": (
            "services:\n  main:\n    build:\n      context: .\n      ssh: [default]\n",
            None,
        ),
        "build-outside": (
            "services:\n  main:\n    build:\n      context: .\n"
            "      dockerfile: ../../outside.Dockerfile\n",
            None,
        ),
    }
    for name, (compose, toml) in bad.items():
        compose_task(dataset, name, compose, toml=toml)
    compose_task(dataset, "fine", "services:\n" + MAIN_WAITS + API)
    result = run_harbor(
        pytester, dataset, "--harbor-set=image_pull_retries=0", "--harbor-skip-unloadable"
    )
    result.assert_outcomes(passed=1)
    skipped = json.loads(
        (dataset.results_folder(pytester.path / "out") / "skipped.json").read_text()
    )
    assert sorted(skipped) == sorted(bad)
    compose_file = "environment/docker-compose.yaml"
    expected = {
        "no-parse": "does not parse as Compose",
        "no-main": "services.main: no `main` service",
        "privileged": "services.main.privileged: privileged: True reaches the host",
        "host-bind": "services.main.volumes[0].source: binds /etc, outside the task folder",
        "external-volume": "volumes.shared.external: external volume 'shared'",
        "missing-image": "services.db.image: image pytest-harbor-no-such-image:1 is not on",
        "build-ssh": "services.main.build.ssh: ssh hands this machine's SSH agent",
        "build-outside": "services.main.build.dockerfile: names the Dockerfile",
    }
    for name, words in expected.items():
        assert compose_file in skipped[name] and words in skipped[name], skipped[name]


# ---------------------------------------------------------------- running


def test_published_ports_do_not_collide_across_parallel_episodes(
    pytester: pytest.Pytester, dataset: Dataset, docker_client: docker.DockerClient
) -> None:
    """Two episodes of a task publishing host port 18080 at once: the port is rewritten to
    one the engine picks, so both start."""
    api = API.replace("  api:\n", '  api:\n    ports:\n      - "18080:8080"\n', 1)
    compose_task(
        dataset,
        "ports",
        "services:\n" + MAIN_WAITS + api,
        test_sh=TOKEN_IS.format(token="default-token"),
        solve_sh="sleep 2\n",
    )
    run_harbor(pytester, dataset, "--harbor-repeats=2", "-n", "2").assert_outcomes(passed=2)
    assert left_by(docker_client, dataset.name) == []


def test_compose_variables_fill_what_the_file_leaves_unset(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    compose_task(
        dataset,
        "variables",
        "services:\n" + MAIN_WAITS + API,
        test_sh=TOKEN_IS.format(token="from-settings"),
    )
    run_harbor(
        pytester, dataset, "--harbor-set=compose_variables.API_TOKEN=from-settings"
    ).assert_outcomes(passed=1)


def test_a_compose_file_reads_a_host_variable_only_when_host_env_names_it(
    pytester: pytest.Pytester, dataset: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`${API_TOKEN}` in a stranger's Compose file read any host variable; now only those
    the run's host_env names (the file's default otherwise)."""
    monkeypatch.setenv("API_TOKEN", "from-the-host")
    compose_task(
        dataset,
        "reader",
        "services:\n" + MAIN_WAITS + API,
        test_sh=TOKEN_IS.format(token="default-token"),
    )
    run_harbor(pytester, dataset).assert_outcomes(passed=1)
    allowed = pytester.runpytest(
        f"--harbor-dataset={dataset.path}",
        "--harbor-results-dir=allowed",
        "--harbor-set=host_env=[API_TOKEN]",
    )
    allowed.assert_outcomes(failed=1)
    (row,) = dataset.rows(pytester.path / "allowed")
    seen = (Path(str(row["verifier_logs_dir"])) / "test-stdout.txt").read_text()
    assert "token: from-the-host" in seen


def test_a_compose_overlay_adds_services_and_a_prompt_template(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    """An overlay file turns a plain task into a project with its `api`; the template is
    around the instruction the agent gets (the transcript the verifier reads shows it)."""
    overlay = pytester.path / "overlay.yaml"
    overlay.write_text("services:\n" + MAIN_WAITS + API)
    test_sh = TOKEN_IS.format(token="default-token").replace(
        "if [", 'grep -q "AROUND: Write 1" /logs/agent/trajectory.json && if ['
    )
    dataset.task("plain", test_sh=test_sh)
    config = pytester.path / "harbor.yaml"
    config.write_text(
        "harbor_environment_server:\n  environment_servers:\n    harbor:\n"
        "      compose_overlay:\n"
        f"        files: [{overlay}]\n"
        '        prompt_template: "AROUND: {instruction}"\n'
    )
    run_harbor(pytester, dataset, f"--harbor-config={config}").assert_outcomes(passed=1)


def test_resources_go_to_main_and_labels_to_everything(
    pytester: pytest.Pytester, dataset: Dataset, docker_client: docker.DockerClient
) -> None:
    """[environment] limits (and sandbox_resources_override) are main's; a sidecar keeps
    its own deploy.resources; every container, network and volume carries the run's
    labels."""
    compose = (
        "services:\n  main:\n    volumes:\n      - cache:/cache\n"
        "  side:\n    image: busybox:musl\n"
        '    command: ["/bin/busybox", "sleep", "300"]\n'
        "    deploy:\n      resources:\n        limits:\n          memory: 64M\n"
        "volumes:\n  cache:\n"
    )
    compose_task(
        dataset,
        "limits",
        compose,
        toml=f'[environment]\ndocker_image = "{BASE_IMAGE}"\ncpus = 1\nmemory_mb = 512\n',
        solve_sh="sleep 4; echo 1 > /tmp/answer\n",
    )
    seen: dict[str, Any] = {}

    def watch() -> None:
        deadline = time.monotonic() + 60
        label = f"{TASK_LABEL}={dataset.name}/limits"
        while time.monotonic() < deadline and len(seen) < 4:
            with contextlib.suppress(docker.errors.APIError):
                for container in docker_client.containers.list(
                    filters={"label": label}, ignore_removed=True
                ):
                    seen[container.labels["com.docker.compose.service"]] = container.attrs
                for network in docker_client.networks.list(filters={"label": label}):
                    seen["network"] = network.attrs
                for volume in docker_client.volumes.list(filters={"label": label}):
                    seen["volume"] = volume.attrs
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    run_harbor(
        pytester, dataset, "--harbor-set=sandbox_resources_override.memory_mib=256"
    ).assert_outcomes(passed=1)
    watcher.join()
    assert seen["main"]["HostConfig"]["NanoCpus"] == 1_000_000_000
    assert seen["main"]["HostConfig"]["Memory"] == 256 * 1024 * 1024
    assert seen["side"]["HostConfig"]["Memory"] == 64 * 1024 * 1024
    assert seen["side"]["HostConfig"]["NanoCpus"] == 0
    for what in ("main", "side"):
        assert RUN_LABEL in seen[what]["Config"]["Labels"]
    assert RUN_LABEL in seen["network"]["Labels"] and RUN_LABEL in seen["volume"]["Labels"]
    assert left_by(docker_client, dataset.name) == []


def test_separate_verification_gets_an_artifact_from_a_service(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    compose = (
        "services:\n  report:\n    image: busybox:musl\n"
        '    command: ["/bin/busybox", "sh", "-c", '
        '"/bin/busybox mkdir -p /out && echo from-the-service > /out/report.txt '
        '&& exec /bin/busybox sleep 300"]\n'
    )
    compose_task(
        dataset,
        "artifact",
        compose,
        toml=(
            f'[environment]\ndocker_image = "{BASE_IMAGE}"\n'
            '[verifier]\nenvironment_mode = "separate"\n'
            '[[artifacts]]\nsource = "/out/report.txt"\nservice = "report"\n'
        ),
        test_sh=(
            'if [ "$(cat /out/report.txt)" = from-the-service ]; then echo 1; else echo 0; fi'
            " > /logs/verifier/reward.txt\n"
        ),
    )
    run_harbor(pytester, dataset).assert_outcomes(passed=1)
    row = dataset.rows(pytester.path / "out")[0]
    assert row["verifier_mode"] == "separate"


def test_the_reaper_takes_a_killed_runs_project(
    dataset: Dataset, docker_client: docker.DockerClient
) -> None:
    """A run killed with SIGKILL leaves nothing of its project (containers, network,
    volume): its process's watchdog removes it, and the reaper of a later run whatever
    a watchdog could not (tests/integration/test_crash_safety.py times the watchdog)."""
    compose_task(
        dataset,
        "killed",
        "services:\n  main:\n    volumes:\n      - data:/data\n" + "  side:\n"
        "    image: busybox:musl\n"
        '    command: ["/bin/busybox", "sleep", "300"]\n'
        "volumes:\n  data:\n",
        solve_sh="sleep 300\n",
    )
    run = start_run(dataset)
    try:
        deadline = time.monotonic() + 120
        while len(left_by(docker_client, dataset.name)) < 4:
            assert time.monotonic() < deadline, "the project did not come up"
            assert run.poll() is None, "the run ended early"
            time.sleep(0.2)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    reap_orphans(make_provider("docker"))
    deadline = time.monotonic() + 30
    while left_by(docker_client, dataset.name) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left_by(docker_client, dataset.name) == []


def test_a_one_shot_service_completes_before_main_and_fills_a_named_volume(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    """depends_on `service_completed_successfully`: an init service writes into a named
    volume and exits 0; main starts after it, with the volume mounted."""
    compose = (
        "services:\n"
        "  main:\n    volumes:\n      - seed:/seed\n"
        "    depends_on:\n      init:\n        condition: service_completed_successfully\n"
        "  init:\n    image: busybox:musl\n    volumes:\n      - seed:/seed\n"
        '    command: ["/bin/busybox", "sh", "-c", "echo seeded > /seed/state"]\n'
        "volumes:\n  seed:\n"
    )
    compose_task(
        dataset,
        "one-shot",
        compose,
        test_sh=(
            'if [ "$(cat /seed/state)" = seeded ]; then echo 1; else echo 0; fi'
            " > /logs/verifier/reward.txt\n"
        ),
    )
    run_harbor(pytester, dataset).assert_outcomes(passed=1)


def test_a_no_network_project_reaches_its_services_and_nothing_beyond(
    pytester: pytest.Pytester, dataset: Dataset, docker_client: docker.DockerClient
) -> None:
    """`no-network`: main still reaches its sidecar (the verifier asks it for the token),
    and the project's network is internal (the engine routes nothing beyond it)."""
    compose_task(
        dataset,
        "offline",
        "services:\n" + MAIN_WAITS + API,
        toml=f'[environment]\ndocker_image = "{BASE_IMAGE}"\nnetwork_mode = "no-network"\n',
        test_sh=TOKEN_IS.format(token="default-token"),
        solve_sh="sleep 3\n",
    )
    seen: list[bool] = []

    def watch() -> None:
        label = f"{TASK_LABEL}={dataset.name}/offline"
        deadline = time.monotonic() + 60
        while not seen and time.monotonic() < deadline:
            with contextlib.suppress(docker.errors.APIError):
                seen.extend(
                    n.attrs["Internal"]
                    for n in docker_client.networks.list(filters={"label": label})
                )
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    run_harbor(pytester, dataset).assert_outcomes(passed=1)
    watcher.join()
    assert seen and all(seen), seen


# ---------------------------------------------------------------- builds with options

#: A multi-stage Dockerfile (not named `Dockerfile`): each service builds its own stage,
#: which writes its build arguments to /stage.txt; the last stage is neither's.
STAGES = """\
# {unique}
FROM busybox:musl AS sidecar
SHELL ["/bin/busybox", "sh", "-c"]
ARG GREETING
ARG FROM_DOTENV
RUN echo "side $GREETING $FROM_DOTENV" > /stage.txt
FROM {base} AS agent
ARG WHO
RUN echo "main $WHO" > /stage.txt
FROM {base}
RUN echo "the last stage" > /stage.txt
"""
BUILT_SERVICES = """\
services:
  main:
    build:
      context: .
      dockerfile: stages.Dockerfile
      target: agent
      args:
        WHO: agent
      labels: ["org.example.dataset={unique}"]
    depends_on:
      side:
        condition: service_healthy
  side:
    build:
      context: .
      dockerfile: stages.Dockerfile
      target: sidecar
      args: ["GREETING=hello", "FROM_DOTENV", "UNSET_ANYWHERE"]
      labels:
        org.example.dataset: "{unique}"
    command: ["/bin/busybox", "httpd", "-f", "-p", "8080", "-h", "/"]
    healthcheck:
      test: ["CMD", "/bin/busybox", "wget", "-q", "-O", "/dev/null", "http://127.0.0.1:8080/stage.txt"]
      interval: 1s
      retries: 30
"""
#: test.sh: reward 1 when main is its target stage with its argument, and the sidecar
#: serves what its own stage wrote with its arguments (one from `.env`, one not set).
STAGES_TOOK_EFFECT = """\
main=$(cat /stage.txt)
exec 3<>/dev/tcp/side/8080
printf 'GET /stage.txt HTTP/1.0\\r\\n\\r\\n' >&3
side=$(sed '1,/^\\r$/d' <&3)
echo "main: $main; side: $side"
if [ "$main" = "main agent" ] && [ "$side" = "side hello from-dotenv" ]
then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


@pytest.mark.parametrize("builder", ["buildkit", "classic"])
def test_services_build_their_own_stage_of_a_named_dockerfile_with_their_args(
    pytester: pytest.Pytester, dataset: Dataset, docker_client: docker.DockerClient, builder: str
) -> None:
    """main and a sidecar build one context with another Dockerfile, each its own target
    and args (a map; a list with a name `.env` sets and one nothing sets): two images, each
    its stage, with the file's labels and the run's."""
    unique = dataset.name
    task = compose_task(
        dataset,
        "stages",
        BUILT_SERVICES.format(unique=unique),
        toml="[verifier]\ntimeout_sec = 60\n",
        test_sh=STAGES_TOOK_EFFECT,
        solve_sh="true\n",
        extra_files={
            "environment/stages.Dockerfile": STAGES.format(unique=unique, base=BASE_IMAGE),
            "environment/.env": "FROM_DOTENV=from-dotenv\n",
        },
    )
    ours = {"label": f"org.example.dataset={unique}"}
    try:
        run_harbor(
            pytester, dataset, f"--harbor-set=sandbox_provider_options.builder={builder}"
        ).assert_outcomes(passed=1)
        images = docker_client.images.list(filters=ours)
        assert len(images) == 2, "one image per service: their options differ"
        assert all(RUN_LABEL in image.labels for image in images)
        environment = task / "environment"
        dockerfile = environment / "stages.Dockerfile"
        side = BuildOptions(
            dockerfile=dockerfile,
            args=(("FROM_DOTENV", "from-dotenv"), ("GREETING", "hello")),
            target="sidecar",
            labels=(("org.example.dataset", unique),),
        )
        main = dataclasses.replace(side, args=(("WHO", "agent"),), target="agent")
        tags = {tag for image in images for tag in image.tags}
        assert tags == {f"{image_tag_for(environment, options)}:latest" for options in (side, main)}
    finally:
        for image in docker_client.images.list(filters=ours):
            docker_client.images.remove(image.id, force=True)
    assert left_by(docker_client, dataset.name) == []


#: A sidecar built as Harbor's cookbook builds one: from a folder of its own, whose
#: Dockerfile copies two files into its working directory (`COPY a b .`, which only
#: BuildKit reads as written), served once healthy.
SIDECAR_SERVICES = """\
services:
  main:
    depends_on:
      side:
        condition: service_healthy
  side:
    build:
      context: ./side
      labels: ["org.example.dataset={unique}"]
    command: ["/bin/busybox", "httpd", "-f", "-p", "8080", "-h", "/srv"]
    healthcheck:
      test: ["CMD", "/bin/busybox", "wget", "-q", "-O", "/dev/null", "http://127.0.0.1:8080/b.txt"]
      interval: 1s
      retries: 30
"""


@pytest.mark.parametrize("builder", ["auto", "classic", "buildkit"])
def test_a_sidecar_copying_several_files_into_its_folder_builds_with_every_builder(
    pytester: pytest.Pytester, dataset: Dataset, docker_client: docker.DockerClient, builder: str
) -> None:
    """Harbor builds a Compose task's services with BuildKit; `COPY a b .` builds here too,
    with either builder, and the files land in the folder."""
    unique = dataset.name
    compose_task(
        dataset,
        "sidecar",
        SIDECAR_SERVICES.format(unique=unique),
        toml="[verifier]\ntimeout_sec = 60\n",
        dockerfile=f"FROM {BASE_IMAGE}\n",
        solve_sh="true\n",
        extra_files={
            "environment/side/Dockerfile": (
                f"FROM busybox:musl\nLABEL case={unique}\nWORKDIR /srv\nCOPY a.txt b.txt .\n"
            ),
            "environment/side/a.txt": "a\n",
            "environment/side/b.txt": "b\n",
        },
        test_sh=(
            "exec 3<>/dev/tcp/side/8080\n"
            "printf 'GET /a.txt HTTP/1.0\\r\\n\\r\\n' >&3\n"
            "[ \"$(sed '1,/^\\r$/d' <&3)\" = a ] && echo 1 > /logs/verifier/reward.txt\n"
        ),
    )
    ours = {"label": f"org.example.dataset={unique}"}
    try:
        run_harbor(
            pytester, dataset, f"--harbor-set=sandbox_provider_options.builder={builder}"
        ).assert_outcomes(passed=1)
    finally:
        for image in docker_client.images.list(filters=ours):
            docker_client.images.remove(image.id, force=True)
