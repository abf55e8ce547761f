"""Attacks on the grading guarantees of the opensandbox provider, against the fake
server of tests/opensandbox_fake/ (its faults stand for the stalls seen on a real
server; its egress emulation for the sidecar in dns+nft mode).

What is attacked:

- The copies each command's wrapper keeps in /.pytest-harbor-out, read back when the
  command's stream fails. Their names are secret (128 random bits) until the command
  runs, but its `tee -a -- /.pytest-harbor-out/<name>.1` shows the name in
  /proc/PID/cmdline, which any process may read. A non-root agent owns its own copies
  in a sticky folder, so it may replace them: with a link to a file only root may read,
  or with a folder. Another user's copy is therefore read back as that user: the link
  leads nowhere it may not go, and a copy that cannot be read is the command's lost
  output, never the engine's failure.
- The same names of root's commands, learnt while they run: they stay root's alone.
- A phase without the network: a connection opened while the sandbox had the network
  carries on after the policy took it away (the sidecar lets answers to connections
  out through, and nothing ends the connections already open): a known limit, marked.

Each test asserts the guarantee: it fails while the attack works.
"""

from __future__ import annotations

import base64
import os
import shlex
import time
import uuid
from collections.abc import Iterator

import docker
import pytest

from pytest_harbor.labels import RUN_LABEL
from pytest_harbor.sandboxes.base import (
    TRUSTED_BUSYBOX,
    EngineUnreachable,
    ProviderContext,
    SandboxError,
    SandboxSpec,
)
from pytest_harbor.sandboxes.opensandbox import OpenSandboxSandbox, opensandbox_provider
from tests.fixtures import BASE_IMAGE
from tests.opensandbox_fake import FakeOpenSandbox
from tests.opensandbox_fake.faults import Fault

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(
        bool(os.environ.get("OPENSANDBOX_DOMAIN")),
        reason="faults and listeners are the fake's and this machine's",
    ),
]

RUN = f"red-{uuid.uuid4().hex[:8]}"
#: Short bounds, so that a stall shows in seconds (as test_opensandbox_stalls.py).
QUIET_S = 1.5
UNANSWERED_S = 6

# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def fake(docker_client: docker.DockerClient) -> Iterator[FakeOpenSandbox]:
    server = FakeOpenSandbox(docker_client, api_key="red-key")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def sandbox(monkeypatch: pytest.MonkeyPatch, fake: FakeOpenSandbox) -> Iterator[OpenSandboxSandbox]:
    monkeypatch.setenv("OPENSANDBOX_DOMAIN", fake.domain)
    monkeypatch.setenv("OPENSANDBOX_API_KEY", "red-key")
    provider = opensandbox_provider(
        options={
            "quiet_timeout_s": QUIET_S,
            "request_timeout_s": 3,
            "unanswered_timeout_s": UNANSWERED_S,
        },
        context=ProviderContext(),
    )
    started = provider.start(SandboxSpec(image=BASE_IMAGE, labels={RUN_LABEL: RUN}, ttl_s=600))
    try:
        yield started
    finally:
        fake.faults.clear()
        started.stop()


# ------------------------------------------------------- the agent's own kept copies

#: As the agent: its own command's copy of stdout (`$1` is `1`, stderr's `2`) found by
#: the name its relay's tee shows to anyone in /proc/PID/cmdline, then replaced by what
#: `$2` makes of the path (`$2 PATH`). Prints `swapped` once done.
SWAP_OWN_COPY = r"""
me=$(id -u)
for p in /proc/[0-9]*; do
  [ "$(stat -c %u "$p" 2>/dev/null)" = "$me" ] || continue
  line=$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null) || continue
  case $line in
    *"tee -a -- /.pytest-harbor-out/"*".$1 "*)
      copy=${line##*tee -a -- }; copy=${copy%% *}
      rm -f -- "$copy" && $2 "$copy" && echo swapped && break ;;
  esac
done
sleep 2
# red-team-own-copy
"""


def _stall_own_command(fake: FakeOpenSandbox) -> Fault:
    """The next command of the attack's stalls after its start (init and first ping):
    everything it sends is held past the quiet bound, as a stalled proxy holds it."""
    return fake.inject(
        Fault("command", ("red-team-own-copy",), "stall", after=2, seconds=QUIET_S * 6)
    )


def test_a_stall_does_not_hand_the_agent_a_root_only_file_through_its_own_copy(
    fake: FakeOpenSandbox, sandbox: OpenSandboxSandbox
) -> None:
    """A non-root agent tries to read a file only root may read.

    The agent's command learns its own copy's name from its relay's command line,
    removes the copy (its own file, in a sticky folder anyone may write in) and puts a
    link to /root/secret there. When the command's stream stalls, a copy read back as
    root by path would follow the link; the provider reads another user's copy as that
    user, so the link leads to a file it may not read."""
    secret = b"TOP-SECRET-of-root-42\n"
    sandbox.exec(
        [
            "sh",
            "-c",
            'umask 077; printf %s "$1" > /root/secret',
            "sh",
            base64.b64encode(secret).decode(),
        ],
        user="0:0",
    )
    denied = sandbox.exec(["cat", "/root/secret"], user="nobody")
    assert denied.exit_code != 0, "nobody may not read /root/secret"
    fault = _stall_own_command(fake)
    result = sandbox.exec(
        ["sh", "-c", SWAP_OWN_COPY, "sh", "1", "ln -s /root/secret"], user="nobody", timeout=60
    )
    assert fault.served == 1
    assert b"TOP-SECRET-of-root" not in result.stdout_bytes, result


def test_an_agent_s_own_copy_cannot_turn_a_stall_into_the_engine_s_failure(
    fake: FakeOpenSandbox, sandbox: OpenSandboxSandbox
) -> None:
    """What the agent did to its own files must not become "the engine could not be
    reached" (EngineUnreachable: the episode ends with no result, harbor:sandbox_lost,
    instead of being the agent's doing).

    The agent replaces its own copy with a folder. Downloaded, a folder breaks each time
    it is asked for until the unanswered bound; read as the agent's user, it cannot be
    read, and the command ends with its status and a note that its output was lost."""
    fault = _stall_own_command(fake)
    try:
        result = sandbox.exec(
            ["sh", "-c", SWAP_OWN_COPY, "sh", "1", "mkdir"], user="nobody", timeout=60
        )
    except EngineUnreachable as error:
        pytest.fail(f"the agent's own folder made a stall the engine's failure: {error}")
    except SandboxError:
        result = None  # a failure the sandbox is blamed for: the guarantee holds
    assert fault.served == 1
    assert result is None or result.exit_code is not None


# --------------------------------------------------------------- root's kept copies

#: As the agent, in the background: every copy name a root relay shows (its tee's
#: command line) is attacked at once: written to, removed, replaced by a link to a
#: file of the agent's holding a forged stdout and status line.
ROOT_COPY_WATCHER = r"""
forged=/tmp/forged
printf '%s\n' "$(printf 'forged-output' | base64)" '!00000000000000000000000000000000 0' > $forged
end=$(( $(date +%s) + 20 ))
while [ "$(date +%s)" -lt "$end" ]; do
  for p in /proc/[0-9]*; do
    [ "$(stat -c %u "$p" 2>/dev/null)" = 0 ] || continue
    line=$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null) || continue
    case $line in
      *"tee -a -- /.pytest-harbor-out/"*)
        copy=${line##*tee -a -- }; copy=${copy%% *}
        echo "$copy" >> /tmp/learnt
        cat "$forged" >> "$copy" 2>/dev/null
        rm -f -- "$copy" 2>/dev/null && ln -s "$forged" "$copy" 2>/dev/null ;;
    esac
  done
done
"""


def test_root_s_copies_stay_root_s_even_when_an_agent_learns_their_names(
    fake: FakeOpenSandbox, sandbox: OpenSandboxSandbox
) -> None:
    """GUARANTEE HELD: the names of root's copies leak (an agent's watcher reads them off
    the relays' command lines while root's command runs), but the copies are root's
    (0600) in a sticky folder: the agent can neither write nor replace them, and a
    stalled root command reads back its own output and status."""
    sandbox.exec(
        ["sh", "-c", f"nohup sh -c {shlex.quote(ROOT_COPY_WATCHER)} >/dev/null 2>&1 &"],
        user="nobody",
    )
    time.sleep(1)
    fault = fake.inject(
        Fault("command", ("red-team-root-copy",), "stall", after=2, seconds=QUIET_S * 6)
    )
    result = sandbox.exec(
        ["sh", "-c", "sleep 3; echo genuine; exit 3 # red-team-root-copy"],
        user="0:0",
        timeout=60,
    )
    assert fault.served == 1
    learnt = sandbox.exec(["cat", "/tmp/learnt"], user="0:0").stdout
    assert ".pytest-harbor-out/" in learnt, "the watcher learnt no name: the attack did not run"
    assert (result.exit_code, result.stdout) == (3, "genuine\n"), result


# ------------------------------------------------------------------------- network


@pytest.fixture(scope="module")
def egress_fake(docker_client: docker.DockerClient) -> Iterator[FakeOpenSandbox]:
    server = FakeOpenSandbox(docker_client, api_key="red-egress-key", egress_mode="dns+nft")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def echo_server(docker_client: docker.DockerClient) -> Iterator[str]:
    """A listener on the default bridge that sends back each line it is sent, on a
    connection that stays open: its address."""
    container = docker_client.containers.run(
        "busybox:musl",
        ["/bin/busybox", "nc", "-ll", "-p", "8080", "-e", "/bin/busybox", "cat"],
        detach=True,
        labels={RUN_LABEL: RUN},
        network_mode="bridge",
    )
    try:
        container.reload()
        yield container.attrs["NetworkSettings"]["IPAddress"]
    finally:
        container.remove(force=True)


@pytest.mark.xfail(
    strict=True,
    reason="a known limit (docs/opensandbox.md): a connection open when a phase loses its "
    "network lives on; only processes that outlive a phase (a root agent's, the image's "
    "ENTRYPOINT) can hold one, and a non-root agent's end before every change",
)
def test_a_connection_opened_in_an_allow_listed_phase_ends_with_its_network(
    monkeypatch: pytest.MonkeyPatch, egress_fake: FakeOpenSandbox, echo_server: str
) -> None:
    """A phase without the network still reaches out (a known limit: xfail).

    A process of the sandbox (root here: a root agent, or a task's ENTRYPOINT, whose
    processes outlive a phase) opens a connection to a host its phase's allow-list
    names, and keeps it. The next phase has no network: the provider replaces the
    egress policy, and new connections are refused, but the sidecar lets through
    "answers to connections out" (conntrack's ESTABLISHED, both ways) and nothing ends
    the connections already open, so the process goes on talking to the outside through
    the whole phase. (From a first phase with the whole network the fake's namespace
    tracked no connection yet, and the flow was cut; a sidecar that tracks from the
    start lets that one through as well.)"""
    monkeypatch.setenv("OPENSANDBOX_DOMAIN", egress_fake.domain)
    monkeypatch.setenv("OPENSANDBOX_API_KEY", "red-egress-key")
    provider = opensandbox_provider(options={"network_policy": True}, context=ProviderContext())
    sandbox = provider.start(
        SandboxSpec(
            image=BASE_IMAGE,
            labels={RUN_LABEL: RUN},
            network=True,
            filtered=True,
            allowed_hosts=(echo_server,),
            ttl_s=600,
        )
    )
    try:
        talker = (
            f"(echo online; sleep 6; echo offline-phase; sleep 4) "
            f"| {TRUSTED_BUSYBOX} nc {echo_server} 8080 > /tmp/heard 2>&1"
        )
        sandbox.exec(
            ["sh", "-c", f"nohup sh -c {shlex.quote(talker)} >/dev/null 2>&1 &"], user="0:0"
        )
        heard = ""
        for _ in range(30):
            heard = sandbox.exec(["cat", "/tmp/heard"], user="0:0").stdout
            if "online" in heard:
                break
            time.sleep(0.2)
        assert "online" in heard, "the connection was never made: nothing to attack"
        sandbox.set_network(False)
        fresh = sandbox.exec(
            [TRUSTED_BUSYBOX, "nc", "-w", "3", echo_server, "8080"], stdin=b"new\n", timeout=30
        )
        assert "new" not in fresh.stdout, "a new connection got through: no policy at all"
        time.sleep(8)
        heard = sandbox.exec(["cat", "/tmp/heard"], user="0:0").stdout
        assert "offline-phase" not in heard, (
            "a connection opened in an allow-listed phase talked to the outside in a phase "
            f"without the network: {heard!r}"
        )
    finally:
        sandbox.stop()
