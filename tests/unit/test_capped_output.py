"""Exec output kept as its head and tail within a cap."""

from __future__ import annotations

from pytest_harbor.sandboxes.output import CappedOutput


def test_output_within_the_cap_is_whole() -> None:
    output = CappedOutput(cap=100)
    for piece in (b"abc", b"def"):
        output.append(piece)
    assert output.value() == b"abcdef"


def test_longer_output_keeps_head_and_tail_and_counts_the_cut() -> None:
    output = CappedOutput(cap=10)
    data = bytes(range(97, 123)) * 4  # 104 bytes
    for start in range(0, len(data), 7):
        output.append(data[start : start + 7])
    assert output.cut == len(data) - 10
    assert output.value() == data[:5] + b"\n[... 94 bytes cut ...]\n" + data[-5:]


def test_a_prefix_can_be_dropped() -> None:
    output = CappedOutput(cap=100)
    output.append(b"123\nrest")
    output.drop_prefix(4)
    assert output.value() == b"rest"
