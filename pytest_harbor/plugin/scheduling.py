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
from xdist.scheduler import LoadScopeScheduling

from pytest_harbor.plugin.nodes import HarborTrial, HarborTurnItem

__all__ = [
    "SPLITTING_MODES",
    "TrialScheduling",
    "keep_turns_together",
    "longest_first",
    "trial_scheduler",
]

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
) -> TrialScheduling:
    """The run's scheduler: trials longest first when `expected` (seconds per
    `<taskset>/<task>`) is known, unless pytest-randomly shuffled the order (it keeps it);
    `--ff`'s failures still go first."""
    ranking = expected if expected and not config.pluginmanager.hasplugin("randomly") else None
    first: frozenset[str] = frozenset()
    if ranking and config.getoption("failedfirst", False) and config.cache is not None:
        first = frozenset(config.cache.get("cache/lastfailed", {}))
    return TrialScheduling(config, log, trials=trials, expected=ranking, first=first)


class TrialScheduling(LoadScopeScheduling):  # type: ignore[misc]
    """xdist's scope scheduling, with a trial (`<taskset>/<task>::r<N>`) as the scope of
    its turns and every other test a scope of its own (as plain `load` treats it).

    With `expected` (seconds per `<taskset>/<task>`), xdist's queue is put in longest-first
    order before it hands out the first trial, so that a long one does not start last and
    run alone at the end; `first` (`--ff`'s failures) go before the rest."""

    def __init__(
        self,
        config: pytest.Config,
        log: Any = None,
        *,
        trials: frozenset[str],
        expected: Mapping[str, float] | None = None,
        first: frozenset[str] = frozenset(),
    ) -> None:
        super().__init__(config, log)
        self.trials = trials
        self.expected = expected
        self.first = first
        #: The queue is in longest-first order (done once, before the first trial goes out).
        self.ranked = False

    def _split_scope(self, nodeid: str) -> str:
        scope = nodeid.rsplit("::", 1)[0]
        return scope if scope in self.trials else nodeid

    def _assign_work_unit(self, node: Any) -> None:
        """xdist's own, from a queue ranked once, when the first trial goes out (xdist has
        made its queue by then). A trial put back after a worker died joins the queue's
        end, so it comes after the others."""
        if self.expected is not None and not self.ranked:
            self._rank_queue(self.expected)
            self.ranked = True
        super()._assign_work_unit(node)

    def _rank_queue(self, expected: Mapping[str, float]) -> None:
        queue = self.workqueue
        ranked = longest_first(
            [nodeid for unit in queue.values() for nodeid in unit],
            self._split_scope,
            expected,
            self.first,
        )
        for scope in dict.fromkeys(self._split_scope(nodeid) for nodeid in ranked):
            queue.move_to_end(scope)

    def remove_node(self, node: Any) -> str | None:
        """A worker is gone. Its unstarted trials go to the others (xdist's own); the trial
        it was running does not (xdist would run it again): its episode is lost, and the
        failures file says so."""
        workload = self.assigned_work[node]
        crashed: str | None = next(
            (nodeid for unit in workload.values() for nodeid, done in unit.items() if not done),
            None,
        )
        if crashed is not None:
            # Neither the lost trial nor the units the worker finished go back to the queue.
            finished = {scope for scope, unit in workload.items() if all(unit.values())}
            for scope in finished | {self._split_scope(crashed)}:
                del workload[scope]
        super().remove_node(node)
        return crashed
