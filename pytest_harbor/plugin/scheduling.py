"""The turns of a trial run in order, on one worker, and a later turn brings its earlier ones.

Selection (`-k`, `-m`, `--lf`, `--deselect`) may keep a later step of a multi-step task and
drop an earlier one; the earlier steps' state is the later step's input, so they run too.
Under pytest-xdist the default `load` distribution becomes trial-grouped; modes that would
split a trial are refused. A trial whose worker dies is not run again in the same session.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from pytest_harbor.plugin.nodes import HarborTrial, HarborTurnItem

__all__ = ["SPLITTING_MODES", "keep_turns_together", "longest_first", "trial_scheduler"]

#: xdist modes that may send the turns of one trial to different workers (or, for
#: loadgroup, rewrite node ids).
SPLITTING_MODES = ("worksteal", "loadgroup")


def keep_turns_together(items: list[pytest.Item], config: pytest.Config) -> None:
    """Reorder `items` in place: each trial's turns contiguous and in the task's order,
    from its first turn through the last one selected."""
    selected = {id(item) for item in items}
    ordered: list[pytest.Item] = []
    seen: set[int] = set()
    added: list[pytest.Item] = []
    for item in items:
        if not isinstance(item, HarborTurnItem):
            ordered.append(item)
            continue
        trial: HarborTrial = item.trial
        if id(trial) in seen:
            continue
        seen.add(id(trial))
        last = max(index for index, turn in enumerate(trial.turn_items) if id(turn) in selected)
        trial.selected = trial.turn_items[: last + 1]
        ordered.extend(trial.selected)
        added.extend(turn for turn in trial.selected if id(turn) not in selected)
    items[:] = ordered
    if added:
        _undo_deselection(config, added)


def _undo_deselection(config: pytest.Config, items: Iterable[pytest.Item]) -> None:
    """Earlier turns brought back do not count as deselected in the terminal's summary."""
    reporter: Any = config.pluginmanager.get_plugin("terminalreporter")
    deselected = getattr(reporter, "stats", {}).get("deselected")
    if deselected:
        back = {id(item) for item in items}
        deselected[:] = [item for item in deselected if id(item) not in back]


def longest_first(
    nodeids: list[str], scope_of: Any, expected: Mapping[str, float], first: frozenset[str]
) -> list[str]:
    """`nodeids` grouped by scope (each scope's ids in their order), the scopes holding a
    node id of `first` (`--ff`'s failures) first, then by expected seconds, longest first;
    ties keep their order."""
    groups: dict[str, list[str]] = {}
    for nodeid in nodeids:
        groups.setdefault(scope_of(nodeid), []).append(nodeid)
    ranked = sorted(
        groups.items(),
        key=lambda item: (
            not any(nodeid in first for nodeid in item[1]),
            -expected.get(item[0].rsplit("::", 1)[0], 0.0),
        ),
    )
    return [nodeid for _, ids in ranked for nodeid in ids]


def trial_scheduler(
    config: pytest.Config,
    log: Any,
    trials: frozenset[str],
    expected: Mapping[str, float] | None = None,
) -> Any:
    """xdist's scope scheduling, with a trial (`<taskset>/<task>::r<N>`) as the scope of
    its turns and every other test a scope of its own (as plain `load` treats it).

    With `expected` (seconds per `<taskset>/<task>`), the trials go out longest first, so
    that a long one does not start last and run alone at the end; `--ff`'s failures still
    go first, and a run whose order pytest-randomly shuffled keeps it."""
    from xdist.scheduler import LoadScopeScheduling

    reorder = bool(expected) and not config.pluginmanager.hasplugin("randomly")
    first: frozenset[str] = frozenset()
    if reorder and config.getoption("failedfirst", False) and config.cache is not None:
        first = frozenset(config.cache.get("cache/lastfailed", {}))

    class TrialScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            scope = nodeid.rsplit("::", 1)[0]
            return scope if scope in trials else nodeid

        def _assign_work_unit(self, node: Any) -> None:
            """xdist's own, but the trial handed out is the first of the longest-first
            order still waiting (a trial put back after a worker died comes after)."""
            if not reorder:
                super()._assign_work_unit(node)
                return
            scope = self._next_scope()
            work_unit = self.workqueue.pop(scope)
            self.assigned_work.setdefault(node, {})[scope] = work_unit
            collection = self.registered_collections[node]
            node.send_runtest_some(
                [collection.index(nodeid) for nodeid, done in work_unit.items() if not done]
            )

        def _next_scope(self) -> str:
            if not hasattr(self, "_order"):
                ranked = longest_first(
                    [nodeid for unit in self.workqueue.values() for nodeid in unit],
                    self._split_scope,
                    expected or {},
                    first,
                )
                self._order = list(dict.fromkeys(self._split_scope(n) for n in ranked))
                self._position = 0
            while (
                self._position < len(self._order)
                and self._order[self._position] not in self.workqueue
            ):
                self._position += 1
            if self._position < len(self._order):
                return str(self._order[self._position])
            return str(next(iter(self.workqueue)))

        def remove_node(self, node: Any) -> str | None:
            """A worker is gone. Its unstarted trials go to the others; the trial it was
            running does not (xdist's scope scheduling would run it again): its episode
            is lost, and the failures file says so."""
            workload = self.assigned_work.pop(node)
            crashed: str | None = next(
                (nodeid for unit in workload.values() for nodeid, done in unit.items() if not done),
                None,
            )
            if crashed is None:
                return None
            workload.pop(self._split_scope(crashed), None)
            self.workqueue.update(
                (scope, unit) for scope, unit in workload.items() if not all(unit.values())
            )
            for other in self.assigned_work:
                self._reschedule(other)
            return crashed

    return TrialScheduling(config, log)
