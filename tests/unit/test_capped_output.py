"""Exec output kept as its head and tail within a cap."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pytest_harbor.sandboxes import output as output_module
from pytest_harbor.sandboxes.docker.stream import OutputReader
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


class Endless:
    """An exec's connection whose command prints forever; records whether it was closed."""

    def __init__(self) -> None:
        self.closed = False

    def frames(self) -> Iterator[tuple[int, bytes]]:
        while not self.closed:
            yield 1, b"y\n" * 32768

    def close(self) -> None:
        self.closed = True


def test_an_exec_printing_forever_is_read_up_to_the_read_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(output_module, "EXEC_READ_CAP", 1 << 20)
    connection = Endless()
    reader = OutputReader(connection, reads_pid=False)  # type: ignore[arg-type]
    reader.run()
    assert reader.capped and connection.closed
    assert reader.read <= (1 << 20) + 65536
    assert b"output not read past 1048576 bytes" in reader.out.value()
