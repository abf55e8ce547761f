"""Where an episode writes on this machine: each turn's verifier files and artifacts."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from pytest_harbor.tasks import Turn

__all__ = ["EpisodeFolders"]


class EpisodeFolders:
    """A turn's verifier folder and artifacts folder: the episode's own (`verifier_root`,
    `artifacts_root`), with a folder per step below it for a multi-step task. Either,
    when not given, is a temporary folder removed by `discard()`."""

    def __init__(
        self, verifier_root: Path | None, artifacts_root: Path | None, *, per_step: bool
    ) -> None:
        self._roots = {"verifier": verifier_root, "artifacts": artifacts_root}
        self._own: dict[str, Path] = {}
        self._per_step = per_step

    def verifier_dir(self, turn: Turn) -> Path:
        return self._below("verifier", turn)

    def artifacts_dir(self, turn: Turn) -> Path:
        return self._below("artifacts", turn)

    def _below(self, kind: str, turn: Turn) -> Path:
        root = self._roots[kind]
        if root is None:
            if kind not in self._own:
                self._own[kind] = Path(tempfile.mkdtemp(prefix=f"harbor-{kind}-"))
            root = self._own[kind]
        return root / turn.name if self._per_step else root

    def discard(self) -> None:
        """Remove the temporary folders (the episode's own roots stay)."""
        for folder in self._own.values():
            shutil.rmtree(folder, ignore_errors=True)
        self._own.clear()
