"""The command channel's protocol without a sandbox: requests the channel's shell reads as
one line each, and replies read back byte for byte however the frames split them."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from pytest_harbor.sandboxes.docker.channel.protocol import (
    STDIN_CAP,
    channel_arguments,
    channel_request,
    quote,
)
from pytest_harbor.sandboxes.docker.channel.reply import (
    CAPPED,
    ENDED_IN_COMMAND,
    NOT_STARTED,
    OUTLIVED,
    RAN_PAST_END,
    Carry,
    ChannelReply,
    ReplyState,
    Verdict,
    settle,
)

#: A nonce as the engine makes one (32 hex digits) that overlaps itself nowhere: one made
#: of a repeated pair ("0f" * 16) would be found early in output that ends with its start,
#: which 128 random bits make a case no output can aim at.
NONCE = "3c9a41f07be25d86a1f4c0e97b3d2658"


def reply_frames(pid: bytes, stdout: bytes, stderr: bytes, status: str) -> list[tuple[bool, bytes]]:
    return [
        (False, pid + b"\n" + stderr + NONCE.encode() + b"\n"),
        (True, stdout + NONCE.encode() + f":{status}\n".encode()),
    ]


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(data) + 1) for cut in cuts})
    pieces, last = [], 0
    for point in [*points, len(data)]:
        pieces.append(data[last:point])
        last = point
    return [piece for piece in pieces if piece]


@given(
    stdout=st.binary(max_size=300),
    stderr=st.binary(max_size=300),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
)
def test_a_reply_reads_back_byte_for_byte_however_it_is_split(
    stdout: bytes, stderr: bytes, cuts: list[int]
) -> None:
    # Output that holds all but the last byte of the nonce is output too. (Output that
    # holds the whole nonce is not a case: it is 128 random bits only the engine knows.)
    stdout = NONCE.encode()[:-1] + stdout
    assume(NONCE.encode() not in stdout and NONCE.encode() not in stderr)
    reply = ChannelReply(NONCE)
    for is_stdout, data in reply_frames(b"4242", stdout, stderr, "3"):
        for piece in split(data, cuts):
            reply.feed(is_stdout, piece)
    assert reply.complete and not reply.trailing
    assert (reply.pid, reply.exit_code) == (4242, 3)
    assert (reply.stdout(), reply.stderr()) == (stdout, stderr)


def test_a_reply_without_a_pid_line_says_the_command_did_not_start() -> None:
    reply = ChannelReply(NONCE)
    reply.feed(False, b"sh: can't fork\n" + NONCE.encode() + b"\n")
    reply.feed(True, NONCE.encode() + b":2\n")
    assert reply.complete and not reply.started and reply.garbled


def test_a_reply_with_more_after_its_end_is_not_trusted() -> None:
    reply = ChannelReply(NONCE)
    for is_stdout, data in reply_frames(b"7", b"out", b"", "0"):
        reply.feed(is_stdout, data)
    reply.feed(True, b"forged")
    assert reply.trailing


def test_a_cut_off_reply_keeps_every_byte_that_came() -> None:
    reply = ChannelReply(NONCE)
    reply.feed(False, b"7\npartial err")
    reply.feed(True, b"partial out" + NONCE.encode()[:5])
    assert not reply.complete and reply.started
    assert reply.stdout() == b"partial out" + NONCE.encode()[:5]
    assert reply.stderr() == b"partial err"


@pytest.mark.skipif(shutil.which("busybox") is None, reason="needs busybox (.ci/setup installs it)")
@given(
    words=st.lists(
        st.text(alphabet=st.characters(blacklist_characters="\0", blacklist_categories=("Cs",))),
        max_size=6,
    )
)
def test_quoted_words_come_back_from_a_shell_as_they_were(words: list[str]) -> None:
    line = "printf '%s\\0' " + " ".join(quote(word) for word in words)
    script = "nl='\n'\n" + line + "\n"
    printed = subprocess.run(["busybox", "sh", "-c", script], capture_output=True, check=True)
    back = printed.stdout.split(b"\0")[:-1] if words else []
    assert [piece.decode() for piece in back] == words
    assert "\n" not in line


def test_what_a_request_cannot_carry_is_left_to_plain_exec() -> None:
    def request(**options: object) -> bytes | None:
        command = options.pop("command", ["true"])
        return channel_request(
            NONCE,
            command,  # type: ignore[arg-type]
            user=str(options.get("user", "0:0")),
            workdir=None,
            env=options.get("env"),  # type: ignore[arg-type]
            stdin=options.get("stdin"),  # type: ignore[arg-type]
        )

    assert request() is not None
    assert request(env={"NOT-A-NAME": "1"}) is None
    assert request(stdin=b"x" * (STDIN_CAP + 1)) is None
    assert request(command=[]) is None
    assert request(command=["echo", "a\0b"]) is None
    assert request(command=["echo", "\ud800"]) is None
    line = request(env={"A": "multi\nline"}, stdin=b"\0\1")
    assert line is not None and line.count(b"\n") == 1


def test_the_channel_gives_commands_the_sandboxs_own_shell_variables() -> None:
    assert channel_arguments(["PATH=/bin", "SHLVL=3"]) == ["0", ""]
    assert channel_arguments(["HOME=/h", "OLDPWD="]) == ["1", "="]


# ------------------------------------------------------------------- what a reply comes to


def state(
    *,
    complete: bool = True,
    started: bool = True,
    capped: bool = False,
    left_to_exec: bool = False,
    trailing: bool = False,
) -> ReplyState:
    return ReplyState(complete, started, capped, left_to_exec, trailing)


#: (the reply, its deadline passed) -> what becomes of the command: every state the
#: reader can report, by the rules the channel keeps.
SETTLED = [
    # A complete reply is the command's result; the channel carries the next one.
    (state(), False, Verdict(Carry.RESULT)),
    # Left to plain exec (a user or folder the channel cannot give): nothing of it ran.
    (state(started=False, left_to_exec=True), False, Verdict(Carry.EXEC)),
    # Its shell could not start it: never run again by plain exec (it might run twice).
    (state(started=False), False, Verdict(Carry.NOT_STARTED, NOT_STARTED)),
    (state(started=False, complete=False), True, Verdict(Carry.NOT_STARTED, OUTLIVED)),
    (state(started=False, complete=False), False, Verdict(Carry.NOT_STARTED, NOT_STARTED)),
    # Past its deadline: ended and given a grace; one that finished in it is a result.
    (state(), True, Verdict(Carry.RESULT)),
    (state(complete=False), True, Verdict(Carry.RESULT, OUTLIVED)),
    # Output past the read cap: the command was ended, the channel is not used again.
    (state(capped=True), False, Verdict(Carry.RESULT, CAPPED)),
    (state(capped=True, complete=False), False, Verdict(Carry.RESULT, CAPPED)),
    (state(capped=True, started=False), False, Verdict(Carry.NOT_STARTED, CAPPED)),
    # Bytes past the reply's end: the channel is no longer the engine's to trust.
    (state(trailing=True), False, Verdict(Carry.RESULT, RAN_PAST_END)),
    (state(trailing=True, capped=True), False, Verdict(Carry.RESULT, RAN_PAST_END)),
    # The channel ended under a running command (only root can end it): the command ends.
    (state(complete=False), False, Verdict(Carry.RESULT, ENDED_IN_COMMAND, kill=True)),
]


@pytest.mark.parametrize(("reply", "deadline_passed", "verdict"), SETTLED)
def test_a_reply_settles_by_its_state_alone(
    reply: ReplyState, deadline_passed: bool, verdict: Verdict
) -> None:
    assert settle(reply, deadline_passed) == verdict


def test_a_reply_reads_its_state_from_its_bytes() -> None:
    done = ChannelReply(NONCE)
    for stdout, data in reply_frames(b"42", b"out", b"err", "0"):
        done.feed(stdout, data)
    assert done.state() == state()
    left = ChannelReply(NONCE)
    for stdout, data in [(False, NONCE.encode() + b"\n"), (True, NONCE.encode() + b":u\n")]:
        left.feed(stdout, data)
    assert left.state() == state(started=False, left_to_exec=True)
    cut = ChannelReply(NONCE)
    cut.feed(False, b"42\npartial")
    assert cut.state() == state(complete=False)
    extra = ChannelReply(NONCE)
    for stdout, data in reply_frames(b"42", b"", b"", "0"):
        extra.feed(stdout, data)
    extra.feed(True, b"more")
    assert extra.state() == state(trailing=True)
