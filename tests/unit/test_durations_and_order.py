"""Longest first: what earlier runs recorded, what a task is expected to take without a
record, and the order xdist hands trials out in."""

from __future__ import annotations

import json
from pathlib import Path

from pytest_harbor.plugin.scheduling import longest_first
from pytest_harbor.run.durations import expected_seconds, read_history, record_history
from pytest_harbor.settings import HarborSettings
from pytest_harbor.tasks import load_task
from tests.fixtures import write_task


def row(task: str, seed: float, agent: float, verify: float, build: float = 0.0) -> dict:
    return {
        "task_id": task,
        "timings": {"seed_s": seed, "agent_s": agent, "verify_s": verify, "build_s": build},
    }


def test_the_record_keeps_each_tasks_median_episode_and_longest_build(tmp_path: Path) -> None:
    record_history(
        tmp_path,
        [row("a", 0.1, 1.0, 0.9), row("a", 0.1, 3.0, 0.9), row("a", 0.1, 2.0, 0.9, build=40.0)],
    )
    assert read_history(tmp_path) == {"a": {"episode_s": 3.0, "build_s": 40.0}}
    record_history(tmp_path, [row("b", 0.0, 0.5, 0.5)])
    history = read_history(tmp_path)
    assert history["a"]["episode_s"] == 3.0, "a later run keeps what it did not see"
    assert history["b"] == {"episode_s": 1.0}
    (tmp_path / "durations.json").write_text("not json")
    assert read_history(tmp_path) == {}


def test_without_a_record_a_task_is_expected_to_take_its_budget(tmp_path: Path) -> None:
    toml = "[agent]\ntimeout_sec = 100\n[verifier]\ntimeout_sec = 20\n"
    toml += '[environment]\ndocker_image = "x"\n'
    task = load_task(write_task(tmp_path, "budgeted", toml=toml))
    settings = HarborSettings()
    assert expected_seconds(task, settings, {}) >= 120
    assert expected_seconds(task, settings, {"budgeted": {"episode_s": 7.5}}) == 7.5


def scope(nodeid: str) -> str:
    return nodeid.rsplit("::", 1)[0]


def test_trials_go_out_longest_first_with_their_turns_together() -> None:
    ids = [
        "ds/short::r0::episode",
        "ds/multi::r0::one",
        "ds/multi::r0::two",
        "ds/long::r0::episode",
        "ds/long::r1::episode",
        "tests/test_x.py::test_plain",
    ]
    expected = {"ds/short": 1.0, "ds/multi": 5.0, "ds/long": 50.0}
    assert longest_first(ids, scope, expected, frozenset()) == [
        "ds/long::r0::episode",
        "ds/long::r1::episode",
        "ds/multi::r0::one",
        "ds/multi::r0::two",
        "ds/short::r0::episode",
        "tests/test_x.py::test_plain",
    ]


def test_failed_first_still_goes_first() -> None:
    ids = ["ds/short::r0::episode", "ds/long::r0::episode"]
    expected = {"ds/short": 1.0, "ds/long": 50.0}
    failed = frozenset({"ds/short::r0::episode"})
    assert longest_first(ids, scope, expected, failed)[0] == "ds/short::r0::episode"
    assert json.dumps(longest_first(ids, scope, {}, frozenset())) == json.dumps(ids)
