"""What the controller's pre-flight settles before any worker starts: each taskset's plan,
manifest and run record, what its folder held, the trials planned, their rows' digests,
those a resumed run finished, how long each task takes."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest

from pytest_harbor.run.planning import TasksetPlan
from pytest_harbor.writers.manifest import RunManifest
from pytest_harbor.writers.run_config import RunRecord

__all__ = ["PLANNED_RUN", "PlannedRun"]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass(eq=False)
class PlannedRun:
    """The controller's (or the sole process's) plan of the run; a worker has none.

    Made where the controller's plugins are registered (`started_at` with it); every other
    field is written by the pre-flight (`PreFlight`) alone, before any worker starts.
    Read by the scheduler (`trial_ids`, `expected_s`), the item reports and the recorder
    (`trial_ids`, `done_trials`, and each taskset's `plans`, `manifests`), the
    builds ahead (`expected_s`), the terminal summary (`expected_s`, `history_tasks`,
    `reaped`, `plans`, `manifests`, `folder_notes`), and the workers' start-up data
    (`row_digests`, `done_trials`: it is the sole process's `SettledTrials`)."""

    #: When the run started: its manifest and its results folders' locks say so.
    started_at: str = field(default_factory=_now)
    #: Node ids of every trial the controller planned: `<taskset>/<task>::r<N>`.
    trial_ids: set[str] = field(default_factory=set)
    #: Digests of the rows as the controller materialized them: `taskset/task` -> digest.
    row_digests: dict[str, str] = field(default_factory=dict)
    #: Trials a resumed run finished already: they are not collected again.
    done_trials: set[str] = field(default_factory=set)
    #: Expected seconds of one trial of each `<taskset>/<task>` (longest first).
    expected_s: dict[str, float] = field(default_factory=dict)
    #: The `<taskset>/<task>`s an earlier run recorded durations of.
    history_tasks: set[str] = field(default_factory=set)
    #: Sandboxes removed as the run started that runs whose process is gone had left.
    reaped: int = 0
    #: Each taskset's manifest (the tasksets of the run are its keys).
    manifests: dict[str, RunManifest] = field(default_factory=dict)
    #: What each taskset's run_config_<agent>.yaml records.
    run_records: dict[str, RunRecord] = field(default_factory=dict)
    #: What the run has to say of each taskset's folder: runs of the old layout moved,
    #: the run a resume continues.
    folder_notes: dict[str, list[str]] = field(default_factory=dict)
    #: Each taskset's plan, as the run planned it at its start.
    plans: dict[str, TasksetPlan] = field(default_factory=dict)


#: The controller's plan, for its hooks that are not one of its plugins (the scheduler's,
#: a worker's start-up data, the status of a dead worker's report).
PLANNED_RUN = pytest.StashKey[PlannedRun]()
