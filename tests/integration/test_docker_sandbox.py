"""The docker provider on the real engine: exec, deadlines, files, limits, images, removal."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import docker
import pytest

from pytest_harbor.sandboxes import (
    ImageSource,
    SandboxError,
    SandboxStartError,
    SandboxStatus,
)
from pytest_harbor.sandboxes.docker import DockerProvider, DockerSandbox
from pytest_harbor.sandboxes.images import image_tag_for
from tests.fixtures import BASE_IMAGE, StartSandbox

pytestmark = pytest.mark.docker


def processes(sandbox: DockerSandbox) -> list[str]:
    listing = sandbox.exec(
        ["bash", "-c", "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done"]
    )
    return [line.strip() for line in listing.stdout.splitlines() if line.strip()]


def test_exec_returns_exit_code_and_separate_streams(start: StartSandbox) -> None:
    sandbox = start()
    result = sandbox.exec(["bash", "-c", "echo out; echo err >&2; exit 3"])
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (
        3,
        "out\n",
        "err\n",
        False,
    )
    # The deadline wrapper must not show in what the command printed.
    timed = sandbox.exec(["bash", "-c", "echo out; echo err >&2"], timeout=30)
    assert (timed.exit_code, timed.stdout, timed.stderr) == (0, "out\n", "err\n")


def test_exec_user_workdir_env_and_stdin(start: StartSandbox) -> None:
    sandbox = start(env={"FROM_SPEC": "spec"})
    result = sandbox.exec(
        ["bash", "-c", 'id -un; pwd; echo "$FROM_SPEC $FROM_CALL"; cat'],
        user="nobody",
        workdir="/tmp",
        env={"FROM_CALL": "call"},
        stdin=b"piped in\n",
    )
    assert result.stdout.splitlines() == ["nobody", "/tmp", "spec call", "piped in"]


def test_exec_deadline_kills_the_command_and_its_children(start: StartSandbox) -> None:
    sandbox = start()
    result = sandbox.exec(
        ["bash", "-c", "sleep 301 & sleep 302; echo never"], timeout=1.0, user="nobody"
    )
    assert result.timed_out
    assert result.exit_code != 0
    assert "never" not in result.stdout
    left = [line for line in processes(sandbox) if "sleep 30" in line]
    assert left == []


def test_workdir_and_directories_exist_from_the_start(start: StartSandbox) -> None:
    sandbox = start(workdir="/work/deep/dir", directories={"/logs": 0o755, "/logs/agent": 0o777})
    result = sandbox.exec(["bash", "-c", "pwd; stat -c '%a %U' /logs/agent"])
    assert result.stdout.splitlines() == ["/work/deep/dir", "777 root"]


def test_upload_folder_and_files_then_download(start: StartSandbox, tmp_path: Path) -> None:
    sandbox = start(directories={"/data": 0o755})
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("A")
    (tmp_path / "sub" / "b.sh").write_text("B")
    (tmp_path / "sub" / "b.sh").chmod(0o755)
    sandbox.upload(tmp_path, "/data")
    sandbox.upload({"c.txt": b"C"}, "/data")
    listing = sandbox.exec(
        ["bash", "-c", "cd /data && find . -type f | sort && stat -c %a sub/b.sh"]
    )
    assert listing.stdout.split() == ["./a.txt", "./c.txt", "./sub/b.sh", "755"]
    assert sandbox.download("/data") == {"a.txt": b"A", "c.txt": b"C", "sub/b.sh": b"B"}
    assert sandbox.download("/data/sub/b.sh") == {"b.sh": b"B"}
    assert sandbox.download("/no/such/dir") == {}


def test_limits_labels_and_keepalive(
    start: StartSandbox, docker_client: docker.DockerClient, labels: dict[str, str]
) -> None:
    sandbox = start(cpus=64, memory_mb=256)
    attrs = docker_client.api.inspect_container(sandbox.id)
    engine_cpus = docker_client.info()["NCPU"]
    # More CPUs than the engine has: the sandbox gets them all.
    assert attrs["HostConfig"]["NanoCpus"] == engine_cpus * 10**9
    assert attrs["HostConfig"]["Memory"] == 256 * 1024 * 1024
    assert attrs["HostConfig"]["PidsLimit"] == 4096  # the spec's default
    assert attrs["HostConfig"]["AutoRemove"] is False
    assert attrs["Config"]["Labels"].items() >= labels.items()
    assert attrs["State"]["Running"]


def test_a_pids_limit_caps_the_processes(start: StartSandbox) -> None:
    sandbox = start(pids_limit=64)
    flood = sandbox.exec(
        [
            "bash",
            "-c",
            "sh -c 'for i in $(seq 200); do sleep 60 & done' 2>/dev/null; "
            "n=0; for p in /proc/[0-9]*; do n=$((n + 1)); done; echo $n",
        ],
        user="root",
        timeout=60,
    )
    assert 0 < int(flood.stdout.split()[-1]) <= 64
    assert sandbox.status().running


def test_status_is_the_engines_view(start: StartSandbox) -> None:
    sandbox = start()
    assert sandbox.status() == SandboxStatus(present=True, running=True)
    sandbox.stop()
    assert sandbox.status() == SandboxStatus(present=False)


def test_no_network_leaves_only_loopback(start: StartSandbox) -> None:
    sandbox = start(network=False)
    assert sandbox.exec(["ls", "/sys/class/net"]).stdout.split() == ["lo"]


def test_a_file_not_there_is_an_answer_a_sandbox_not_there_is_an_error(
    start: StartSandbox,
) -> None:
    sandbox = start()
    assert sandbox.read_archive("/no/such/file") is None
    assert sandbox.download("/no/such/folder") == {}
    assert sandbox.iter_archive("/no/such/file") is None
    sandbox.stop()
    # Removed under the run: a verifier's folder must not read as one it left empty.
    for read in (sandbox.read_archive, sandbox.download, sandbox.iter_archive):
        with pytest.raises(SandboxError, match="is gone"):
            read("/logs/verifier")


def test_stop_kills_at_once_and_is_idempotent(
    start: StartSandbox, docker_client: docker.DockerClient
) -> None:
    sandbox = start()
    since = int(time.time()) - 1
    sandbox.stop()
    sandbox.stop()
    events = docker_client.events(
        since=since,
        until=int(time.time()) + 1,
        filters={"container": sandbox.id, "event": "kill"},
        decode=True,
    )
    signals = {event["Actor"]["Attributes"].get("signal") for event in events}
    # Forceful: SIGKILL straight away, never the SIGTERM of a graceful stop.
    assert signals == {"9"}
    assert not docker_client.containers.list(all=True, filters={"id": sandbox.id})
    with pytest.raises(SandboxError):
        sandbox.exec(["true"])


def test_remove_labelled_removes_only_matching(
    start: StartSandbox, docker_client: docker.DockerClient, labels: dict[str, str]
) -> None:
    mine = start()
    other = start(labels={"pytest-harbor.run": f"other-{uuid.uuid4().hex[:8]}"})
    assert DockerProvider().remove_labelled(labels) == 1
    assert not docker_client.containers.list(all=True, filters={"id": mine.id})
    assert docker_client.containers.list(filters={"id": other.id})


def test_prebuilt_image_is_used_and_a_missing_one_explained(docker_client: object) -> None:
    provider = DockerProvider()
    source = ImageSource(docker_image=BASE_IMAGE, context_dir=None, build_timeout_sec=60)
    assert provider.prepare_image(source) == BASE_IMAGE
    missing = ImageSource(
        docker_image="pytest-harbor-missing:1", context_dir=None, build_timeout_sec=60
    )
    with pytest.raises(SandboxStartError, match="pytest-harbor-missing:1 is not on this machine"):
        provider.prepare_image(missing)


def test_build_is_tagged_by_content_and_reused(
    tmp_path: Path, built_images: list[Path], docker_client: docker.DockerClient
) -> None:
    (tmp_path / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nRUN echo {uuid.uuid4().hex} > /nonce && date +%s%N > /built-at\n"
    )
    source = ImageSource(
        docker_image=None,
        context_dir=tmp_path,
        build_timeout_sec=120,
        labels={"pytest-harbor.run": "t"},
    )
    built_images.append(tmp_path)
    tag = DockerProvider().prepare_image(source)
    assert tag == image_tag_for(tmp_path)
    first = docker_client.images.get(tag)
    assert first.labels["pytest-harbor.run"] == "t"
    # A new provider (a later run) finds the image and does not build again.
    assert DockerProvider().prepare_image(source) == tag
    assert docker_client.images.get(tag).id == first.id


def test_build_failure_names_the_dockerfile_and_shows_the_log(
    tmp_path: Path, docker_client: object
) -> None:
    (tmp_path / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nRUN echo about-to-fail && exit 7\n")
    source = ImageSource(docker_image=None, context_dir=tmp_path, build_timeout_sec=120)
    with pytest.raises(SandboxStartError) as caught:
        DockerProvider().prepare_image(source)
    message = str(caught.value)
    assert str(tmp_path / "Dockerfile") in message
    assert "about-to-fail" in message


def test_build_past_its_timeout_is_refused(
    tmp_path: Path, built_images: list[Path], docker_client: docker.DockerClient
) -> None:
    (tmp_path / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nRUN echo {uuid.uuid4().hex} && sleep 60\n"
    )
    built_images.append(tmp_path)
    source = ImageSource(docker_image=None, context_dir=tmp_path, build_timeout_sec=2)
    with pytest.raises(SandboxStartError, match="build_timeout_sec = 2 s"):
        DockerProvider().prepare_image(source)


def test_the_trusted_tools_resist_root_in_the_sandbox(start: StartSandbox) -> None:
    sandbox = start()
    tried = sandbox.exec(
        [
            "bash",
            "-c",
            "touch /.pytest-harbor/x; rm -f /.pytest-harbor/busybox; "
            "mv /.pytest-harbor /elsewhere; umount /.pytest-harbor; "
            "/.pytest-harbor/busybox echo still-here",
        ],
        user="root",
    )
    assert tried.stdout.strip() == "still-here"
    assert "Read-only file system" in tried.stderr


def test_nothing_inside_can_end_the_sandbox(start: StartSandbox) -> None:
    sandbox = start()
    sandbox.exec(["bash", "-c", "kill -9 1; kill -9 -1"], user="root")
    assert sandbox.exec(["true"], user="root").exit_code == 0


def test_the_first_process_ignores_signals_resists_tracing_and_reaps_orphans(
    start: StartSandbox,
) -> None:
    sandbox = start()
    first = sandbox.exec(["bash", "-c", "grep -E '^(Uid|SigIgn)' /proc/1/status"], user="root")
    assert "65533" in first.stdout.splitlines()[0]
    attempts = sandbox.exec(
        [
            "bash",
            "-c",
            "for s in $(seq 1 31); do kill -$s 1 2>/dev/null; done\n"
            # Trace it as root, then as its own user (root may become any user).
            "perl -e 'print syscall(101, 16, 1, 0, 0), \" $!\\n\"'\n"
            "perl -e '$) = $( = 65533; $> = $< = 65533; print syscall(101, 16, 1, 0, 0), "
            '" $!\\n"\'\n'
            # Orphans: each subshell exits at once, leaving its sleep to the first process.
            "for i in $(seq 20); do (sleep 0.1 &); done; sleep 1\n"
            "for p in /proc/[0-9]*; do read -r s < $p/stat; case $s in *') Z '*) echo zombie;; "
            "esac; done\n",
        ],
        user="root",
    )
    assert attempts.stdout.splitlines()[:2] == ["-1 Operation not permitted"] * 2
    assert "zombie" not in attempts.stdout
    assert sandbox.status().running
    assert sandbox.exec(["id", "-u"]).stdout.strip() == "0"  # commands: the image's user


def test_a_command_with_a_deadline_is_the_images_own(start: StartSandbox) -> None:
    """The deadline's wrapper finds a bare command on PATH, not the busybox applet of that
    name."""
    done = start().exec(["ls", "--version"], timeout=30)
    assert done.exit_code == 0
    assert "GNU coreutils" in done.stdout


def test_exec_output_is_kept_within_its_cap(start: StartSandbox) -> None:
    done = start().exec(
        ["bash", "-c", "echo START; head -c 30000000 /dev/zero | tr '\\0' x; echo; echo END"],
        timeout=60,
    )
    assert done.exit_code == 0
    assert len(done.stdout_bytes) <= 8 * 1024 * 1024 + 100
    assert done.stdout.startswith("START\nxxx")
    assert done.stdout.endswith("xxx\nEND\n")
    assert "bytes cut ...]" in done.stdout


def test_a_process_finds_the_tools_volume_without_a_helper_container(
    docker_client: docker.DockerClient,
) -> None:
    """Once made, the trusted tools' volume is found by asking for it: no container is
    made to look inside (it would cost every worker of every run a container)."""
    from pytest_harbor.sandboxes.docker.images import TOOLS_IMAGE, EngineImages

    name = EngineImages().tools_volume()  # made now, or found from an earlier run
    since = int(time.time()) - 1
    assert EngineImages().tools_volume() == name
    until = int(time.time()) + 1
    # Of this tools image (another test makes a tools volume of its own image meanwhile).
    helpers = {
        "type": "container",
        "event": "create",
        "label": "pytest-harbor.cache=tools-helper",
        "image": TOOLS_IMAGE,
    }
    made = list(docker_client.events(since=since, until=until, decode=True, filters=helpers))
    assert made == []
    assert docker_client.volumes.get(f"{name}-ready") is not None


def test_an_exec_the_runtime_could_not_start_is_tried_again(
    start: StartSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No process at all (here: a user the image lacks, as when the runtime cannot make
    the exec's process in a sandbox at its pids cap): tried again, three pauses apart.
    A command that ran and exited 126 is not. (Plain exec: a command channel leaves a
    user it cannot resolve to it, and runs the rest itself.)"""
    sandbox = start()
    calls: list[list[str]] = []
    once = DockerSandbox._exec_once

    def counted(self: DockerSandbox, argv: list[str], *args: object) -> object:
        calls.append(argv)
        return once(self, argv, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(DockerSandbox, "_exec_once", counted)
    monkeypatch.setattr("pytest_harbor.sandboxes.docker.sandbox._NOT_STARTED_PAUSES_S", (0, 0, 0))
    never = sandbox.exec(["true"], user="no-such-user", timeout=10)
    assert never.exit_code == 126 and len(calls) == 4
    calls.clear()
    ran = sandbox.exec(["sh", "-c", "exit 126"], timeout=10)
    assert ran.exit_code == 126 and len(calls) == 1


def test_a_tools_image_without_the_applets_the_engine_runs_is_refused(
    docker_client: docker.DockerClient,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A busybox without `nsenter` could not end an agent's processes as the agent's uid:
    the tools volume is not made from it, and the message names what it lacks."""
    import contextlib
    import io
    import shutil
    import subprocess
    import tarfile

    from pytest_harbor.sandboxes.docker import images

    source = tmp_path / "lister.c"
    source.write_text('#include <stdio.h>\nint main(void) { puts("sh\\ntar\\nkill"); }\n')
    compiler = shutil.which("gcc")
    assert compiler, "gcc builds the stand-in busybox; .ci/setup's machine has it"
    subprocess.run([compiler, "-static", "-o", str(tmp_path / "busybox"), str(source)], check=True)
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as archive:
        archive.add(tmp_path / "busybox", arcname="bin/busybox")
    name = f"pytest-harbor-test-tools:{uuid.uuid4().hex[:8]}"
    repository, tag = name.split(":")
    docker_client.api.import_image_from_data(
        layer.getvalue(),
        repository=repository,
        tag=tag,
        changes=[f"LABEL pytest-harbor.run=test-{tag}"],
    )
    image = docker_client.images.get(name)
    volume = f"pytest-harbor-tools-{image.id.split(':')[-1][:16]}"
    monkeypatch.setattr(images, "TOOLS_IMAGE", name)
    try:
        with pytest.raises(SandboxStartError, match=r"lacks awk, chmod, .*nsenter.*usleep"):
            images.EngineImages().tools_volume()
        with pytest.raises(docker.errors.NotFound):
            docker_client.volumes.get(f"{volume}-ready")
    finally:
        for leftover in (volume, f"{volume}-ready"):
            with contextlib.suppress(docker.errors.NotFound):
                docker_client.volumes.get(leftover).remove(force=True)
        docker_client.images.remove(name, force=True)


def test_sandboxes_with_the_network_cannot_reach_each_other(
    start: StartSandbox, docker_client: docker.DockerClient
) -> None:
    """Two sandboxes of one run on the engine: one serves on a port, the other cannot
    reach it (the engine's default bridge would let it: a task's sandbox could reach
    another episode's services); the server reaches its own."""
    server = start(image="busybox:musl")
    client = start(image="busybox:musl")
    box = "/bin/busybox"
    serve = f"while true; do {box} nc -l -p 8080 -e {box} echo hello; done"
    # Detached, straight through the engine: it serves while the test goes on.
    started = docker_client.api.exec_create(server.id, [box, "sh", "-c", serve])
    docker_client.api.exec_start(started["Id"], detach=True)
    attrs = docker_client.api.inspect_container(server.id)["NetworkSettings"]["Networks"]
    ((network, settings),) = attrs.items()
    assert network == "pytest-harbor-isolated"

    def ask(sandbox: DockerSandbox, address: str) -> str:
        asked = sandbox.exec([box, "sh", "-c", f"{box} nc -w 3 {address} 8080 </dev/null"])
        return asked.stdout.strip()

    deadline = time.monotonic() + 10
    while ask(server, "127.0.0.1") != "hello":
        assert time.monotonic() < deadline, "the server never answered"
        time.sleep(0.2)
    assert ask(client, settings["IPAddress"]) == ""
