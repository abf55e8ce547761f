"""What crosses from an xdist worker to the controller, and from the controller to a worker
as it starts: each a model that survives the trip as plain JSON data, and a payload that
is not one reads as none."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_harbor.datasets import ResolvedDataset
from pytest_harbor.datasets.models import PinnedTask
from pytest_harbor.engine import EpisodeResult, FailureKind
from pytest_harbor.engine.results import TurnResult
from pytest_harbor.plugin.checks import TaskCheck
from pytest_harbor.plugin.item_reports import harbor_data
from pytest_harbor.plugin.options import HarborOptions
from pytest_harbor.plugin.payload import ReportedFailure, ReportPayload
from pytest_harbor.plugin.references import resolve_references
from pytest_harbor.plugin.worker_start import WorkerStart


def _carried(data: Any) -> Any:
    """`data` as the other process receives it: only what plain JSON holds survives."""
    return json.loads(json.dumps(data, allow_nan=False))


def _result() -> EpisodeResult:
    return EpisodeResult(
        task_id="hello",
        taskset="demo",
        repeat=1,
        agent="oracle",
        reward=0.5,
        turns=[TurnResult(step="episode", reward=0.5, verifier_logs_dir="/r/verifier/x")],
        verifier_logs_dir="/r/verifier/x",
    )


def _report(data: object, when: str = "call") -> pytest.TestReport:
    nodeid = "demo/hello::r1::episode"
    report = pytest.TestReport(nodeid, ("x", 0, nodeid), {}, "passed", None, when)  # type: ignore[arg-type]
    report.harbor = data  # type: ignore[attr-defined]
    return report


@pytest.mark.parametrize(
    "payload",
    [
        ReportPayload(
            taskset="demo",
            task_id="hello",
            episode_id="hello__r1",
            step="episode",
            verifier_dir="/r/verifier/x",
            result=_result(),
            status="failed",
        ),
        ReportPayload(
            taskset="demo",
            task_id="hello",
            status="error",
            failure=ReportedFailure(kind=FailureKind.INTERNAL_ERROR, reason="it broke"),
        ),
        ReportPayload(taskset="demo", task_id="hello", unvalidated=True, skip_reason="no solution"),
        ReportPayload(taskset="demo", task_id="hello", unloadable="the image did not build"),
    ],
    ids=["row", "failure", "skipped", "unloadable"],
)
def test_a_payload_survives_the_trip_through_its_dump(payload: ReportPayload) -> None:
    assert ReportPayload.load(_carried(payload.dump())) == payload
    assert harbor_data(_report(_carried(payload.dump()))) == payload


def test_the_row_a_payload_carries_is_the_row_as_dumped() -> None:
    payload = ReportPayload(taskset="demo", task_id="hello", result=_result())
    assert payload.dump()["result"] == _result().model_dump(mode="json")


def test_keys_a_payload_lacks_read_as_absent_and_keys_it_does_not_know_are_ignored() -> None:
    payload = ReportPayload.load({"taskset": "demo", "status": "passed", "later": {"x": 1}})
    assert payload == ReportPayload(taskset="demo", status="passed")
    assert payload is not None and payload.result is None and payload.failure is None


@pytest.mark.parametrize(
    "data",
    [
        None,
        "harbor",
        ["taskset", "demo"],
        {"taskset": "demo", "status": "exploded"},
        {"taskset": "demo", "result": {"task_id": "hello"}},
        {"taskset": "demo", "failure": {"kind": "harbor:internal_error"}},
        {"taskset": ["demo"]},
    ],
    ids=["none", "text", "list", "status", "result", "failure", "taskset"],
)
def test_data_that_is_not_a_payload_reads_as_none(data: object) -> None:
    assert ReportPayload.load(data) is None
    assert harbor_data(_report(data)) is None


def test_the_check_takes_a_report_with_a_malformed_payload_as_one_without_data() -> None:
    check = TaskCheck(repeats=2)
    check.add(_report({"taskset": "demo", "result": {"task_id": "hello"}}))
    record = check.records[("demo", "hello")]
    assert record.oracle == {} and record.lost == {}
    check.add(_report(ReportPayload(taskset="demo", result=_result()).dump()))
    assert record.oracle == {1: _result()}


def test_a_report_of_another_item_has_no_payload() -> None:
    nodeid = "tests/test_x.py::test_y"
    report = pytest.TestReport(nodeid, ("x", 0, nodeid), {}, "passed", None, "call")  # type: ignore[arg-type]
    assert harbor_data(report) is None


# ---------------------------------------------------------------------------- start-up


def _dataset() -> ResolvedDataset:
    return ResolvedDataset(
        given="harbor:demo@1.0",
        kind="registry",
        name="demo",
        registry="https://example.org/registry.json",
        version="1.0",
        folder="/cache/views/demo",
        tasks=[
            PinnedTask(
                name="hello",
                git_url="https://example.org/tasks.git",
                git_commit_id="a" * 40,
                path="hello",
                digest="sha256:" + "b" * 64,
            )
        ],
        refused={"broken": "not found"},
    )


def test_worker_start_survives_the_trip_through_workerinput() -> None:
    start = WorkerStart(
        run_id="20261201T100000-1-abcdef",
        row_digests={"demo/hello": "sha256:" + "c" * 64},
        done_trials=("demo/hello::r0", "demo/hello::r1"),
        datasets=(_dataset(),),
    )
    workerinput = {"workerid": "gw0", **_carried(start.pack())}
    assert WorkerStart.unpack(workerinput) == start


def test_worker_start_packs_under_one_key_of_workerinput() -> None:
    packed = WorkerStart(run_id="run").pack()
    assert list(packed) == ["harbor"]
    assert _carried(packed) == packed


def test_a_workerinput_without_it_unpacks_to_the_defaults() -> None:
    start = WorkerStart.unpack({"workerid": "gw0"})
    assert start == WorkerStart()
    assert start.run_id is None and start.datasets == () and start.done_trials == ()


def test_a_worker_takes_the_controllers_resolutions_and_resolves_nothing(tmp_path: Path) -> None:
    options = HarborOptions(
        datasets=(),
        agent="oracle",
        sandbox="docker",
        repeats=None,
        results_dir=tmp_path,
        pass_reward=1.0,
        # On the controller this would fetch: a worker never does.
        references=("harbor:demo@1.0",),
        cache_dir=tmp_path / "cache",
    )
    handed = WorkerStart(run_id="run", datasets=(_dataset(),))
    said: list[str] = []
    assert resolve_references(options, handed, said) == [_dataset()]
    assert resolve_references(options, WorkerStart(run_id="run"), said) == []
    assert said == [] and not (tmp_path / "cache").exists()
