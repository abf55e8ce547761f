"""A sandbox's first process on the real engine: it makes the folders and surveys the
sandbox as root before anything else runs, then keeps it alive as its own user and
writes nothing more; an engine whose log cannot be read gets the same by other means."""

from __future__ import annotations

import io
import tarfile
import uuid
from collections.abc import Iterator

import docker
import pytest

from pytest_harbor.engine.processes import SURVEY_SCRIPT, survey
from pytest_harbor.engine.verification import SANDBOX_DIRECTORIES
from pytest_harbor.sandboxes import SandboxSpec
from pytest_harbor.sandboxes.base import KEEPALIVE_USER, ROOT_USER
from pytest_harbor.sandboxes.docker import DockerProvider, DockerSandbox
from pytest_harbor.sandboxes.docker.first_process import (
    FIRST_USER,
    FirstReport,
    first_process,
    read_first_report,
)
from pytest_harbor.sandboxes.docker.provider import _take_first_report
from tests.fixtures import BASE_IMAGE, StartSandbox

pytestmark = pytest.mark.docker

FOLDERS = (
    "for d in /logs /logs/agent /logs/verifier /logs/artifacts /tests /solution; do "
    "stat -c '%n %a %u:%g %F' $d; done"
)


def folders(sandbox: DockerSandbox) -> list[str]:
    return sandbox.exec(["bash", "-c", FOLDERS], user=ROOT_USER).stdout.splitlines()


def expected_folders() -> list[str]:
    return [f"{path} {mode:o} 0:0 directory" for path, mode in SANDBOX_DIRECTORIES.items()]


def test_the_first_process_makes_the_folders_and_keeps_the_survey(start: StartSandbox) -> None:
    sandbox = start(
        directories=SANDBOX_DIRECTORIES,
        start_script=SURVEY_SCRIPT,
        start_arguments=("nobody", "www-data:www-data", "no-such-user"),
    )
    assert folders(sandbox) == expected_folders()
    output = sandbox.start_output()
    assert output is not None
    taken = survey(sandbox, {"nobody", "www-data:www-data", "no-such-user"}, at_start=True)
    by_exec = survey(sandbox, {"nobody", "www-data:www-data", "no-such-user"})
    assert (
        (taken.bash, taken.timeout)
        == (by_exec.bash, by_exec.timeout)
        == (
            "/usr/bin/bash",
            "/usr/bin/timeout",
        )
    )
    assert taken.ids == by_exec.ids == {"nobody": "65534:65534", "www-data:www-data": "33:33"}
    assert sandbox.exec(["stat", "-c", "%u:%g", "/proc/1"]).stdout.strip() == KEEPALIVE_USER
    # The keep-alive and every child of it (the sleep it waits on) were surveyed, so that
    # no end of an agent's processes takes them for the agent's.
    listing = sandbox.exec(
        [
            "bash",
            "-c",
            'for p in /proc/[0-9]*; do read -r l < $p/stat && echo "${p#/proc/} ${l##*) }"; done',
        ],
        user=ROOT_USER,
    ).stdout.splitlines()
    family = {
        line.split()[0] for line in listing if line.split()[0] == "1" or line.split()[2] == "1"
    }
    surveyed = {entry.split(":")[0] for entry in taken.processes}
    assert len(family) >= 2, listing
    assert family <= surveyed, (family, taken.processes)


def test_a_survey_asked_for_other_users_than_the_start_is_taken_by_exec(
    start: StartSandbox,
) -> None:
    sandbox = start(start_script=SURVEY_SCRIPT, start_arguments=("nobody",))
    taken = survey(sandbox, {"nobody", "www-data"}, at_start=True)
    assert taken.ids == {"nobody": "65534:65534", "www-data": "33:33"}


def test_the_first_process_writes_nothing_after_it_is_ready(start: StartSandbox) -> None:
    """A root agent writing to the first process's output gets nowhere: it cannot open it
    (the sealed busybox), and the keep-alive's own output goes to /dev/null."""
    sandbox = start(start_script=SURVEY_SCRIPT)
    api = docker.APIClient()
    before = api.logs(sandbox.id)
    attack = sandbox.exec(
        [
            "bash",
            "-c",
            "echo forged > /proc/1/fd/1; echo $?; ls -l /proc/1/fd/ 2>&1 | head -3; "
            "for p in /proc/[0-9]*; do echo forged > $p/fd/1; done 2>/dev/null; true",
        ],
        user=ROOT_USER,
    )
    assert attack.stdout.splitlines()[0] != "0", attack
    assert api.logs(sandbox.id) == before
    assert b"forged" not in before


def test_a_folder_the_image_holds_as_a_file_or_link_is_made_a_folder(
    docker_client: docker.DockerClient, start: StartSandbox, labels: dict[str, str]
) -> None:
    base = docker_client.containers.create(BASE_IMAGE, ["true"], labels=labels)
    try:
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            logs = tarfile.TarInfo("logs")
            logs.type, logs.linkname = tarfile.SYMTYPE, "/etc"
            tar.addfile(logs)
            tests = tarfile.TarInfo("tests")
            tests.size = 3
            tar.addfile(tests, io.BytesIO(b"abc"))
        base.put_archive("/", archive.getvalue())
        image = base.commit(f"pytest-harbor-test-odd-folders:{uuid.uuid4().hex[:8]}")
    finally:
        base.remove(force=True)
    try:
        sandbox = start(image=image.id, directories=SANDBOX_DIRECTORIES)
        assert folders(sandbox) == expected_folders()
        assert sandbox.exec(["test", "-f", "/etc/passwd"]).exit_code == 0
        sandbox.stop()
    finally:
        docker_client.images.remove(image.id, force=True)


def test_an_engine_whose_log_cannot_be_read_gets_the_folders_through_the_archive_api(
    docker_client: docker.DockerClient, labels: dict[str, str]
) -> None:
    api = docker.APIClient()
    provider = DockerProvider()
    entrypoint, command = first_process(100, {}, SURVEY_SCRIPT)
    created = api.create_container(
        BASE_IMAGE,
        entrypoint=entrypoint,
        command=command,
        user=FIRST_USER,
        labels=labels,
        host_config=api.create_host_config(
            binds={provider.tools_volume(): {"bind": "/.pytest-harbor", "mode": "ro"}},
            log_config={"Type": "none", "Config": {}},
        ),
    )
    sandbox = DockerSandbox(created["Id"])
    try:
        api.start(created["Id"])
        assert read_first_report(api, created["Id"]) is None
        spec = SandboxSpec(
            image=BASE_IMAGE, directories=SANDBOX_DIRECTORIES, start_script=SURVEY_SCRIPT
        )
        _take_first_report(sandbox, spec, api)
        assert sandbox.start_output() is None
        assert folders(sandbox) == expected_folders()
        # The survey then runs by exec.
        assert survey(sandbox, at_start=True).bash == "/usr/bin/bash"
    finally:
        sandbox.stop()


def test_a_first_process_that_cannot_report_fails_the_start_with_a_message(
    labels: dict[str, str],
) -> None:
    api = docker.APIClient()
    created = api.create_container(
        BASE_IMAGE, entrypoint=["sh", "-c", "echo not ours; exit 3"], labels=labels
    )
    try:
        api.start(created["Id"])
        with pytest.raises(Exception, match="ended before it was ready: not ours"):
            read_first_report(api, created["Id"], timeout_s=30)
    finally:
        api.remove_container(created["Id"], force=True)


@pytest.fixture
def quiet_container(labels: dict[str, str]) -> Iterator[str]:
    api = docker.APIClient()
    created = api.create_container(BASE_IMAGE, entrypoint=["sleep", "60"], labels=labels)
    api.start(created["Id"])
    yield created["Id"]
    api.remove_container(created["Id"], force=True)


def test_a_first_process_that_never_reports_times_out(quiet_container: str) -> None:
    with pytest.raises(Exception, match="did not say it was ready within 1 s"):
        read_first_report(docker.APIClient(), quiet_container, timeout_s=1)


def test_the_report_is_read_whatever_the_script_printed() -> None:
    report = FirstReport.parse(
        "bash:/bin/bash\npytest-harbor-first:missing:/logs\n"
        "pytest-harbor-first:status:7\nproc:1:5\npytest-harbor-first:status:x\n"
    )
    assert report == FirstReport("bash:/bin/bash\nproc:1:5\n", -1, ("/logs",))
    assert FirstReport.parse("") == FirstReport("", None, ())
