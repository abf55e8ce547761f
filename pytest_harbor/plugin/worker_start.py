"""What the controller hands each xdist worker as it starts (xdist's `workerinput`): one
model, packed by the controller and unpacked by the worker."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from pytest_harbor.datasets import ResolvedDataset
from pytest_harbor.relay import RelayAddress

__all__ = ["WorkerStart"]

#: The workerinput key that holds it.
_KEY = "harbor"


class WorkerStart(BaseModel):
    """The controller's run id, what its pre-flight settled, its resolutions of the run's
    dataset references (a worker never resolves one itself), and its model relay."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: The run id every process of the run shares (None: the worker makes its own).
    run_id: str | None = None
    #: Each task's digest as the controller materialized its rows: `taskset/task`.
    row_digests: dict[str, str] = Field(default_factory=dict)
    #: The trials a resumed run finished already, sorted.
    done_trials: tuple[str, ...] = ()
    datasets: tuple[ResolvedDataset, ...] = ()
    #: Each taskset's run folder (`runs/<name>/`), as the controller settled it.
    run_folders: dict[str, str] = Field(default_factory=dict)
    #: Where the run's model relay answers (None: the run has none).
    relay: RelayAddress | None = None

    def pack(self) -> dict[str, Any]:
        """What goes into a worker's `workerinput` (plain data, as execnet carries it)."""
        return {_KEY: self.model_dump(mode="json")}

    @classmethod
    def unpack(cls, workerinput: Mapping[str, Any]) -> WorkerStart:
        """What the controller packed into `workerinput` (the defaults where it packed
        nothing)."""
        return cls.model_validate(workerinput.get(_KEY) or {})
