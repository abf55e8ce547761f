"""The opensandbox provider when the transport fails under it: a command's stream that
goes quiet or is cut, a download that stalls or breaks, an execd that stops answering.
A command is never run twice and never ends with a status it did not have; what cannot
be known is the engine's failure (no result), never a grade. Served by the fake, which
stalls and cuts on purpose (tests/opensandbox_fake/faults.py)."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Iterator

import docker
import pytest

from pytest_harbor.labels import RUN_LABEL
from pytest_harbor.sandboxes.base import EngineUnreachable, ProviderContext, SandboxSpec
from pytest_harbor.sandboxes.opensandbox import OpenSandboxSandbox, opensandbox_provider
from tests.fixtures import BASE_IMAGE, QUICKSTART, Dataset, run_harbor
from tests.opensandbox_fake import FakeOpenSandbox
from tests.opensandbox_fake.faults import Fault

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(
        bool(os.environ.get("OPENSANDBOX_DOMAIN")), reason="faults are served by the fake"
    ),
]

#: The bounds the tests run under: short, so that a stall shows in seconds.
QUIET_S = 1.5


@pytest.fixture(scope="module")
def fake(docker_client: docker.DockerClient) -> Iterator[FakeOpenSandbox]:
    server = FakeOpenSandbox(docker_client, api_key="stall-key")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch, fake: FakeOpenSandbox) -> Iterator[None]:
    monkeypatch.setenv("OPENSANDBOX_DOMAIN", fake.domain)
    monkeypatch.setenv("OPENSANDBOX_API_KEY", "stall-key")
    yield
    fake.faults.clear()


@pytest.fixture
def sandbox(environ: None) -> Iterator[OpenSandboxSandbox]:
    provider = opensandbox_provider(
        options={"quiet_timeout_s": QUIET_S, "request_timeout_s": 3, "unanswered_timeout_s": 6},
        context=ProviderContext(),
    )
    started = provider.start(
        SandboxSpec(image=BASE_IMAGE, labels={RUN_LABEL: f"stall-{uuid.uuid4().hex[:8]}"})
    )
    yield started
    started.stop()


#: Prints on both streams around a pause, counts its runs in /tmp/runs, ends with 7.
COMMAND = [
    "sh",
    "-c",
    "echo run >> /tmp/runs; printf 'out-A\\n'; printf 'err-B' >&2; sleep 2; "
    "head -c 200000 /dev/zero | tr '\\0' x; printf 'out-C'; exit 7",
]


def _runs(sandbox: OpenSandboxSandbox) -> int:
    return sandbox.exec(["cat", "/tmp/runs"]).stdout.count("run")


@pytest.mark.parametrize("action", ["stall", "cut"])
def test_a_command_whose_stream_fails_ends_with_its_own_status_and_output(
    fake: FakeOpenSandbox, sandbox: OpenSandboxSandbox, action: str
) -> None:
    """The stream fails after the first output (a stall longer than the bound, or a cut
    connection); the command runs on, and its end and whole output come from execd's
    state of it and its copies, without running it again."""
    fault = fake.inject(
        Fault("command", ("/tmp/runs",), action, after=3, seconds=QUIET_S * 4)  # type: ignore[arg-type]
    )
    started = time.monotonic()
    result = sandbox.exec(COMMAND, timeout=60)
    took = time.monotonic() - started
    assert fault.served == 1
    assert result.exit_code == 7, result
    assert result.stdout_bytes == b"out-A\n" + b"x" * 200000 + b"out-C"
    assert result.stderr_bytes == b"err-B"
    assert not result.timed_out
    assert _runs(sandbox) == 1
    # Followed as soon as the stream failed, not when the stall ended.
    assert took < QUIET_S * 4 + 2, took


def test_a_command_past_its_deadline_after_its_stream_failed_is_a_timeout(
    fake: FakeOpenSandbox, sandbox: OpenSandboxSandbox
) -> None:
    command = ["sh", "-c", "echo started; sleep 30"]
    whole = sandbox.exec(command, timeout=3)
    fake.inject(Fault("command", ("sleep 30",), "cut", after=2))
    result = sandbox.exec(command, timeout=3)
    assert result.timed_out and result.exit_code == 137, result
    assert result == whole


@pytest.mark.parametrize("action", ["stall", "cut"])
def test_a_download_that_fails_goes_on_from_where_it_broke(
    fake: FakeOpenSandbox, sandbox: OpenSandboxSandbox, action: str
) -> None:
    # Past the size that comes back in the packing command's output: downloaded.
    content = os.urandom(1_500_000)
    sandbox.upload({"blob": content}, "/srv")
    fault = fake.inject(
        Fault("download", (".pytest-harbor-io/get-",), action, after=500_000, seconds=QUIET_S * 4)  # type: ignore[arg-type]
    )
    assert sandbox.download("/srv/blob") == {"blob": content}
    assert fault.served == 1


def test_an_execd_that_stops_answering_is_the_engines_failure(
    fake: FakeOpenSandbox, sandbox: OpenSandboxSandbox
) -> None:
    """The stream is cut and execd then answers nothing about the command: its end
    cannot be known, and that is the engine's failure (EngineUnreachable, which ends an
    episode with no result), never an exit status."""
    fake.inject(Fault("command", ("sleep 1",), "cut", after=2))
    fake.inject(Fault("status", ("",), "stall", seconds=30, times=100))
    started = time.monotonic()
    with pytest.raises(EngineUnreachable, match="answered nothing"):
        sandbox.exec(["sh", "-c", "echo started; sleep 1"], timeout=60)
    assert time.monotonic() - started < 6 + 30 + 5


def test_a_stalled_read_of_the_verifiers_folder_is_never_a_grade(
    pytester: pytest.Pytester, environ: None, fake: FakeOpenSandbox
) -> None:
    """The oracle passes; reading /logs/verifier afterwards stalls past the bound (the
    stream of the command that packs it, and brings it back when small). The episode
    scores as the verifier said: 1, not `harbor:verifier_tampered`."""
    dataset = Dataset(pytester.path / "quickstart")
    dataset.path.mkdir()
    shutil.copytree(QUICKSTART / "hello-world", dataset.path / "hello-world")
    pack = fake.inject(
        Fault("command", ("Cut at the cap", "/logs/verifier"), "stall", after=2, seconds=8)
    )
    result = run_harbor(
        pytester,
        dataset,
        "--harbor-sandbox=opensandbox",
        f"--harbor-set=sandbox_provider_options.quiet_timeout_s={QUIET_S}",
        "-p",
        "no:cacheprovider",
    )
    assert pack.served == 1
    (row,) = dataset.rows(pytester.path / "out")
    assert (row["reward"], row["failure_kind"]) == (1.0, None), row
    assert result.ret == 0, result.stdout.str()[-2000:]
