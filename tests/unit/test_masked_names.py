"""Names written below the results folder from a sandbox hold no secret: the verifier's
folder as it is copied, a harness's folder after its call; two names that mask alike are
kept apart by a suffix."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from pytest_harbor.engine import verification
from pytest_harbor.engine.harness_calls import call_harness
from pytest_harbor.engine.masked_names import MaskedPaths, suffixed
from pytest_harbor.redaction import Redactor
from tests.unit.test_verifier_copy import FakeSandbox, archive, copy

SECRET = "s3cr3t-value-x"


def files_below(folder: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in folder.rglob("*")
        if path.is_file()
    }


def test_a_suffix_goes_before_the_extension() -> None:
    assert suffixed("***.txt", 2) == "***~2.txt"
    assert suffixed("***", 3) == "***~3"
    assert suffixed(".***", 2) == ".***~2"
    assert suffixed("***~2.txt", 2) == "***~2~2.txt"


def test_paths_are_placed_masked_first_come_first_kept() -> None:
    names = MaskedPaths(Redactor([SECRET]))
    assert names.place([f"{SECRET}.txt"]) == ["***.txt"]
    assert names.place(["***.txt"]) == ["***~2.txt"]
    assert names.place([SECRET, "a"]) == ["***", "a"]
    assert names.place([SECRET, "b"]) == ["***", "b"]  # the same folder for all its files
    assert names.place(["***", "a"]) == ["***~2", "a"]
    assert names.place([f"{SECRET}.txt"]) == ["***.txt"]  # the same path, the same place
    # A secret cut by a `/` leaves no piece of 8 characters or more in a name.
    assert names.place([SECRET[:8], SECRET[-8:]]) == ["***~3", "***"]
    assert names.place(["plain"]) == ["plain"]
    unmasked = MaskedPaths(Redactor())
    assert unmasked.place(["***.txt"]) == ["***.txt"]


def test_the_verifier_folder_is_copied_with_its_names_masked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(verification, "FILE_CAP_BYTES", 30)
    sandbox = FakeSandbox(
        {
            "/logs/verifier": archive(
                ("", None),
                (f"{SECRET}.txt", b"a"),
                ("***.txt", b"b"),
                ("***~2.txt", b"c"),
                (SECRET, None),
                (f"{SECRET}/in.txt", f"the {SECRET}".encode()),
                ("***", None),
                ("***/in.txt", b"e"),
                (f"long-{SECRET}.log", b"x" * 40),
                ("reward.txt", b"1"),
            )
        }
    )
    copied = copy(tmp_path, sandbox)
    assert copied.rewards == {"reward.txt": b"1"}
    assert files_below(tmp_path / "out") == {
        "***.txt": b"a",
        "***~2.txt": b"b",
        "***~2~2.txt": b"c",
        "***/in.txt": b"the ***",
        "***~2/in.txt": b"e",
        "long-***.log": b"x" * 30 + b"\n[... cut: 10 more bytes ...]\n",
        "reward.txt": b"1",
    }
    assert copied.cut == ["long-***.log"]


def test_a_harness_folder_has_its_names_masked_after_the_call(tmp_path: Path) -> None:
    folder = tmp_path / "agent"
    folder.mkdir()
    (folder / "***.txt").write_text("there before")

    def work(*_: object) -> None:
        """What a harness may keep of a sandbox's /logs/agent, names and all."""
        (folder / SECRET).mkdir()
        (folder / SECRET / SECRET).write_text(f"the {SECRET}")
        (folder / f"{SECRET}.txt").write_text("mine")
        os.symlink("/nowhere", folder / f"to-{SECRET}")

    sandbox: Any = FakeSandbox({})
    call_harness("a turn", sandbox, 10.0, work, host_dir=folder, redactor=Redactor([SECRET]))
    assert files_below(folder) == {
        "***/***": b"the ***",
        "***.txt": b"there before",
        "***~2.txt": b"mine",
    }
    assert os.readlink(folder / "to-***") == "/nowhere"
    assert not any(SECRET in str(path) for path in folder.rglob("*"))
