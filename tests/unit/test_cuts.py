"""Secrets at every cut: a piece of a secret a cut leaves (its beginning before the cut,
its end after it) is masked as the secret is, at the edges of a text and beside the marks
of every cut the run makes."""

from __future__ import annotations

import pytest

from pytest_harbor.redaction import CUT, MASK, Redactor, clip_head, clip_tail
from pytest_harbor.sandboxes.output import CappedOutput

SECRET = "sk-live-0123456789abcdefghijkl"


def leaks(text: str, secret: str = SECRET) -> list[str]:
    """The pieces of `secret`, 8 characters or longer, still in `text`."""
    return [
        secret[i:j]
        for i in range(len(secret))
        for j in range(i + 8, len(secret) + 1)
        if secret[i:j] in text
    ]


@pytest.mark.parametrize("at", range(1, len(SECRET)))
def test_a_head_cut_inside_a_secret_leaves_no_piece_of_8_or_more(at: int) -> None:
    text = "x" * 40 + SECRET + "y" * 40
    masked = Redactor([SECRET]).text(clip_head(text, 40 + at))
    assert not leaks(masked)
    assert masked.endswith(CUT)
    if at >= 8:
        assert masked == "x" * 40 + MASK + CUT


@pytest.mark.parametrize("at", range(1, len(SECRET)))
def test_a_tail_cut_inside_a_secret_leaves_no_piece_of_8_or_more(at: int) -> None:
    text = "x" * 40 + SECRET + "y" * 40
    clipped = clip_tail(text, 40 + len(SECRET) - at)
    assert not leaks(Redactor([SECRET]).text("the end: " + clipped))


def test_capped_output_cut_in_the_middle_of_a_secret_on_both_sides() -> None:
    output = CappedOutput(cap=100)
    output.append(b"a" * 40 + SECRET.encode() + b"b" * 200 + SECRET.encode() + b"c" * 40)
    # The head ends inside the first secret; the tail starts inside the second.
    masked = Redactor([SECRET]).bytes(output.value()).decode()
    assert "bytes cut" in masked
    assert not leaks(masked)


@pytest.mark.parametrize("chunk", [1, 7, 64, 10_000])
@pytest.mark.parametrize("at", [3, 8, 20, len(SECRET) - 1])
def test_a_stream_cut_inside_a_secret_masks_its_beginning(chunk: int, at: int) -> None:
    data = (b"x" * 300 + SECRET.encode())[: 300 + at]
    pieces = [data[i : i + chunk] for i in range(0, len(data), chunk)]
    masked = b"".join(Redactor([SECRET]).stream(pieces, cut=True)).decode()
    assert not leaks(masked)
    assert masked.startswith("x" * 300)
    # Uncut, a stream masks only whole secrets: its end is not a cut.
    whole = b"".join(Redactor([SECRET]).stream([b"ab", SECRET.encode(), b"cd"])).decode()
    assert whole == f"ab{MASK}cd"


def test_short_secrets_and_innocent_text_are_left_alone() -> None:
    redactor = Redactor(["abcd", SECRET])
    # A piece shorter than the threshold is no secret's; neither are its letters elsewhere.
    assert redactor.text("end with sk-li") == "end with sk-li"
    assert redactor.text("x abc y") == "x abc y"
    assert redactor.text("x abcd y") == f"x {MASK} y"
    assert Redactor().text(clip_head("abc", 1)) == "a" + CUT
    # A short secret has no piece long enough to be told from an innocent word.
    assert Redactor(["tests"]).text("notes, tests and estimates") == "notes, *** and estimates"


def test_report_caps_mark_their_cuts() -> None:
    from pytest_harbor.report.page import _cut

    assert _cut("x" * 10, 4) == "xxxx" + CUT
    masked = Redactor([SECRET]).text("<td>" + _cut("y" * 10 + SECRET, 20) + "</td>")
    assert not leaks(masked)
