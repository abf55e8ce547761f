"""Fixtures for pytest-harbor's own tests: task folders on disk and the Docker engine."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker
import docker.errors
import httpcore  # noqa: F401  (see below)
import pytest

if TYPE_CHECKING:
    from pytest_harbor.sandboxes.docker import DockerSandbox

from tests.model_server import ChatRequest, Reply, ScriptedModel

# httpx imports httpcore when its first client is made. Made inside an in-process pytester
# run, that import would be undone when the run ends (pytester restores sys.modules), and
# httpx would no longer recognise the errors of the httpcore imported next. Imported here,
# before any run, it stays.

#: The base image .ci/setup makes; every sandbox in the tests uses it.
BASE_IMAGE = "debian:bookworm-slim"
#: The `start` fixture (tests/integration/conftest.py): a sandbox from SandboxSpec fields.
StartSandbox = Callable[..., "DockerSandbox"]
REPO_ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = REPO_ROOT / "example_datasets" / "quickstart"

PASSING_TEST = "echo 'checking'; cat /tmp/answer > /logs/verifier/reward.txt\n"
PASSING_SOLUTION = "echo 1 > /tmp/answer\n"


def write_task(
    root: Path,
    name: str,
    *,
    toml: str | None = None,
    test_sh: str = PASSING_TEST,
    solve_sh: str | None = PASSING_SOLUTION,
    dockerfile: str | None = None,
    instruction: str = "Write 1 to /tmp/answer.\n",
    extra_files: dict[str, str] | None = None,
) -> Path:
    """A task folder under `root`; `toml` defaults to a prebuilt-image task."""
    task = root / name
    (task / "tests").mkdir(parents=True)
    if toml is None:
        toml = f'[environment]\ndocker_image = "{BASE_IMAGE}"\n'
    (task / "task.toml").write_text(textwrap.dedent(toml))
    (task / "instruction.md").write_text(instruction)
    (task / "tests" / "test.sh").write_text(test_sh)
    if solve_sh is not None:
        (task / "solution").mkdir()
        (task / "solution" / "solve.sh").write_text(solve_sh)
    if dockerfile is not None:
        (task / "environment").mkdir()
        (task / "environment" / "Dockerfile").write_text(dockerfile)
    for relative, content in (extra_files or {}).items():
        path = task / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return task


@dataclass
class Dataset:
    """A dataset folder in a test's temporary directory, with a name unique to the test
    (tasksets label their containers, so tests running at once never see each other's)."""

    path: Path

    @property
    def name(self) -> str:
        return self.path.name

    def task(self, name: str, **kwargs: object) -> Path:
        return write_task(self.path, name, **kwargs)  # type: ignore[arg-type]

    def taskset_folder(self, results: Path, validation: bool = True) -> Path:
        """The taskset's folder: its runs, `latest`, and what its runs share."""
        return results / "harbor" / ("validation" if validation else "") / self.name

    def results_folder(self, results: Path, validation: bool = True) -> Path:
        """The latest run's folder."""
        return self.taskset_folder(results, validation) / "latest"

    def rows(self, results: Path, validation: bool = True) -> list[dict[str, object]]:
        rows_file = self.results_folder(results, validation) / "rollouts.jsonl"
        return [json.loads(line) for line in rows_file.read_text().splitlines()]

    def failures(self, results: Path, validation: bool = True) -> list[dict[str, object]]:
        failures_file = self.results_folder(results, validation) / "rollouts_failures.jsonl"
        return [json.loads(line) for line in failures_file.read_text().splitlines()]

    def summary(self, results: Path, validation: bool = True) -> dict[str, Any]:
        summary_file = self.results_folder(results, validation) / "rollouts_run_summary.json"
        data: dict[str, Any] = json.loads(summary_file.read_text())
        return data


@pytest.fixture
def dataset(tmp_path: Path) -> Dataset:
    folder = tmp_path / f"ds-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    return Dataset(folder)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    """The engine .ci/setup starts; tests that need it fail (not skip) without it."""
    try:
        client = docker.from_env(version="auto")
        client.ping()
    except docker.errors.DockerException as error:
        pytest.fail(f"no Docker engine answers ({error}); run .ci/setup first", pytrace=False)
    try:
        client.images.get(BASE_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.fail(f"image {BASE_IMAGE} is missing; run .ci/setup first", pytrace=False)
    yield client
    client.close()


def containers_of(client: docker.DockerClient, taskset: str, task: str) -> list[object]:
    """Containers (running or not) that carry the task label of `taskset/task`."""
    label = f"pytest-harbor.task={taskset}/{task}"
    return list(client.containers.list(all=True, filters={"label": label}, ignore_removed=True))


class SandboxWatcher:
    """Records the engine's view (inspect data) of every container carrying `label` while a
    run is under way, so a test can check what the run asked of the engine."""

    def __init__(self, client: docker.DockerClient, label: str) -> None:
        self.client = client
        self.label = label
        self.seen: dict[str, dict[str, object]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> SandboxWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _watch(self) -> None:
        while not self._stop.is_set():
            # Containers come and go while we look: a vanished one is simply not seen.
            with contextlib.suppress(docker.errors.APIError):
                for container in self.client.api.containers(filters={"label": self.label}):
                    if container["Id"] not in self.seen:
                        with contextlib.suppress(docker.errors.APIError):
                            attrs = self.client.api.inspect_container(container["Id"])
                            self.seen[container["Id"]] = attrs
            time.sleep(0.05)


#: Where the engine tests keep their results, relative to the pytester folder.
RESULTS_DIR = "out"


@pytest.fixture
def harbor_dataset(pytester: pytest.Pytester, docker_client: docker.DockerClient) -> Dataset:
    """A dataset inside the pytester folder, so relative paths and results are its own."""
    folder = pytester.path / f"ds-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    return Dataset(folder)


def run_harbor(pytester: pytest.Pytester, dataset: Dataset, *args: str) -> pytest.RunResult:
    """pytest on `dataset` in the pytester folder, results under RESULTS_DIR."""
    return pytester.runpytest(
        f"--harbor-dataset={dataset.path}", f"--harbor-results-dir={RESULTS_DIR}", *args
    )


@pytest.fixture
def built_images(docker_client: docker.DockerClient) -> Iterator[list[Path]]:
    """Build contexts a test makes images from; their images are removed afterwards, so the
    machine keeps only real caches."""
    contexts: list[Path] = []
    yield contexts
    from pytest_harbor.sandboxes.images import image_tag_for

    for context in contexts:
        with contextlib.suppress(docker.errors.ImageNotFound):
            docker_client.images.remove(image_tag_for(context), force=True)


# ---------------------------------------------------------------- runs in a process of their own


def start_run(dataset: Dataset, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            f"--harbor-dataset={dataset.path}",
            "-p",
            "no:cacheprovider",
            *args,
        ],
        cwd=dataset.path.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal gives a command
    )


def wait_for_sandboxes(
    client: docker.DockerClient, dataset: Dataset, tasks: list[str], run: subprocess.Popen[str]
) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if all(containers_of(client, dataset.name, task) for task in tasks):
            return
        if run.poll() is not None:
            pytest.fail(f"the run ended before its sandboxes started:\n{run.stdout.read()}")  # type: ignore[union-attr]
        time.sleep(0.2)
    run.kill()
    pytest.fail("the sandboxes did not start within 120 s")


def finish(run: subprocess.Popen[str]) -> str:
    try:
        output, _ = run.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        # pytest enables faulthandler: SIGABRT prints where every thread was stuck.
        run.send_signal(signal.SIGABRT)
        try:
            output, _ = run.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            run.kill()
            output, _ = run.communicate()
        pytest.fail(f"the run did not end within 120 s of the signal:\n{output}")
    return output


def install_example(package: Path, factory: pytest.TempPathFactory) -> Path:
    """An example package of docs/examples installed with pip into a folder of its own
    (not this virtualenv), for a run in a process of its own to find on PYTHONPATH."""
    target = factory.mktemp("site")
    # Built from a copy: pip leaves build/ and *.egg-info beside the sources it builds.
    source = factory.mktemp("source") / package.name
    shutil.copytree(package, source)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    return target


# ---------------------------------------------------------------- shared by several test modules


def multi_step(
    dataset: Dataset,
    name: str,
    steps: dict[str, tuple[str, str | None]],
    *,
    toml: str = "",
    step_toml: dict[str, str] | None = None,
    shared_test: str | None = None,
    extra_files: dict[str, str] | None = None,
) -> Path:
    """A task whose steps are `name -> (solve.sh, test.sh or None for the shared one)`."""
    task = dataset.path / name
    (task / "tests").mkdir(parents=True)
    (task / "tests" / "test.sh").write_text(shared_test or "echo 1 > /logs/verifier/reward.txt\n")
    tables = "".join(
        f'[[steps]]\nname = "{step}"\n{(step_toml or {}).get(step, "")}\n' for step in steps
    )
    (task / "task.toml").write_text(
        textwrap.dedent(toml)
        + f'\n[environment]\ndocker_image = "{BASE_IMAGE}"\nworkdir = "/work"\n\n'
        + tables
    )
    for step, (solve, test) in steps.items():
        folder = task / "steps" / step
        (folder / "solution").mkdir(parents=True)
        (folder / "instruction.md").write_text(f"Do {step}.\n")
        (folder / "solution" / "solve.sh").write_text(solve)
        if test is not None:
            (folder / "tests").mkdir()
            (folder / "tests" / "test.sh").write_text(test)
    for relative, content in (extra_files or {}).items():
        (task / relative).parent.mkdir(parents=True, exist_ok=True)
        (task / relative).write_text(content)
    return task


#: Starts a scripted Chat Completions server for a test (see model_server).
Server = Callable[[Callable[[ChatRequest], Reply]], ScriptedModel]


@pytest.fixture
def model_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    """Starts a scripted server (stopped after the test) and puts its key where
    shell-agent reads it."""
    servers: list[ScriptedModel] = []

    def start(script: Callable[[ChatRequest], Reply]) -> ScriptedModel:
        server = ScriptedModel(script).__enter__()
        servers.append(server)
        monkeypatch.setenv("HARBOR_MODEL_API_KEY", server.api_key)
        return server

    yield start
    for server in servers:
        server.__exit__(None, None, None)


# ---------------------------------------------------------------- an MCP server's image

#: The build context of the test MCP server (the `mcp` SDK on the base image): a task
#: environment with the same two files gets the same image by content.
MCP_SERVER = REPO_ROOT / "tests" / "data" / "mcp_server"


@pytest.fixture(scope="session")
def mcp_image(docker_client: docker.DockerClient) -> str:
    """The test MCP server's image, built once per machine (it stays, a real cache)."""
    from pytest_harbor.sandboxes.images import build_lock, image_tag_for

    tag = image_tag_for(MCP_SERVER)
    with build_lock(tag):
        try:
            docker_client.images.get(tag)
        except docker.errors.ImageNotFound:
            docker_client.images.build(path=str(MCP_SERVER), tag=tag, rm=True, forcerm=True)
    return tag
