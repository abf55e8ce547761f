"""The turns of a trial run in order, on one worker, and a later turn brings its earlier ones.

Selection (`-k`, `-m`, `--lf`, `--deselect`) may keep a later step of a multi-step task and
drop an earlier one; the earlier steps' state is the later step's input, so they run too.
Under pytest-xdist the default `load` distribution becomes trial-grouped; modes that would
split a trial are refused. A trial whose worker dies is not run again in the same session.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from pytest_harbor.plugin.nodes import HarborTrial, HarborTurnItem

__all__ = ["SPLITTING_MODES", "keep_turns_together", "trial_scheduler"]

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


def trial_scheduler(config: pytest.Config, log: Any, trials: frozenset[str]) -> Any:
    """xdist's scope scheduling, with a trial (`<taskset>/<task>::r<N>`) as the scope of
    its turns and every other test a scope of its own (as plain `load` treats it)."""
    from xdist.scheduler import LoadScopeScheduling

    class TrialScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            scope = nodeid.rsplit("::", 1)[0]
            return scope if scope in trials else nodeid

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
