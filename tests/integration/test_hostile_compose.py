"""A task's Compose file as an adversary (a dataset fetched by reference is a stranger's
code): every key outside the model of what a Compose file may hold is refused naming the
file and key, before anything of the host is read; what is rewritten instead (a volume's
chosen name, a bind of the task folder) cannot reach the engine's own volume or the task
folder on the host."""

from __future__ import annotations

import json
from pathlib import Path

import docker
import pytest

from pytest_harbor.sandboxes.docker.images import EngineImages
from tests.fixtures import BASE_IMAGE, Dataset, run_harbor

pytestmark = pytest.mark.docker

CANARY = "canary-5b1f0e"
TOML = f'[environment]\ndocker_image = "{BASE_IMAGE}"\n'
MAIN = "services:\n  main:\n"

#: name -> (the Compose file, the key and words its refusal names).
ATTACKS = {
    "cap-add": (MAIN + "    cap_add: [SYS_ADMIN]\n", "services.main.cap_add: cap_add adds"),
    "security-opt": (
        MAIN + "    security_opt: ['seccomp:unconfined']\n",
        "services.main.security_opt: security_opt loosens",
    ),
    "devices": (
        MAIN + "    devices: ['/dev/kmsg:/dev/kmsg']\n",
        "services.main.devices: devices hands the host's devices",
    ),
    "sysctls": (
        MAIN + "    sysctls: {net.ipv4.ip_forward: 1}\n",
        "services.main.sysctls: sysctls sets kernel parameters",
    ),
    "cgroup-parent": (
        MAIN + "    cgroup_parent: /\n",
        "services.main.cgroup_parent: cgroup_parent places",
    ),
    "logging": (
        MAIN + "    logging: {driver: syslog, options: {syslog-address: 'udp://127.0.0.1:514'}}\n",
        "services.main.logging: logging sends",
    ),
    "pid-host": (MAIN + "    pid: host\n", "services.main.pid: host shares a namespace"),
    "ipc-host": (MAIN + "    ipc: host\n", "services.main.ipc: host shares a namespace"),
    "network-host": (
        MAIN + "    network_mode: host\n",
        "services.main.network_mode: host shares a namespace",
    ),
    "network-container": (
        MAIN + "    network_mode: container:pytest-harbor-victim\n",
        "services.main.network_mode: container:pytest-harbor-victim shares a namespace",
    ),
    "network-bridge": (
        MAIN + "    network_mode: bridge\n",
        "services.main.network_mode: bridge shares a namespace",
    ),
    "volumes-from-container": (
        MAIN + "    volumes_from: ['container:pytest-harbor-victim']\n",
        "services.main.volumes_from[0]: container:pytest-harbor-victim is not a service",
    ),
    "driver-opts-bind": (
        MAIN + "    volumes: ['host:/host']\nvolumes:\n  host:\n    driver_opts:\n"
        "      {type: none, o: bind, device: /}\n",
        "volumes.host.driver_opts: driver_opts mounts what its options name",
    ),
    "docker-socket": (
        MAIN + "    volumes: ['/var/run/docker.sock:/var/run/docker.sock']\n",
        "services.main.volumes[0].source: binds /var/run/docker.sock, outside",
    ),
    "secret-host-file": (
        MAIN + "    secrets: [s]\nsecrets:\n  s: {file: /etc/hostname}\n",
        "secrets.s.file: reads /etc/hostname, outside the task folder",
    ),
    "secret-host-variable": (
        MAIN + "    secrets: [s]\nsecrets:\n  s: {environment: HOME}\n",
        "secrets.s.environment: environment reads a variable of this machine",
    ),
    "config-host-file": (
        MAIN + "    configs: [c]\nconfigs:\n  c: {file: ../../../canary.txt}\n",
        "configs.c.file: reads /",
    ),
    "env-file-outside": (
        MAIN + "    env_file: ../../../canary.env\n",
        "services.main.env_file: env_file ../../../canary.env, outside the task folder",
    ),
    "env-file-variable": (
        MAIN + "    env_file: [{path: '${HOME}/canary.env'}]\n",
        "services.main.env_file[0]: env_file '${HOME}/canary.env': a path in the task",
    ),
    "extends-file": (
        MAIN + "    extends: {file: ../../../other.yaml, service: base}\n",
        "services.main.extends.file: extends a service of another file",
    ),
    "include": (
        "include: [../../../other.yaml]\n" + MAIN + "    init: true\n",
        "include: include merges other Compose files",
    ),
    "ipam": (
        MAIN + "    networks: [wide]\nnetworks:\n  wide:\n"
        "    ipam: {config: [{subnet: 10.0.0.0/8}]}\n",
        "networks.wide.ipam: {'config'",
    ),
    "network-driver-opts": (
        MAIN + "    networks: [n]\nnetworks:\n  n:\n"
        "    driver_opts: {com.docker.network.bridge.name: docker0}\n",
        "networks.n.driver_opts: driver_opts sets options of the host's network driver",
    ),
    "owner-label": (
        MAIN + "    labels: {pytest-harbor.owner: 'host:1:0:0:0'}\n",
        "services.main.labels.pytest-harbor.owner: the label pytest-harbor.owner is the engine",
    ),
    "compose-label": (
        "services:\n  main: {}\n  side:\n    image: busybox:musl\n"
        "    labels: {com.docker.compose.service: main}\n",
        "services.side.labels.com.docker.compose.service: the label",
    ),
    "volume-label": (
        MAIN + "    volumes: ['cache:/v']\nvolumes:\n  cache:\n"
        "    labels: {pytest-harbor.cache: tools}\n",
        "volumes.cache.labels.pytest-harbor.cache: the label pytest-harbor.cache",
    ),
    "build-label": (
        MAIN + "    build:\n      context: .\n      labels: {pytest-harbor.run: other}\n",
        "services.main.build.labels.pytest-harbor.run: the label",
    ),
    "unknown-key": (
        MAIN + "    annotations: {a: b}\n",
        "services.main.annotations: annotations is not supported here (supported:",
    ),
    "tools-key": (
        "services:\n  main: {}\n  side:\n    image: busybox:musl\n"
        "    volumes: ['pytest-harbor-tools-5506afae318c5c7c:/t']\n"
        "volumes:\n  pytest-harbor-tools-5506afae318c5c7c: {}\n",
        "volumes.pytest-harbor-tools-5506afae318c5c7c: the name "
        "pytest-harbor-tools-5506afae318c5c7c is the engine's own",
    ),
    "tools-service": (
        "services:\n  main: {}\n  pytest-harbor-tools:\n    image: busybox:musl\n",
        "services.pytest-harbor-tools: the name pytest-harbor-tools is the engine's own",
    ),
    "oom-shield": (
        MAIN + "    oom_score_adj: -1000\n",
        "services.main.oom_score_adj: -1000: only 0 to 1000",
    ),
}


def test_every_key_outside_the_model_is_refused_before_the_host_is_read(
    pytester: pytest.Pytester, harbor_dataset: Dataset
) -> None:
    """One run of every attack beside a fine task: each refused, naming the file and key;
    the fine one passes; no canary of the host (a file, an env_file, another Compose file
    with a variable) reaches what the run wrote."""
    (pytester.path / "canary.txt").write_text(CANARY)
    (pytester.path / "canary.env").write_text(f"LEAK={CANARY}\n")
    Path.home().joinpath("canary.env").write_text(f"LEAK={CANARY}\n")
    (pytester.path / "other.yaml").write_text(
        f"services:\n  base:\n    image: busybox:musl\n    environment: {{LEAK: {CANARY}}}\n"
    )
    for name, (compose, _) in ATTACKS.items():
        task = harbor_dataset.task(name, toml=TOML)
        (task / "environment").mkdir(exist_ok=True)
        (task / "environment" / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\n")
        (task / "environment" / "docker-compose.yaml").write_text(compose)
    harbor_dataset.task("fine", toml=TOML)
    try:
        result = run_harbor(
            pytester,
            harbor_dataset,
            "--harbor-skip-unloadable",
            "--harbor-set=image_pull_retries=0",
        )
    finally:
        Path.home().joinpath("canary.env").unlink()
    result.assert_outcomes(passed=1)
    folder = harbor_dataset.results_folder(pytester.path / "out")
    skipped = json.loads((folder / "skipped.json").read_text())
    assert sorted(skipped) == sorted(ATTACKS)
    for name, (_, words) in ATTACKS.items():
        assert "environment/docker-compose.yaml: " + words in skipped[name], skipped[name]
    for written in (pytester.path / "out").rglob("*"):
        if written.is_file():
            assert CANARY not in written.read_text(errors="replace"), written


def test_a_volume_named_like_the_engines_tools_volume_is_the_episodes_own(
    pytester: pytest.Pytester, harbor_dataset: Dataset, docker_client: docker.DockerClient
) -> None:
    """A Compose volume given the name of the engine's trusted-tools volume, mounted
    read-write in `main`: the name is the episode's own, so the oracle's write lands in
    the episode's volume and the tools every sandbox mounts stay as they were."""
    tools = EngineImages().tools_volume()
    before = docker_client.volumes.get(tools).attrs["CreatedAt"]
    task = harbor_dataset.task(
        "tools-name",
        toml=TOML,
        solve_sh="echo forged > /tv/busybox-sealed && echo forged > /tv/pwned\n",
        test_sh=(
            "if [ -f /tv/pwned ] && [ ! -e /.pytest-harbor/pwned ]; then echo 1; else echo 0; fi"
            " > /logs/verifier/reward.txt\n"
        ),
    )
    (task / "environment").mkdir()
    (task / "environment" / "docker-compose.yaml").write_text(
        f"{MAIN}    volumes: ['tv:/tv']\nvolumes:\n  tv:\n    name: {tools}\n"
    )
    run_harbor(pytester, harbor_dataset).assert_outcomes(passed=1)
    volume = docker_client.volumes.get(tools)
    assert volume.attrs["CreatedAt"] == before
    listing = docker_client.containers.run(
        BASE_IMAGE,
        ["ls", "/t"],
        volumes={tools: {"bind": "/t", "mode": "ro"}},
        remove=True,
        labels={"pytest-harbor.run": "test-tools-listing"},
    )
    assert b"pwned" not in listing


def test_a_variable_named_without_a_value_takes_nothing_from_the_host(
    pytester: pytest.Pytester, harbor_dataset: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`environment: [NAME]` asks Compose for the variable of the environment `up` runs
    in: the host's value never reaches the service (nor does it when host_env allows it
    only for `${NAME}`: the file says `NAME: ${NAME}` then)."""
    monkeypatch.setenv("CANARY_SECRET", CANARY)
    task = harbor_dataset.task(
        "no-value",
        toml=TOML,
        test_sh=(
            'if [ -z "${CANARY_SECRET:-}" ]; then echo 1; else echo 0; fi'
            " > /logs/verifier/reward.txt\n"
        ),
    )
    (task / "environment").mkdir()
    (task / "environment" / "docker-compose.yaml").write_text(
        f"{MAIN}    environment: [CANARY_SECRET]\n"
    )
    run_harbor(pytester, harbor_dataset).assert_outcomes(passed=1)


def test_a_bind_of_the_task_folder_is_read_only(
    pytester: pytest.Pytester, harbor_dataset: Dataset
) -> None:
    """A bind of a folder of the task is made read-only (every episode of the run shares
    the folder): the oracle cannot rewrite the task's files on the host."""
    task = harbor_dataset.task(
        "bind",
        toml=TOML,
        solve_sh="echo changed > /data/file.txt 2>/dev/null; true\n",
        test_sh=(
            'if [ "$(cat /data/file.txt)" = original ]; then echo 1; else echo 0; fi'
            " > /logs/verifier/reward.txt\n"
        ),
        extra_files={"environment/data/file.txt": "original\n"},
    )
    (task / "environment" / "docker-compose.yaml").write_text(
        f"{MAIN}    volumes: ['./data:/data']\n"
    )
    run_harbor(pytester, harbor_dataset).assert_outcomes(passed=1)
    assert (task / "environment" / "data" / "file.txt").read_text() == "original\n"


def test_an_env_file_in_the_task_folder_is_read(
    pytester: pytest.Pytester, harbor_dataset: Dataset
) -> None:
    task = harbor_dataset.task(
        "env-file",
        toml=TOML,
        test_sh=(
            'if [ "$GREETING" = hello ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n'
        ),
        extra_files={"environment/settings.env": "GREETING=hello\n"},
    )
    (task / "environment" / "docker-compose.yaml").write_text(
        f"{MAIN}    env_file: [settings.env]\n"
    )
    run_harbor(pytester, harbor_dataset).assert_outcomes(passed=1)
