"""Real runs to compare, made with pytester and the scripted fake provider
(tests/fake_provider.py): no engine is needed. Used by the comparison's unit test and
its browser test."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

import tests.fake_provider  # noqa: F401  (imported once, before any run: see the conftest)
from tests.fixtures import write_task

__all__ = ["HOSTILE_REASON", "SUMMARY", "RealRuns", "make_real_runs"]

SUMMARY = "rollouts_run_summary.json"
#: What the third task's sandbox says as it fails to start in the `hostile` run.
HOSTILE_REASON = "<script>document.title='pwned'</script><img src=x onerror=alert(1)>\u202eevil"

#: Fakes whose verifications score in the order given (tasks run in name order here), one
#: whose sandboxes never start (every episode has no result), and one that starts two.
CONFTEST = """
from pytest_harbor.sandboxes import SandboxStartError
from tests.fake_provider import FakeProvider, SandboxScript, Verdict
from tests.real_runs import HOSTILE_REASON

def scores(*values):
    return lambda *, options, context: FakeProvider(
        SandboxScript(verdicts=tuple(Verdict.reward(value) for value in values))
    )

def pytest_harbor_sandbox_providers():
    return {
        "old": scores("1", "0", "1"),
        "new": scores("0", "1", "1"),
        "broken": lambda *, options, context: FakeProvider(
            SandboxScript(start_error="the engine is gone")
        ),
        "hostile": lambda *, options, context: StartsTwo(
            SandboxScript(verdicts=(Verdict.reward("0"), Verdict.reward("1")))
        ),
    }


# Scores as its script says, but the third sandbox never starts, its error quoting what
# a hostile image printed.
class StartsTwo(FakeProvider):

    def start(self, spec):
        if len(self.specs) >= 2:
            self.specs.append(spec)
            raise SandboxStartError(HOSTILE_REASON)
        return super().start(spec)
"""


@dataclass(frozen=True)
class RealRuns:
    """The run folders of the four runs make_real_runs() makes."""

    old: Path
    new: Path
    broken: Path
    hostile: Path


def _run(pytester: pytest.Pytester, dataset: Path, sandbox: str) -> Path:
    results = pytester.path / f"out-{sandbox}"
    pytester.runpytest(
        f"--harbor-dataset={dataset}",
        f"--harbor-sandbox={sandbox}",
        "--harbor-agent=nop",
        f"--harbor-results-dir={results}",
        "--harbor-report=none",
    )
    return results / "harbor" / dataset.name


def _statuses(folder: Path) -> dict[str, str]:
    summary = json.loads((folder / SUMMARY).read_text())
    return {entry["task_id"]: entry["status"] for entry in summary["episodes"]}


def make_real_runs(pytester: pytest.Pytester) -> RealRuns:
    """OLD ran alpha, beta and delta, and so did `hostile`, scoring alpha 0 and beta 1 and
    finding no sandbox for delta; then beta's instruction changed, delta was removed and
    gamma added; NEW ran alpha, beta and gamma, and `broken` found no sandbox at all."""
    pytester.makeconftest(CONFTEST)
    dataset = pytester.path / "tasks"
    for name in ("alpha", "beta", "delta"):
        write_task(dataset, name)
    old = _run(pytester, dataset, "old")
    hostile = _run(pytester, dataset, "hostile")
    (dataset / "beta" / "instruction.md").write_text("Write 1 to /tmp/answer, now.\n")
    shutil.rmtree(dataset / "delta")
    write_task(dataset, "gamma")
    new = _run(pytester, dataset, "new")
    broken = _run(pytester, dataset, "broken")
    assert _statuses(old) == {"alpha": "passed", "beta": "failed", "delta": "passed"}
    assert _statuses(new) == {"alpha": "failed", "beta": "passed", "gamma": "passed"}
    assert set(_statuses(broken).values()) == {"no_result"}
    assert _statuses(hostile) == {"alpha": "failed", "beta": "passed", "delta": "no_result"}
    return RealRuns(old, new, broken, hostile)
