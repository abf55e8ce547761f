"""What the controller's pre-flight settles reaches each process that collects or runs
trials: in the sole process its plan itself, on an xdist worker a frozen copy handed over
with the worker's start-up data. A worker has no plan of its own."""

from __future__ import annotations

import json

import pytest

from tests.acceptance.test_provider_hook import PROVIDER
from tests.fixtures import write_task

#: Each process writes what it reads as the run's settled trials, and the controller its plan.
SEEN = """
import json
import os


def pytest_collection_finish(session):
    from pytest_harbor.plugin.planned import PLANNED_RUN
    from pytest_harbor.plugin.run import SETTLED_TRIALS

    config = session.config
    settled = config.stash[SETTLED_TRIALS]
    worker = getattr(config, "workerinput", None) is not None
    Path("worker.json" if worker else "main.json").write_text(json.dumps({
        "kind": type(settled).__name__,
        "digests": dict(settled.row_digests),
        "is_plan": settled is config.stash.get(PLANNED_RUN, None),
        "has_plan": PLANNED_RUN in config.stash,
    }))


def pytest_sessionfinish(session):
    from pytest_harbor.plugin.planned import PLANNED_RUN

    planned = session.config.stash.get(PLANNED_RUN, None)
    if planned is not None:
        Path("planned.json").write_text(json.dumps(dict(planned.row_digests)))


def pytest_harbor_sandbox_providers():
    return {"unstartable": unstartable}
"""


@pytest.mark.parametrize("xdist", [False, True], ids=["sole", "worker"])
def test_the_settled_trials_reach_every_process(pytester: pytest.Pytester, xdist: bool) -> None:
    dataset = pytester.path / "tasks"
    write_task(dataset, "plain")
    pytester.makeconftest(PROVIDER + SEEN)
    result = pytester.runpytest(
        f"--harbor-dataset={dataset}",
        "--harbor-sandbox=unstartable",
        "--harbor-results-dir=out",
        "-p",
        "no:cacheprovider",
        *(["-n", "1"] if xdist else []),
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # its sandbox never starts
    planned = json.loads((pytester.path / "planned.json").read_text())
    assert list(planned) == ["tasks/plain"]
    seen = json.loads((pytester.path / ("worker.json" if xdist else "main.json")).read_text())
    assert seen["digests"] == planned
    if xdist:
        assert seen["kind"] == "HandedTrials" and not seen["has_plan"]
        assert not (pytester.path / "main.json").exists()  # xdist's controller collects nothing
    else:
        assert seen["kind"] == "PlannedRun" and seen["is_plan"]
