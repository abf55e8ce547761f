"""The names of what a run writes below its results folder from a sandbox (the verifier's
folder, a harness's logs): every name masked as Redactor.name masks it, and two names that
mask alike kept apart by a suffix, so neither file is lost."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Container, Sequence
from pathlib import Path, PurePosixPath

from pytest_harbor.redaction import Redactor

__all__ = ["MaskedPaths", "mask_folder", "suffixed"]


def suffixed(name: str, number: int) -> str:
    """`name` told apart as the `number`th of its kind: `~2` before its extension
    (`***.txt` gives `***~2.txt`, `***` gives `***~2`)."""
    path = PurePosixPath(name)
    return f"{path.stem}~{number}{path.suffix}"


def _free(name: str, taken: Container[str]) -> str:
    """`name`, or the first of its suffixed forms that is not taken."""
    found, number = name, 2
    while found in taken:
        found, number = suffixed(name, number), number + 1
    return found


class MaskedPaths:
    """Where each path of a sandbox's folder, read as a stream, is written: the same
    folder for all its files, each name masked. A path that masks to one already written
    (a file `<secret>.txt` and another named `***.txt`) takes the first free suffix: the
    one the copy reaches first keeps the name."""

    def __init__(self, redactor: Redactor) -> None:
        self._redactor = redactor
        self._placed: dict[tuple[str, ...], tuple[str, ...]] = {}
        #: The names written in each folder (by its written path).
        self._taken: dict[tuple[str, ...], set[str]] = {}

    def place(self, parts: Sequence[str]) -> list[str]:
        """The parts of the path to write for the sandbox's path `parts`."""
        placed: tuple[str, ...] = ()
        for depth in range(1, len(parts) + 1):
            original = tuple(parts[:depth])
            known = self._placed.get(original)
            if known is None:
                taken = self._taken.setdefault(placed, set())
                name = _free(self._redactor.name(parts[depth - 1]), taken)
                taken.add(name)
                known = self._placed[original] = (*placed, name)
            placed = known
        return list(placed)


def mask_folder(folder: Path, redactor: Redactor) -> None:
    """Mask what a harness left in `folder`: secrets in every file's content, and every
    name below it renamed to its masked form (a suffix when that name is there already).
    What cannot be read or renamed is left as it is."""
    if not redactor or not folder.is_dir():
        return
    # Deepest first: a folder is renamed after what is in it.
    for root, folders, files in os.walk(folder, topdown=False):
        here = Path(root)
        for name in files:
            path = here / name
            if path.is_file() and not path.is_symlink():
                with contextlib.suppress(OSError):
                    data = path.read_bytes()
                    masked = redactor.bytes(data)
                    if masked != data:
                        path.write_bytes(masked)
        taken = {*files, *folders}
        for name in [*files, *folders]:
            masked_name = redactor.name(name)
            if masked_name == name:
                continue
            target = _free(masked_name, taken)
            with contextlib.suppress(OSError):
                os.rename(here / name, here / target)
                taken.add(target)
