"""The opensandbox provider's pure parts: labels as metadata and back, execd's event
stream read whatever it holds, users read by the survey's rule, the options."""

from __future__ import annotations

import base64
import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_harbor.sandboxes.base import ProviderOptionsError
from pytest_harbor.sandboxes.opensandbox.commands import CommandOutput
from pytest_harbor.sandboxes.opensandbox.execd import CommandEnd, read_command_events
from pytest_harbor.sandboxes.opensandbox.metadata import from_metadata, to_metadata
from pytest_harbor.sandboxes.opensandbox.options import POOL_KEYS, read_options
from pytest_harbor.sandboxes.opensandbox.provider import _cpu
from pytest_harbor.sandboxes.opensandbox.users import Users, Who, parse_user

_LABEL_VALUE = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"


@given(
    st.dictionaries(
        st.sampled_from(["pytest-harbor.run", "pytest-harbor.owner", "team"]), st.text()
    )
)
def test_labels_come_back_from_metadata_whole(labels: dict[str, str]) -> None:
    metadata = to_metadata(labels)
    for key, value in metadata.items():
        # Only what the server takes: Kubernetes label values.
        assert len(key) <= 63 and len(value) <= 63, (key, value)
        assert re.match(_LABEL_VALUE, value), value
    assert from_metadata(metadata) == labels


def test_a_plain_label_is_written_as_it_is() -> None:
    assert to_metadata({"pytest-harbor.run": "20261205T031500-4242-ab12cd"}) == {
        "pytest-harbor.run": "20261205T031500-4242-ab12cd",
        "pytest-harbor.run.enc": "plain",
    }
    owner = "host:4242:123:0f1e2d3c-aaaa-bbbb-cccc-000000000000:4026531836"
    assert from_metadata(to_metadata({"pytest-harbor.owner": owner})) == {
        "pytest-harbor.owner": owner
    }


def test_an_images_labels_cannot_change_what_is_read_back() -> None:
    """The server lists an image's labels among a sandbox's metadata; what the provider
    writes wins over a label of the same key, and nothing unmarked is read."""
    owner = "host:4242:123:0f1e2d3c-aaaa-bbbb-cccc-000000000000:4026531836"
    ours = to_metadata({"pytest-harbor.run": "run-1", "pytest-harbor.owner": owner})
    forged = to_metadata({"pytest-harbor.run": "other run", "pytest-harbor.owner": "x:1"})
    image = {
        **forged,
        "pytest-harbor.owner.b32-9": "aaaa",
        "pytest-harbor.run.b32-0": "mfrgg",
        "pytest-harbor.task": "planted",
        "maintainer": "someone",
    }
    assert from_metadata({**image, **ours}) == {
        "pytest-harbor.run": "run-1",
        "pytest-harbor.owner": owner,
    }


def test_a_cpu_count_past_any_machine_asks_for_a_bounded_one() -> None:
    assert _cpu(1e308, "1") == "100000000m"
    assert _cpu(0.0005, "1") == "1m"
    assert _cpu(None, "2") == "2"


def _events(*events: dict[str, object], prefix: str = "") -> list[str]:
    lines = []
    for event in events:
        lines += [prefix + json.dumps({"timestamp": 1, **event}), ""]
    return lines


class Lines:
    def __init__(self, stop_after: int | None = None) -> None:
        self.taken: list[tuple[str, str]] = []
        self._stop_after = stop_after

    def __call__(self, kind: str, text: str) -> bool:
        self.taken.append((kind, text))
        return self._stop_after is None or len(self.taken) < self._stop_after


@pytest.mark.parametrize("prefix", ["", "data: "])
def test_the_stream_gives_output_and_the_exit_status(prefix: str) -> None:
    end, lines = CommandEnd(), Lines()
    stream = _events(
        {"type": "init", "text": "abc"},
        {"type": "ping", "text": "pong"},
        {"type": "stdout", "text": "hi"},
        {"type": "stderr", "text": "err"},
        {"type": "error", "error": {"ename": "CommandExecError", "evalue": "3"}},
        {"type": "ping", "text": "pong"},
        prefix=prefix,
    )
    read_command_events(iter(stream), end, lines)
    assert (end.command_id, lines.taken, end.exit_code) == (
        "abc",
        [("stdout", "hi"), ("stderr", "err")],
        3,
    )
    assert not end.signalled


def test_a_signal_and_a_start_failure_are_told_apart() -> None:
    killed = CommandEnd()
    read_command_events(
        iter(_events({"type": "error", "error": {"evalue": "-1"}})), killed, Lines()
    )
    assert (killed.exit_code, killed.signalled) == (137, True)
    for said in ("fork/exec: denied", "\u00b2", "99999999999"):
        unstarted = CommandEnd()
        read_command_events(
            iter(_events({"type": "error", "error": {"evalue": said}})), unstarted, Lines()
        )
        assert (unstarted.exit_code, unstarted.start_error) == (126, said)


def test_the_reader_stops_when_told() -> None:
    end, lines = CommandEnd(), Lines(stop_after=2)
    stream = _events(*({"type": "stdout", "text": str(n)} for n in range(5)))
    read_command_events(iter(stream), end, lines)
    assert (lines.taken, end.exit_code) == ([("stdout", "0"), ("stdout", "1")], None)


@given(st.lists(st.text()))
def test_any_stream_is_read_without_raising(stream: list[str]) -> None:
    end = CommandEnd()
    read_command_events(iter(stream), end, Lines())
    assert end.exit_code is None or isinstance(end.exit_code, int)


def _outcome(mark: str, stdout: list[str], stderr: list[str]) -> CommandOutput:
    outcome = CommandOutput(mark)
    for line in stdout:
        outcome.take("stdout", line)
    for line in stderr:
        outcome.take("stderr", line)
    return outcome


def test_the_relays_lines_come_back_byte_exact() -> None:
    data = bytes(range(256)) * 40 + b"\r\n\n no end"
    encoded = base64.b64encode(data).decode()
    lines = [encoded[index : index + 76] for index in range(0, len(encoded), 76)]
    outcome = _outcome("m1", [*lines, "!m1 7"], [base64.b64encode(b"e\n").decode()])
    result = outcome.result(CommandEnd(exit_code=0), timed_out=False)
    assert (result.exit_code, result.stdout_bytes, result.stderr_bytes) == (7, data, b"e\n")


@pytest.mark.parametrize("forged", ["!0", "!m2 0", "!\u00b2", "!m1 \u00b2", "!m1 99999"])
def test_status_lines_without_the_mark_are_not_the_wrapper_s(forged: str) -> None:
    outcome = _outcome("m1", [forged, "!m1 5"], [])
    assert outcome.result(CommandEnd(exit_code=0), timed_out=False).exit_code == 5
    unmarked = _outcome("m1", [forged], ["\n"])
    assert unmarked.result(CommandEnd(exit_code=3), timed_out=False).exit_code == 3


def test_reading_stops_past_the_read_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pytest_harbor.sandboxes.output.EXEC_READ_CAP", 100)
    outcome = CommandOutput("m")
    assert outcome.take("stdout", "A" * 80)
    assert not outcome.take("stdout", "A" * 80)
    assert b"not read past 100 bytes" in outcome.result(CommandEnd(), False).stdout_bytes


PASSWD = (
    b"nobody:x:4242:4242\n"
    b"root:x:0:0:root:/root:/bin/bash\n"
    b"1500:x:0:0::/root:/bin/sh\n"
    b"alice:x:1500:1500::/home/alice:/bin/sh\n"
    b"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
)
GROUP = b"root:x:0:\nextra:x:1600:alice\n"


@pytest.mark.parametrize(
    ("spec", "who"),
    [
        ("nobody", Who(4242, None, "/")),
        ("1500", Who(1500, None, "/home/alice")),
        ("alice:extra", Who(1500, 1600, "/home/alice")),
        ("alice:1700", Who(1500, 1700, "/home/alice")),
        ("4321", Who(4321, 0, "/")),
        ("root", Who(0, None, "/root")),
        ("ghost", None),
        ("alice:ghosts", None),
    ],
)
def test_users_are_read_as_the_survey_reads_them(spec: str, who: Who | None) -> None:
    files = {"/etc/passwd": PASSWD, "/etc/group": GROUP}
    assert Users(files.get).resolve(parse_user(spec)) == who


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"api_key": "s3cret"}, "api_key: the key is a secret"),
        ({"colour": "blue"}, "not: colour"),
        ({"registry": "https://registry:5000"}, "registry: "),
        ({"default_cpu": "lots"}, "default_cpu: "),
        ({"use_server_proxy": "yes"}, "use_server_proxy: "),
    ],
)
def test_bad_options_are_refused_by_key(options: dict[str, object], words: str) -> None:
    with pytest.raises(ProviderOptionsError, match=words) as raised:
        read_options(options)
    assert "s3cret" not in str(raised.value)


def test_the_server_and_key_come_from_the_environment() -> None:
    options = read_options({})
    environ = {"OPEN_SANDBOX_DOMAIN": "sdk:8080", "OPENSANDBOX_API_KEY": "k"}
    assert (options.server(environ), options.key(environ)) == ("sdk:8080", "k")
    environ["OPENSANDBOX_DOMAIN"] = "reference:8080"
    assert options.server(environ) == "reference:8080"
    with pytest.raises(ProviderOptionsError, match="OPENSANDBOX_DOMAIN"):
        options.server({})
    named = read_options({"api_key_env": "MY_KEY"})
    with pytest.raises(ProviderOptionsError, match="MY_KEY is not set"):
        named.key(environ)


@pytest.mark.parametrize("key", POOL_KEYS)
def test_a_server_pool_is_refused_by_name_with_the_reason(key: str) -> None:
    """Whatever the value, well formed or not: a pooled sandbox's command daemon cannot
    be this run's alone (docs/opensandbox.md, Server pools)."""
    for value in ({"debian:bookworm-slim": "warm"}, "warm", None):
        with pytest.raises(ProviderOptionsError) as raised:
            read_options({"registry": "registry.example:5000", key: value})
        message = str(raised.value)
        assert message.startswith(f"{key}: the opensandbox provider does not start sandboxes")
        assert "task executor" in message and "token" in message
        assert "Server pools" in message
