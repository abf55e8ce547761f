"""Several Docker engines behind the docker provider: a run spreads its episodes over two
real engines (the second started by the test), each engine makes or loads the images its
episodes need, the reaper looks at both, and an engine that stops mid-run costs only the
episodes it was running."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import NoReturn

import docker
import docker.errors
import pytest

from pytest_harbor.labels import OWNER_LABEL, RUN_LABEL, TASK_LABEL
from pytest_harbor.run.reaper import owner_of_this_process
from pytest_harbor.sandboxes import ImageSource, SandboxSpec
from pytest_harbor.sandboxes.docker import DockerProvider, Endpoint
from pytest_harbor.sandboxes.docker.watchdog import prepare_helper_image
from pytest_harbor.sandboxes.images import image_tag_for
from tests.fixtures import (
    BASE_IMAGE,
    RESULTS_DIR,
    Dataset,
    finish,
    run_harbor,
    start_run,
)
from tests.integration.test_model_relay import relay_recipe
from tests.model_server import ScriptedModel, answer
from tests.second_engine import FIRST_ENGINE, SecondEngine, image_archive
from tests.ssh_server import SshServer

pytestmark = pytest.mark.docker


@pytest.fixture
def second_engine() -> Iterator[SecondEngine]:
    engine = SecondEngine().start()
    try:
        yield engine
    finally:
        engine.stop()


@pytest.fixture
def tls_engine() -> Iterator[SecondEngine]:
    """A second engine the run reaches over tcp:// with TLS, both sides verified."""
    engine = SecondEngine(tls=True).start()
    try:
        yield engine
    finally:
        engine.stop()


@pytest.fixture
def ssh_engine(second_engine: SecondEngine, monkeypatch: pytest.MonkeyPatch) -> Iterator[SshServer]:
    """The second engine behind an ssh server, reached as ssh://root@127.0.0.1:<port>."""
    pytest.importorskip("paramiko", reason="ssh:// engines need the ssh extra (paramiko)")
    server = SshServer(second_engine.url).start()
    monkeypatch.setenv("PATH", f"{server.client_bin}{os.pathsep}{os.environ['PATH']}")
    try:
        yield server
    finally:
        server.stop()


def hosts(second: SecondEngine, capacity: int = 1) -> str:
    engine: dict[str, object] = {"url": second.url, "capacity": capacity, "name": "second"}
    if second.tcp_url is not None:
        engine.update(url=second.tcp_url, cert_path=str(second.client_tls))
    value = {"hosts": [{"url": FIRST_ENGINE, "capacity": capacity, "name": "first"}, engine]}
    return f"--harbor-set=sandbox_provider_options={json.dumps(value)}"


class TaskWatcher:
    """The tasks whose sandboxes each engine ran while a run was under way."""

    def __init__(self, clients: dict[str, docker.DockerClient], taskset: str) -> None:
        self.clients = clients
        self.taskset = taskset
        self.seen: dict[str, set[str]] = {name: set() for name in clients}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> TaskWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _watch(self) -> None:
        while not self._stop.is_set():
            for name, client in self.clients.items():
                try:
                    found = client.api.containers(all=True, filters={"label": TASK_LABEL})
                except (docker.errors.DockerException, OSError):
                    continue  # an engine that went away sees nothing more
                for container in found:
                    taskset, _, task = container["Labels"][TASK_LABEL].partition("/")
                    if taskset == self.taskset:
                        self.seen[name].add(task)
            time.sleep(0.05)


def test_a_run_spreads_its_episodes_over_two_engines(
    pytester: pytest.Pytester,
    harbor_dataset: Dataset,
    tls_engine: SecondEngine,
    docker_client: docker.DockerClient,
    built_images: list[object],
) -> None:
    tasks = [f"t{index}" for index in range(6)]
    for task in tasks[:-1]:
        harbor_dataset.task(task, solve_sh="sleep 0.5; echo 1 > /tmp/answer\n")
    built = harbor_dataset.task(
        tasks[-1],
        toml="[environment]\n",
        dockerfile=f"FROM {BASE_IMAGE}\nRUN echo built > /built\n",
        solve_sh="cat /built > /dev/null && echo 1 > /tmp/answer\n",
    )
    built_images.append(built / "environment")
    second_engine = tls_engine
    second = second_engine.client()
    # A sandbox left on the second engine by a run whose process is gone.
    owner = owner_of_this_process().split(":")
    owner[1] = "999999"
    # (No registry here: the image the leftover needs comes from the first engine.)
    second.images.load(b"".join(image_archive(docker_client, "busybox:musl")))
    leftover = second.containers.create(
        "busybox:musl", "true", labels={RUN_LABEL: "gone", OWNER_LABEL: ":".join(owner)}
    )
    clients = {"first": docker_client, "second": second}
    with TaskWatcher(clients, harbor_dataset.name) as watcher:
        result = run_harbor(pytester, harbor_dataset, "-n", "2", hosts(second_engine))
    result.assert_outcomes(passed=6)
    # Both engines ran episodes, each engine one at a time (capacity 1), every task once.
    assert watcher.seen["first"] and watcher.seen["second"]
    assert watcher.seen["first"] | watcher.seen["second"] == set(tasks)
    # The second engine made or loaded what its episodes needed; nothing of the run stays.
    assert second.images.get(BASE_IMAGE)
    for task in watcher.seen["second"]:
        if task == tasks[-1]:
            assert second.images.get(image_tag_for(built / "environment"))
    assert second.containers.list(all=True, filters={"label": TASK_LABEL}) == []
    with pytest.raises(docker.errors.NotFound):
        leftover.reload()  # the reaper looked at the second engine too
    rows = harbor_dataset.rows(pytester.path / RESULTS_DIR)
    assert sorted(row["task_id"] for row in rows) == tasks


def test_an_engine_that_stops_mid_run_costs_only_its_episodes(
    harbor_dataset: Dataset,
    second_engine: SecondEngine,
    docker_client: docker.DockerClient,
) -> None:
    tasks = [f"slow{index}" for index in range(5)]
    for task in tasks:
        harbor_dataset.task(task, solve_sh="sleep 4; echo 1 > /tmp/answer\n")
    second = second_engine.client()
    clients = {"first": docker_client, "second": second}
    with TaskWatcher(clients, harbor_dataset.name) as watcher:
        run = start_run(harbor_dataset, "-n", "2", hosts(second_engine), "-v")
        deadline = time.monotonic() + 120
        while not watcher.seen["second"] and time.monotonic() < deadline:
            assert run.poll() is None, run.stdout.read()  # type: ignore[union-attr]
            time.sleep(0.1)
        time.sleep(1.0)  # its solve.sh is running
        second_engine.stop()
        stopped_at = time.monotonic()
        output = finish(run)
    on_second = watcher.seen["second"]
    assert on_second, output
    # The episodes the second engine had (the one it was running, and any placed on it
    # while it shut down) have no result, and --harbor-resume runs them again.
    folder = harbor_dataset.results_folder(harbor_dataset.path.parent / "results")
    failures = [
        json.loads(line) for line in (folder / "rollouts_failures.jsonl").read_text().splitlines()
    ]
    lost = {row["task_id"]: row for row in failures}
    assert set(lost) == on_second, output
    for row in lost.values():
        assert row["failure_kind"] == "harbor:sandbox_lost", output
        assert row["retry"] is True
    # Every other episode ran on the first engine, and passed; once the second engine was
    # gone, the run went on without it.
    rows = [json.loads(line) for line in (folder / "rollouts.jsonl").read_text().splitlines()]
    assert {row["task_id"] for row in rows} == set(tasks) - on_second, output
    assert all(row["reward"] == 1.0 for row in rows)
    assert len(rows) >= 3
    assert watcher.seen["first"] >= set(tasks) - on_second
    assert "stopped answering" in output
    assert time.monotonic() - stopped_at < 60


def test_commands_over_tls_behave_as_over_a_socket(tls_engine: SecondEngine) -> None:
    assert tls_engine.tcp_url is not None
    first = DockerProvider()
    engine = DockerProvider(
        endpoint=Endpoint(tls_engine.tcp_url, cert_path=str(tls_engine.client_tls))
    )
    engine.peers = [first]
    image = engine.prepare_image(
        ImageSource(docker_image=BASE_IMAGE, context_dir=None, build_timeout_sec=120)
    )
    sandbox = engine.start(SandboxSpec(image=image, labels={RUN_LABEL: "tls-test"}))
    try:
        data = bytes(range(256)) * 4096  # 1 MiB, every byte value
        echoed = sandbox.exec(["sh", "-c", "cat; echo done >&2"], stdin=data, timeout=60)
        assert (echoed.exit_code, echoed.stdout_bytes, echoed.stderr) == (0, data, "done\n")
        started = time.monotonic()
        stuck = sandbox.exec(["sh", "-c", "sleep 30 & sleep 30"], timeout=1)
        assert stuck.timed_out and time.monotonic() - started < 10
        # The whole process group went with it.
        # (Killed orphans stay zombies: the keep-alive, busybox's sleep, reaps none.)
        live = "cat /proc/[0-9]*/stat | grep -v ') Z ' | grep -c '(sleep)' || true"
        assert sandbox.exec(["sh", "-c", live]).stdout.strip() == "0"
        sandbox.upload({"a.txt": b"over tls\n"}, "/tmp")
        assert sandbox.download("/tmp/a.txt") == {"a.txt": b"over tls\n"}
    finally:
        sandbox.stop()


def test_a_run_reaches_an_engine_over_ssh(
    pytester: pytest.Pytester,
    harbor_dataset: Dataset,
    second_engine: SecondEngine,
    ssh_engine: SshServer,
    docker_client: docker.DockerClient,
) -> None:
    tasks = [f"s{index}" for index in range(4)]
    for task in tasks:
        # Input on stdin (the oracle's solution goes in as a tar stream) and a timeout.
        harbor_dataset.task(task, solve_sh="sleep 0.5; echo 1 > /tmp/answer\n")
    value = {
        "hosts": [
            {"url": FIRST_ENGINE, "capacity": 1, "name": "first"},
            {"url": ssh_engine.url, "capacity": 1, "name": "over-ssh"},
        ]
    }
    clients = {"first": docker_client, "second": second_engine.client()}
    with TaskWatcher(clients, harbor_dataset.name) as watcher:
        result = run_harbor(
            pytester,
            harbor_dataset,
            "-n",
            "2",
            f"--harbor-set=sandbox_provider_options={json.dumps(value)}",
        )
    result.assert_outcomes(passed=4)
    assert watcher.seen["second"], "no episode went over ssh"
    assert watcher.seen["first"] | watcher.seen["second"] == set(tasks)


def test_an_engine_named_by_docker_host_over_tls(
    tls_engine: SecondEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Named the docker CLI's way, not in the options: the same TLS handling (its own CA,
    # not the machine's bundle) and the same input handling apply.
    from pytest_harbor.sandboxes.docker.engine import Engine

    assert tls_engine.tcp_url is not None
    monkeypatch.setenv("DOCKER_HOST", tls_engine.tcp_url)
    monkeypatch.setenv("DOCKER_TLS_VERIFY", "1")
    monkeypatch.setenv("DOCKER_CERT_PATH", str(tls_engine.client_tls))
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    engine = Engine()
    assert engine.api.ping() and engine.tunnelled
    assert not Engine(Endpoint(FIRST_ENGINE)).tunnelled


def test_requests_over_the_socket_do_not_read_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The removal of a sandbox runs in a thread while pytest sets and deletes
    PYTEST_CURRENT_TEST: a request that read the environment for proxies could meet a key
    gone between listing and reading it (KeyError). Over a unix socket none is read."""
    from pytest_harbor.sandboxes.docker.engine import Engine

    engine = Engine()

    class Changing(dict[str, str]):
        def items(self) -> NoReturn:
            raise KeyError("PYTEST_CURRENT_TEST")

        keys = __iter__ = items

    monkeypatch.setattr(os, "environ", Changing(os.environ))
    assert engine.api.ping() is True
    assert engine.api.containers(filters={"label": "pytest-harbor.run=none"}) == []


def test_a_killed_runs_sandboxes_on_a_remote_engine_go_with_its_watchdog(
    harbor_dataset: Dataset, tls_engine: SecondEngine, docker_client: docker.DockerClient
) -> None:
    """Over tcp:// with TLS, the engine named `socket` on its machine: a run killed with
    SIGKILL leaves nothing there, with no later run."""
    assert tls_engine.tcp_url is not None
    remote = tls_engine.client()
    for image in (BASE_IMAGE, "busybox:musl", prepare_helper_image()):
        remote.images.load(b"".join(image_archive(docker_client, image)))
    for number in range(2):
        harbor_dataset.task(f"hold{number}", solve_sh="sleep 300\n")
    engine = {
        "url": tls_engine.tcp_url,
        "cert_path": str(tls_engine.client_tls),
        "socket": str(tls_engine.socket),
        "capacity": 2,
        "name": "remote",
    }
    run = start_run(
        harbor_dataset,
        "-n",
        "2",
        f"--harbor-set=sandbox_provider_options={json.dumps({'hosts': [engine]})}",
    )
    try:
        deadline = time.monotonic() + 120
        while len(remote.containers.list(filters={"label": TASK_LABEL}, ignore_removed=True)) < 2:
            assert run.poll() is None, run.stdout.read()  # type: ignore[union-attr]
            if time.monotonic() > deadline:
                os.killpg(run.pid, signal.SIGKILL)
                pytest.fail(f"the sandboxes did not start:\n{run.communicate()[0][-4000:]}")
            time.sleep(0.2)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    deadline = time.monotonic() + 20
    while remote.containers.list(all=True, filters={"label": TASK_LABEL}, ignore_removed=True):
        assert time.monotonic() < deadline, "a killed run's sandboxes are still there 20 s on"
        time.sleep(0.5)


def test_a_cli_agent_reaches_the_relay_from_either_engine(
    pytester: pytest.Pytester,
    harbor_dataset: Dataset,
    second_engine: SecondEngine,
    docker_client: docker.DockerClient,
    model_server: Callable[..., ScriptedModel],
) -> None:
    """Each engine's sandboxes reach the model relay on this machine at their own bridge's
    gateway (with the network) or through their egress (without it), and hold a token,
    never the key: every episode, on either engine, solves its task through the relay."""
    offline = f'[environment]\ndocker_image = "{BASE_IMAGE}"\nnetwork_mode = "no-network"\n'
    tasks = [f"t{index}" for index in range(4)]
    for index, task in enumerate(tasks):
        toml = offline if index % 2 else f'[environment]\ndocker_image = "{BASE_IMAGE}"\n'
        harbor_dataset.task(task, toml=toml, instruction="solve\n")
    server = model_server(lambda request: answer("echo 1 > /tmp/answer"))
    recipe = relay_recipe(pytester.path)
    clients = {"first": docker_client, "second": second_engine.client()}
    with TaskWatcher(clients, harbor_dataset.name) as watcher:
        result = run_harbor(
            pytester,
            harbor_dataset,
            "-n",
            "2",
            hosts(second_engine),
            f"--harbor-agent={recipe}",
            f"--harbor-model={server.model}",
            f"--harbor-model-url={server.url}",
        )
    result.assert_outcomes(passed=4)
    assert watcher.seen["second"], "no episode ran on the second engine"
    assert len(server.requests) == 4
    assert server.api_key not in result.stdout.str()
