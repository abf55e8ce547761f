"""One owner for each piece of a run's state: `HarborRun` is what every process has, the
controller's plan (`PlannedRun`) and report (`RunReport`) are reachable from neither a
worker's run nor the controller's, and each of their fields has the one writer their
docstrings name."""

from __future__ import annotations

import ast
import dataclasses
from collections import defaultdict
from pathlib import Path

import pytest

import pytest_harbor.plugin
from pytest_harbor.plugin.ledger import EpisodeLedger
from pytest_harbor.plugin.options import HarborOptions
from pytest_harbor.plugin.planned import PlannedRun
from pytest_harbor.plugin.reporting import RunReport
from pytest_harbor.plugin.run import HandedTrials, HarborRun, SettledTrials
from pytest_harbor.writers import RolloutsWriter

PLUGIN = Path(pytest_harbor.plugin.__file__).parent

#: What only the controller has: none of it may be found from a HarborRun.
CONTROLLER_TYPES = (PlannedRun, RunReport, RolloutsWriter, EpisodeLedger)

#: The fields of RunReport that hold data (not the collaborators made with it), by writer.
REPORT_WRITERS = {
    "recording": {
        "items",
        "unvalidated",
        "kept",
        "kept_failed",
        "all_kept",
        "reaped",
        "interrupted",
        "cut_short",
        "unwritten",
        "unwritten_reason",
        "problems",
        "check_files",
        "reports",
        "report_errors",
        "spend",
    },
}

#: Calls that change the container they are called on.
_MUTATORS = {"add", "append", "clear", "discard", "extend", "pop", "remove", "setdefault", "update"}


def _run(tmp_path: Path, *, is_worker: bool) -> HarborRun:
    options = HarborOptions(
        datasets=(),
        agent="oracle",
        sandbox="docker",
        repeats=1,
        results_dir=tmp_path,
        pass_reward=1.0,
    )
    return HarborRun(options, run_id="r", owner="host:1", targets=[], is_worker=is_worker)


def _reachable(start: object) -> list[object]:
    """Every object found from `start` through the attributes of pytest-harbor's own
    objects and the containers they hold."""
    seen: set[int] = set()
    found: list[object] = []
    todo: list[object] = [start]
    while todo:
        value = todo.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        found.append(value)
        if isinstance(value, dict):
            todo += list(value.keys()) + list(value.values())
        elif isinstance(value, list | tuple | set | frozenset):
            todo += list(value)
        elif type(value).__module__.startswith("pytest_harbor") and hasattr(value, "__dict__"):
            todo += list(vars(value).values())
    return found


@pytest.mark.parametrize("is_worker", [False, True], ids=["controller", "worker"])
def test_a_run_carries_nothing_only_the_controller_has(tmp_path: Path, is_worker: bool) -> None:
    run = _run(tmp_path, is_worker=is_worker)
    controller_only = {field.name for field in dataclasses.fields(PlannedRun)} | {
        "writer",
        "terminal",
        "config_verbosity",
        "workers",
    }
    assert controller_only.isdisjoint(vars(run))
    assert not [value for value in _reachable(run) if isinstance(value, CONTROLLER_TYPES)]


def test_the_plan_and_a_workers_handover_are_what_every_process_reads() -> None:
    planned = PlannedRun(row_digests={"qs/a": "d"}, done_trials={"qs/a::r0"})
    handed = HandedTrials(row_digests={"qs/a": "d"}, done_trials=frozenset({"qs/a::r0"}))
    settled: list[SettledTrials] = [planned, handed]
    assert [dict(s.row_digests) for s in settled] == [{"qs/a": "d"}] * 2
    assert [set(s.done_trials) for s in settled] == [{"qs/a::r0"}] * 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        handed.done_trials = frozenset()  # type: ignore[misc]


def _written(node: ast.AST, *, calls: bool) -> list[ast.Attribute]:
    """The attributes a statement or call writes: assigned, assigned an item, or (with
    `calls`) changed by a mutating method."""
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        targets = [node.target]
    elif (
        calls
        and isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _MUTATORS
    ):
        targets = [node.func.value]
    found = []
    for target in targets:
        elements = target.elts if isinstance(target, ast.Tuple) else [target]
        for element in elements:
            if isinstance(element, ast.Subscript):
                element = element.value
            if isinstance(element, ast.Attribute):
                found.append(element)
    return found


def _writers(*, calls: bool = True) -> dict[tuple[str, str], set[str]]:
    """(what the attribute is read through: `planned`, `state` or `other`, its name) -> the
    plugin modules that write it (with `calls`, by calling a mutating method on it)."""
    writers: dict[tuple[str, str], set[str]] = defaultdict(set)
    for path in sorted(PLUGIN.glob("*.py")):
        if path.name == "planned.py":
            continue  # the defaults it is made with
        for node in ast.walk(ast.parse(path.read_text())):
            for attribute in _written(node, calls=calls):
                base = ast.unparse(attribute.value)
                kind = next(
                    (name for name in ("planned", "state") if base.split(".")[-1] == name),
                    "other",
                )
                writers[kind, attribute.attr].add(path.stem)
    return writers


def test_the_plan_is_written_by_the_pre_flight_alone() -> None:
    writers = _writers()
    fields = {field.name for field in dataclasses.fields(PlannedRun)}
    for name in fields - {"started_at"}:
        assert writers[("planned", name)] == {"preflight"}, name
    assert not writers[("planned", "started_at")]
    # Nor through any other name (the run's, say).
    assert {name: writers[("other", name)] for name in fields if writers[("other", name)]} == {}
    assert {name for (kind, name) in writers if kind == "planned"} <= fields


def test_each_field_of_the_report_has_the_writer_its_docstring_names() -> None:
    writers = _writers()
    data = set().union(*REPORT_WRITERS.values())
    collaborators = {field.name for field in dataclasses.fields(RunReport)} - data
    assert collaborators == {"run", "planned", "writer", "ledger", "skipped", "builds", "check"}
    for owner, names in REPORT_WRITERS.items():
        for name in names:
            assert writers[("state", name)] <= {owner}, name
    # The collaborators are made with the report, never put in place later.
    assigned = _writers(calls=False)
    assert not {
        name: assigned[("state", name)] for name in collaborators if assigned[("state", name)]
    }
    # What the pre-flight writes is the plan's, none of the report's own fields.
    assert not {
        name
        for (kind, name), owners in writers.items()
        if "preflight" in owners and kind == "state"
    }


def test_the_controller_state_is_made_where_its_plugins_are_registered() -> None:
    source = (PLUGIN / "__init__.py").read_text()
    made: dict[str, list[str]] = defaultdict(list)
    for function in ast.walk(ast.parse(source)):
        if isinstance(function, ast.FunctionDef):
            for node in ast.walk(function):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute):
                    name = ast.unparse(node.func)
                    if name in ("PlannedRun", "RunReport.of"):
                        made[name].append(function.name)
    assert dict(made) == {
        "PlannedRun": ["_register_reporters"],
        "RunReport.of": ["_register_reporters"],
    }
