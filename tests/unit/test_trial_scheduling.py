"""TrialScheduling on xdist's own queue, with stand-in workers: a trial's turns go to one
worker, longest first, and a trial whose worker dies is not run again; and the names of
xdist it relies on exist in the installed xdist."""

from __future__ import annotations

from collections import OrderedDict
from types import SimpleNamespace
from typing import Any

from xdist.scheduler import LoadScopeScheduling

from pytest_harbor.plugin.scheduling import TrialScheduling, trial_scheduler

COLLECTION = [
    "ds/short::r0::episode",
    "ds/multi::r0::one",
    "ds/multi::r0::two",
    "ds/long::r0::episode",
    "ds/tiny::r0::episode",
    "ds/tiny::r1::episode",
    "tests/test_x.py::test_plain",
]
TRIALS = frozenset({"ds/short::r0", "ds/multi::r0", "ds/long::r0", "ds/tiny::r0", "ds/tiny::r1"})
EXPECTED = {"ds/tiny": 0.5, "ds/short": 1.0, "ds/multi": 5.0, "ds/long": 50.0}

#: What TrialScheduling overrides of xdist's LoadScopeScheduling, and the state of it
#: that it reads: an xdist that renames one fails here, not in a run.
OVERRIDDEN = ("_split_scope", "_assign_work_unit", "remove_node")
STATE = ("workqueue", "assigned_work", "registered_collections")


class Worker:
    """What xdist's scheduler asks of a worker."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[str] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(COLLECTION[index] for index in indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def config(**options: Any) -> Any:
    """The parts of pytest's config xdist's scheduler and trial_scheduler read."""
    values = {"tx": ["2*popen"], "failedfirst": False, **options}
    return SimpleNamespace(
        getvalue=values.__getitem__,
        getoption=lambda name, default=None: values.get(name, default),
        option=SimpleNamespace(loadscopereorder=True),
        pluginmanager=SimpleNamespace(hasplugin=lambda name: name in values.get("plugins", ())),
        cache=SimpleNamespace(get=lambda key, default: values.get(key, default)),
    )


def scheduled(scheduler: Any) -> tuple[Worker, Worker]:
    workers = Worker("gw0"), Worker("gw1")
    for worker in workers:
        scheduler.add_node(worker)
        scheduler.add_node_collection(worker, COLLECTION)
    scheduler.schedule()
    return workers


def test_trials_go_out_longest_first_each_on_one_worker() -> None:
    first, second = scheduled(TrialScheduling(config(), trials=TRIALS, expected=EXPECTED))
    assert first.sent == ["ds/long::r0::episode", "ds/short::r0::episode"]
    assert second.sent == ["ds/multi::r0::one", "ds/multi::r0::two", "ds/tiny::r0::episode"]


def test_without_expected_times_xdist_keeps_its_own_order() -> None:
    first, second = scheduled(TrialScheduling(config(), trials=TRIALS))
    # xdist's `loadscope` reorder: the scopes with the most tests first, ties as collected.
    assert first.sent == ["ds/multi::r0::one", "ds/multi::r0::two", "ds/long::r0::episode"]
    assert second.sent == ["ds/short::r0::episode", "ds/tiny::r0::episode"]


def test_failed_first_and_a_shuffled_order_are_kept() -> None:
    failed = {"cache/lastfailed": {"ds/short::r0::episode": True}, "failedfirst": True}
    first, _ = scheduled(trial_scheduler(config(**failed), None, TRIALS, EXPECTED))
    assert first.sent[0] == "ds/short::r0::episode"
    shuffled = trial_scheduler(config(plugins=("randomly",)), None, TRIALS, EXPECTED)
    assert shuffled.expected is None


def test_a_trial_whose_worker_dies_is_not_run_again_and_its_waiting_ones_move() -> None:
    scheduler = TrialScheduling(config(), trials=TRIALS, expected=EXPECTED)
    first, second = scheduled(scheduler)
    waiting = ["ds/tiny::r1", "tests/test_x.py::test_plain"]
    assert list(scheduler.workqueue) == waiting
    assert scheduler.remove_node(first) == "ds/long::r0::episode"
    # The dead worker's unstarted trial went back to the queue, behind what waited there.
    assert list(scheduler.workqueue) == [*waiting, "ds/short::r0"]
    assert scheduler.remove_node(second) == "ds/multi::r0::one"
    assert list(scheduler.workqueue) == [*waiting, "ds/short::r0", "ds/tiny::r0"]


def test_a_worker_that_finished_its_work_leaves_nothing_behind() -> None:
    scheduler = TrialScheduling(config(), trials=TRIALS, expected=EXPECTED)
    first, _ = scheduled(scheduler)
    for nodeid in first.sent:
        scheduler.mark_test_complete(first, COLLECTION.index(nodeid))
    assert scheduler.remove_node(first) is None
    assert list(scheduler.workqueue) == []


def test_the_xdist_names_trial_scheduling_relies_on_exist() -> None:
    own = {name for name in vars(TrialScheduling) if not name.startswith("__")}
    # Every method of xdist's it defines is in OVERRIDDEN (its own helpers apart).
    assert own - {"_rank_queue"} == set(OVERRIDDEN)
    for name in OVERRIDDEN:
        assert callable(getattr(LoadScopeScheduling, name, None)), name
    plain = LoadScopeScheduling(config())
    for name in STATE:
        assert isinstance(getattr(plain, name, None), dict), name
    assert isinstance(plain.workqueue, OrderedDict)  # ranked in place with move_to_end
