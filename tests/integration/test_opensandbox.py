"""The opensandbox provider end to end: against the fake server of tests/opensandbox_fake/
(the documented lifecycle and execd APIs over the real Docker engine) with a real
registry on 127.0.0.1; against a real OpenSandbox server instead when OPENSANDBOX_DOMAIN
is set (and OPENSANDBOX_TEST_REGISTRY names a registry it pulls from).

The provider must give what the docker provider gives: commands byte-exact with their
exit status and deadline, users by number, files through its own tools, labels that the
reaper finds, and the grading guarantees for a non-root agent."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import httpx
import pytest

from pytest_harbor.labels import OWNER_LABEL, RUN_LABEL, TASK_LABEL
from pytest_harbor.run.reaper import reap_orphans
from pytest_harbor.sandboxes import SandboxSpec
from pytest_harbor.sandboxes.base import (
    ImageSource,
    ProviderContext,
    SandboxError,
    SandboxStartError,
)
from pytest_harbor.sandboxes.opensandbox import OpenSandboxProvider, opensandbox_provider
from pytest_harbor.sandboxes.opensandbox.images import CLUSTER_SUFFIX
from pytest_harbor.sandboxes.opensandbox.sandbox import OpenSandboxSandbox
from tests.fixtures import BASE_IMAGE, QUICKSTART, Dataset, run_harbor
from tests.integration import test_adversarial as adversarial
from tests.integration import test_hostile_users as hostile_users
from tests.integration import test_process_kills as kills
from tests.opensandbox_fake import FakeOpenSandbox
from tests.registry import LocalRegistry

pytestmark = pytest.mark.docker

REAL_SERVER = os.environ.get("OPENSANDBOX_DOMAIN")


@pytest.fixture(scope="module")
def server(docker_client: docker.DockerClient) -> Iterator[tuple[str, str]]:
    """(domain, key) of the server the tests use: a real one when named, else the fake."""
    if REAL_SERVER:
        yield REAL_SERVER, os.environ.get("OPENSANDBOX_API_KEY", "")
        return
    key = "fake-key-" + uuid.uuid4().hex[:8]
    fake = FakeOpenSandbox(docker_client, api_key=key)
    fake.start()
    try:
        yield fake.domain, key
    finally:
        fake.stop()


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if REAL_SERVER:
        named = os.environ.get("OPENSANDBOX_TEST_REGISTRY")
        if not named:
            pytest.skip("OPENSANDBOX_TEST_REGISTRY names no registry the server pulls from")
        yield named
        return
    local = LocalRegistry()
    local.start(tmp_path_factory.mktemp("registry"))
    try:
        yield local.address
    finally:
        local.stop()
        _remove_pushed_images(local.address)


def _remove_pushed_images(registry: str) -> None:
    """The registry's tags on this engine, and the copies made to push them (named after
    an image the tests built, which built_images removes)."""
    client = docker.from_env()
    try:
        for image in client.images.list():
            for tag in image.tags:
                if tag.startswith(f"{registry}/") or CLUSTER_SUFFIX in tag:
                    with contextlib.suppress(docker.errors.APIError):
                        client.images.remove(tag, force=True)
    finally:
        client.close()


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch, server: tuple[str, str]) -> None:
    domain, key = server
    monkeypatch.setenv("OPENSANDBOX_DOMAIN", domain)
    monkeypatch.setenv("OPENSANDBOX_API_KEY", key)


@pytest.fixture
def provider(environ: None, registry: str) -> OpenSandboxProvider:
    return opensandbox_provider(options={"registry": registry}, context=ProviderContext())


@pytest.fixture
def sandbox(provider: OpenSandboxProvider) -> Iterator[OpenSandboxSandbox]:
    started = provider.start(
        SandboxSpec(
            image=BASE_IMAGE,
            labels={RUN_LABEL: f"test-{uuid.uuid4().hex[:8]}"},
            directories={"/logs/agent": 0o777},
            ttl_s=600,
        )
    )
    yield started
    started.stop()


def test_commands_come_back_byte_exact_with_their_status(sandbox: OpenSandboxSandbox) -> None:
    every_byte = bytes(range(256)) * 3 + b"\r\n\r no newline at the end"
    echoed = sandbox.exec(["cat"], stdin=every_byte, timeout=30)
    assert (echoed.exit_code, echoed.stdout_bytes, echoed.stderr_bytes) == (0, every_byte, b"")
    both = sandbox.exec(["sh", "-c", "printf 'o\\0ut'; printf 'e\\nrr' >&2; exit 7"])
    assert (both.exit_code, both.stdout_bytes, both.stderr_bytes) == (7, b"o\0ut", b"e\nrr")
    signalled = sandbox.exec(["sh", "-c", "kill -9 $$"], timeout=30)
    assert (signalled.exit_code, signalled.timed_out) == (137, False)
    missing = sandbox.exec(["no-such-program"], timeout=30)
    assert missing.exit_code == 127
    big = sandbox.exec(["head", "-c", "3000000", "/dev/urandom"], timeout=60)
    assert len(big.stdout_bytes) == 3_000_000


def test_users_folders_and_environment(sandbox: OpenSandboxSandbox) -> None:
    probe = ["sh", "-c", "id -u; id -g; echo home=$HOME; pwd; echo $ASKED; env | grep -c EXECD"]
    as_nobody = sandbox.exec(probe, user="nobody", workdir="/tmp", env={"ASKED": "a b"})
    assert as_nobody.stdout.split("\n")[:5] == [
        "65534",
        "65534",
        "home=/nonexistent",
        "/tmp",
        "a b",
    ]
    # No command sees execd's token (or its other variables).
    assert as_nobody.stdout.split("\n")[5] == "0"
    assert sandbox.exec(["id", "-u"], user="4242").stdout == "4242\n"
    assert sandbox.exec(["id", "-u"], user="0:0").stdout == "0\n"
    lacking = sandbox.exec(["true"], user="no-such-user")
    assert lacking.exit_code != 0


def test_a_deadline_ends_the_command_and_what_it_started(sandbox: OpenSandboxSandbox) -> None:
    late = sandbox.exec(["sh", "-c", "sleep 300 & sleep 301; echo never"], timeout=2.0)
    assert late.timed_out and b"never" not in late.stdout_bytes
    left = sandbox.exec(["sh", "-c", "ps -eo args 2>/dev/null || cat /proc/[0-9]*/cmdline"])
    assert "sleep 30" not in left.stdout


def test_files_go_in_and_out_as_archives(sandbox: OpenSandboxSandbox, tmp_path: Path) -> None:
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "a.txt").write_bytes(b"alpha")
    (tmp_path / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (tmp_path / "run.sh").chmod(0o755)
    sandbox.exec(["mkdir", "-p", "/work"], user="0:0")
    sandbox.upload(tmp_path, "/work")
    assert sandbox.exec(["/work/run.sh"]).stdout == "ran\n"
    sandbox.exec(["ln", "-s", "/etc/shadow", "/work/folder/link"], user="0:0")
    assert sandbox.download("/work/folder") == {"a.txt": b"alpha"}
    archive = sandbox.read_archive("/work/folder")
    assert archive is not None and b"/etc/shadow" in archive  # the link as a link
    assert sandbox.read_archive("/no/such/path") is None
    assert sandbox.download("/no/such/path") == {}


def test_small_and_large_inputs_and_archives_arrive_whole(sandbox: OpenSandboxSandbox) -> None:
    """A small stdin or archive travels with its command, a large one by a request of its
    own: either arrives byte for byte, and a command's status is its own whether or not
    it reads its stdin."""
    for size in (60_000, 300_000):
        data = os.urandom(size)
        echoed = sandbox.exec(["cat"], stdin=data, timeout=60)
        assert (echoed.exit_code, echoed.stdout_bytes) == (0, data), size
        unread = sandbox.exec(["sh", "-c", "exit 3"], stdin=data, timeout=60)
        assert unread.exit_code == 3, size
        as_nobody = sandbox.exec(["sha256sum"], stdin=data, user="nobody", timeout=60)
        assert as_nobody.stdout.split()[0] == hashlib.sha256(data).hexdigest(), size
    # Several archives at once, small and large, for a command that is not root's.
    files = {f"f{index}": os.urandom(size) for index, size in enumerate((10, 50_000, 200_000))}
    for name, content in files.items():
        sandbox.upload({name: content}, "/tmp")
    summed = sandbox.exec(["sh", "-c", "cd /tmp && sha256sum f0 f1 f2"], user="nobody")
    assert summed.stdout.split()[::2] == [
        hashlib.sha256(content).hexdigest() for content in files.values()
    ]
    assert sandbox.download("/tmp/f2") == {"f2": files["f2"]}


def test_what_travels_with_a_command_is_not_in_its_environment(
    sandbox: OpenSandboxSandbox,
) -> None:
    sandbox.upload({"secret-tests.sh": b"the verifier's own tests\n"}, "/tmp")
    seen = sandbox.exec(["sh", "-c", "env; cat /proc/self/environ"], stdin=b"stdin bytes")
    assert seen.exit_code == 0
    # Neither the variables that carried them nor their contents (stdin's, in base64).
    for leaked in ("PYTEST_HARBOR_EXEC", "c3RkaW4gYnl0ZXM"):
        assert leaked not in seen.stdout, leaked


def test_nothing_but_the_run_drives_a_sandbox_s_execd(
    provider: OpenSandboxProvider, sandbox: OpenSandboxSandbox, server: tuple[str, str]
) -> None:
    domain, key = server
    with httpx.Client(headers={"OPEN-SANDBOX-API-KEY": key}) as client:
        endpoint = client.get(f"http://{domain}/v1/sandboxes/{sandbox.id}/endpoints/44772").json()[
            "endpoint"
        ]
        stranger = client.post(f"http://{endpoint}/command", json={"command": "id"})
    assert stranger.status_code == 401


def test_a_dead_runs_sandboxes_are_reaped_through_the_server(
    provider: OpenSandboxProvider,
) -> None:
    run = f"test-{uuid.uuid4().hex[:8]}"
    # An owner on this host whose process has ended (pid 1's start time never matches).
    from pytest_harbor.run.reaper import owner_of_this_process

    host, _, _, boot, namespace = owner_of_this_process().split(":")
    dead = f"{host}:{2**22 - 1}:1:{boot}:{namespace}"
    orphan = provider.start(
        SandboxSpec(image=BASE_IMAGE, labels={RUN_LABEL: run, OWNER_LABEL: dead})
    )
    alive = provider.start(
        SandboxSpec(image=BASE_IMAGE, labels={RUN_LABEL: run, OWNER_LABEL: owner_of_this_process()})
    )
    try:
        assert {sandbox_id for sandbox_id, _ in provider.labelled(RUN_LABEL)} >= {
            orphan.id,
            alive.id,
        }
        assert dict(provider.labelled(RUN_LABEL))[orphan.id][OWNER_LABEL] == dead
        assert reap_orphans(provider) >= 1
        assert not orphan.status().present
        assert alive.status().running
    finally:
        orphan.stop()
        alive.stop()


@pytest.mark.parametrize("name", ["quickstart", "environments", "multistep"])
def test_the_example_datasets_pass_through_the_oracle(
    pytester: pytest.Pytester, environ: None, registry: str, name: str
) -> None:
    """Every example dataset but the Compose one: built images through the registry, an
    ENTRYPOINT with a healthcheck, a separate verifier, multi-step tasks."""
    source = QUICKSTART.parent / name
    dataset = Dataset(pytester.path / name)
    shutil.copytree(source, dataset.path)
    result = run_harbor(
        pytester,
        dataset,
        "--harbor-sandbox=opensandbox",
        f"--harbor-set=sandbox_provider_options.registry={registry}",
        "-p",
        "no:cacheprovider",
    )
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) > 0 and result.ret == 0, result.stdout.str()[-2000:]


def test_a_built_task_without_a_registry_is_refused_by_name(
    pytester: pytest.Pytester, environ: None, dataset: Dataset
) -> None:
    dataset.task("built", dockerfile=f"FROM {BASE_IMAGE}\n", toml="[agent]\ntimeout_sec = 30\n")
    result = run_harbor(pytester, dataset, "--harbor-sandbox=opensandbox")
    assert "environment.docker_image" in result.stdout.str()
    assert "sandbox_provider_options.registry" in result.stdout.str()


def test_the_attacks_on_grading_score_zero(
    pytester: pytest.Pytester,
    environ: None,
    registry: str,
    dataset: Dataset,
    built_images: list[Path],
) -> None:
    """The docker suites' attacks of a non-root agent on the end of its processes, and of
    a task's image on who the agent runs as, in one run on OpenSandbox: each scores 0,
    unmasked; a user the engine cannot run as is refused."""
    for name, script in {
        "forger": adversarial.FORGER,
        "hopper": adversarial.HOPPER,
        "fake-zombie": kills.FAKE_ZOMBIE,
        "stopper": kills.STOPPER,
    }.items():
        dataset.task(
            name,
            toml=kills.task_toml(user="nobody", verifier_user="nobody"),
            solve_sh=script,
            test_sh=kills.RESETTING,
        )
    for name, (user, steps) in hostile_users.HOSTILE.items():
        task = dataset.task(
            name,
            toml=hostile_users.toml(user),
            dockerfile=f"FROM {BASE_IMAGE}\n{steps}",
            solve_sh=hostile_users.LEAVES_A_WRITER,
            test_sh=hostile_users.RESETTING,
        )
        built_images.append(task / "environment")
    run_harbor(
        pytester,
        dataset,
        "--harbor-sandbox=opensandbox",
        f"--harbor-set=sandbox_provider_options.registry={registry}",
        "-n",
        "2",
    )
    results = pytester.path / "out"
    rows = {str(row["task_id"]): row for row in dataset.rows(results)}
    for name in ("forger", "hopper", "fake-zombie", "stopper", *hostile_users.RAN_AS):
        row = rows[name]
        assert (name, row["reward"], row["mask_sample"]) == (name, 0.0, False), row
    for name, uid in hostile_users.RAN_AS.items():
        kept = Path(str(rows[name]["verifier_logs_dir"])) / "who.txt"
        assert (name, kept.read_text().strip()) == (name, uid)
    failures = {str(row["task_id"]): row for row in dataset.failures(results)}
    assert set(failures) == set(hostile_users.REFUSED)
    for failure in failures.values():
        assert failure["failure_kind"] == "harbor:task_refused", failure


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("OPENSANDBOX_API_KEY", "wrong-key", "OPENSANDBOX_API_KEY"),
        ("OPENSANDBOX_DOMAIN", "127.0.0.1:9", "OPENSANDBOX_DOMAIN"),
    ],
)
def test_a_server_that_will_not_answer_stops_the_run_with_one_message(
    pytester: pytest.Pytester,
    environ: None,
    dataset: Dataset,
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
    value: str,
    words: str,
) -> None:
    if REAL_SERVER:
        pytest.skip("changes the server's address and key")
    monkeypatch.setenv(variable, value)
    dataset.task("any")
    result = run_harbor(pytester, dataset, "--harbor-sandbox=opensandbox")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert words in result.stderr.str()
    assert value not in result.stderr.str() or variable == "OPENSANDBOX_DOMAIN"


def test_naming_a_server_pool_stops_the_run_saying_why(
    pytester: pytest.Pytester, environ: None, provider: OpenSandboxProvider, dataset: Dataset
) -> None:
    """A pooled sandbox's command daemon cannot be this run's alone (docs/opensandbox.md,
    Server pools): the run stops before anything starts, naming the option, and the
    server has no sandbox of the run's."""
    dataset.task("pooled")
    result = run_harbor(
        pytester,
        dataset,
        "--harbor-sandbox=opensandbox",
        '--harbor-set=sandbox_provider_options.pools={"debian:bookworm-slim": "warm"}',
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    said = result.stderr.str()
    assert "sandbox_provider_options: pools: the opensandbox provider does not start" in said
    assert "task executor" in said
    assert not [
        labels
        for _, labels in provider.labelled(TASK_LABEL)
        if labels[TASK_LABEL].startswith(f"{dataset.name}/")
    ]


def test_a_spawned_command_tells_its_exit_code_and_output(sandbox: OpenSandboxSandbox) -> None:
    """As the engine watches an image's ENTRYPOINT: its end, and the tail of what it wrote;
    it does not see execd's token either."""
    spawned = sandbox.spawn(["sh", "-c", "echo boom; env | grep -c EXECD_ACCESS; exit 3"])
    deadline = time.monotonic() + 30
    while spawned.exit_code() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert spawned.exit_code() == 3
    assert spawned.output_tail().split() == ["boom", "0"]


def test_what_is_written_is_there_for_the_next_command_whoever_runs_it(
    sandbox: OpenSandboxSandbox,
) -> None:
    """Archives are unpacked at the start of the next command as root (a command of their
    own before anyone else's); one that cannot be unpacked fails the next command."""
    sandbox.upload({"note.txt": b"for nobody"}, "/tmp")
    assert sandbox.exec(["cat", "/tmp/note.txt"], user="nobody").stdout == "for nobody"
    sandbox.upload({"again.txt": b"for root"}, "/tmp")
    assert sandbox.exec(["cat", "/tmp/again.txt"], user="0:0").stdout == "for root"
    sandbox.upload({"lost.txt": b"nowhere"}, "/no/such/folder")
    with pytest.raises(SandboxError, match="cannot unpack into /no/such/folder"):
        sandbox.exec(["true"], user="0:0")
    assert sandbox.exec(["echo", "on"]).stdout == "on\n"


#: Runs as the agent's user in the background while the engine works: every environment
#: and command line it can read, and every file whose name it finds there under the
#: engine's folders, copied where the test looks.
SNOOPER = r"""
found=/tmp/snooped; : > $found
end=$(( $(date +%s) + 6 ))
while [ "$(date +%s)" -lt $end ]; do
  for p in /proc/[0-9]*; do
    tr '\0' '\n' < $p/environ >> $found 2>/dev/null
    names=$(tr '\0' '\n' < $p/cmdline 2>/dev/null | grep -o '/.pytest-harbor-[a-z]*/[^ ]*')
    for path in $names; do
      cat "$path" >> $found 2>/dev/null
    done
  done
done
"""


def test_an_agent_learns_neither_the_token_nor_the_engines_inputs(
    sandbox: OpenSandboxSandbox,
) -> None:
    """execd's token is in no command's environment; root's stdin waits where only root
    may go, under a name no command line holds (the red team's A1, A2)."""
    sandbox.exec(
        ["sh", "-c", f"nohup sh -c {shlex.quote(SNOOPER)} >/dev/null 2>&1 &"], user="nobody"
    )
    for _ in range(15):
        echoed = sandbox.exec(["cat"], user="0:0", stdin=b"root-only-input-7f3a")
        assert echoed.stdout == "root-only-input-7f3a"
        sandbox.upload({"secret-tests.txt": b"root-only-archive-9c1d"}, "/root")
        sandbox.exec(["true"], user="0:0")
    time.sleep(6.5)
    seen = sandbox.exec(["cat", "/tmp/snooped"], user="0:0").stdout
    assert "root-only-input-7f3a" not in seen
    assert "root-only-archive-9c1d" not in seen
    assert not [
        line
        for line in seen.splitlines()
        if line.startswith("EXECD_ACCESS_TOKEN=") and line != "EXECD_ACCESS_TOKEN="
    ]


def test_a_command_cannot_forge_its_status_or_the_engines_lines(
    sandbox: OpenSandboxSandbox,
) -> None:
    """What a command writes anywhere it can reach is output, never the wrapper's status
    line (the red team's A3, A7)."""
    forge = (
        "for p in /proc/[0-9]*; do for status in '!0' '!pre' '!\u00b2'; do "
        'echo "$status" > $p/fd/1 2>/dev/null; done; done; '
        "(sleep 0.5; for p in /proc/[0-9]*; do echo '!0' > $p/fd/1; done) 2>/dev/null & exit 5"
    )
    for user in ("nobody", "0:0"):
        assert sandbox.exec(["sh", "-c", forge], user=user, timeout=30).exit_code == 5


def test_output_past_the_read_cap_ends_the_command(
    sandbox: OpenSandboxSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("pytest_harbor.sandboxes.output.EXEC_READ_CAP", 4 * 1024 * 1024)
    flood = sandbox.exec(["sh", "-c", "yes flood"], timeout=120)
    assert b"not read past 4194304 bytes" in flood.stdout_bytes
    deadline = time.monotonic() + 10
    while "yes" in sandbox.exec(["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"]).stdout:
        assert time.monotonic() < deadline, "the flood is still running"
        time.sleep(0.2)


def test_a_sandbox_that_cannot_be_set_up_is_refused_and_removed(
    provider: OpenSandboxProvider, built_images: list[Path], tmp_path: Path
) -> None:
    """An image that made the engine's tools folder for a user of its own (who could then
    swap the tools): refused at the start, and nothing of it left."""
    context = tmp_path / "environment"
    context.mkdir()
    (context / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nRUN mkdir /.pytest-harbor && chown 1000 /.pytest-harbor\n"
    )
    built_images.append(context)
    image = provider.prepare_image(
        ImageSource(docker_image=None, context_dir=context, build_timeout_sec=300)
    )
    run = f"test-{uuid.uuid4().hex[:8]}"
    with pytest.raises(SandboxStartError, match=r"/\.pytest-harbor is not root"):
        provider.start(SandboxSpec(image=image, labels={RUN_LABEL: run}))
    assert not [labels for _, labels in provider.labelled(RUN_LABEL) if labels[RUN_LABEL] == run]


def test_a_task_without_the_network_is_refused_by_name(
    pytester: pytest.Pytester, environ: None, dataset: Dataset
) -> None:
    dataset.task(
        "offline",
        toml=f'[environment]\ndocker_image = "{BASE_IMAGE}"\nnetwork_mode = "no-network"\n',
    )
    run_harbor(pytester, dataset, "--harbor-sandbox=opensandbox")
    (failure,) = dataset.failures(pytester.path / "out")
    assert failure["failure_kind"] == "harbor:task_refused"
    assert "network_mode = no-network" in str(failure["failure_reason"])


def test_a_sandbox_from_an_image_built_here_is_no_dead_runs_leftover(
    provider: OpenSandboxProvider, built_images: list[Path], tmp_path: Path
) -> None:
    """A build carries the run and process that made it; a server on this engine runs
    sandboxes as containers with their image's labels. The image goes to the registry
    without them, so a docker run's reaper here does not take the sandbox for a dead
    run's once the builder is gone."""
    from pytest_harbor.run.reaper import owner_of_this_process
    from pytest_harbor.sandboxes.docker import DockerProvider

    host, _, _, boot, namespace = owner_of_this_process().split(":")
    dead = f"{host}:{2**22 - 1}:1:{boot}:{namespace}"
    context = tmp_path / "environment"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nRUN echo built > /built\n")
    built_images.append(context)
    image = provider.prepare_image(
        ImageSource(
            docker_image=None,
            context_dir=context,
            build_timeout_sec=300,
            labels={RUN_LABEL: "an-old-run", OWNER_LABEL: dead},
        )
    )
    alive = {RUN_LABEL: f"test-{uuid.uuid4().hex[:8]}", OWNER_LABEL: owner_of_this_process()}
    sandbox = provider.start(SandboxSpec(image=image, labels=alive))
    try:
        reap_orphans(DockerProvider())
        assert sandbox.status().running
        assert sandbox.exec(["cat", "/built"]).stdout == "built\n"
    finally:
        sandbox.stop()
