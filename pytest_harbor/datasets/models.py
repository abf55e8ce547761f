"""What a resolved reference is: the data the results record and xdist workers are given."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = ["PinnedTask", "ResolvedDataset"]


class PinnedTask(BaseModel):
    """A task of a reference as this run takes it: its commit, not a branch."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    git_url: str
    #: The branch or tag the registry or reference gave (None: a commit id or HEAD).
    ref: str | None = None
    git_commit_id: str
    path: str
    #: The cached folder's content digest (`sha256:`, every file and mode bit).
    digest: str | None = None


class ResolvedDataset(BaseModel):
    """A reference, resolved: what the results record and what xdist workers are given
    (they never resolve a reference themselves)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    given: str
    kind: Literal["registry", "git"]
    #: The taskset name: the dataset's name, or the git reference's folder name.
    name: str
    registry: str | None = None
    version: str | None = None
    #: The folder the run collects (under the cache's views/).
    folder: str
    tasks: list[PinnedTask]
    #: Tasks that could not be fetched: name -> why. They are load failures of the run.
    refused: dict[str, str] = {}

    @property
    def path(self) -> Path:
        return Path(self.folder)
