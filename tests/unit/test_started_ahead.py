"""Sandboxes started ahead of their episodes (engine/ahead.py): used when their episode
comes, removed when they waited too long for it."""

from __future__ import annotations

import time
from pathlib import Path

from pytest_harbor.settings import HarborSettings
from tests.fake_provider import FakeProvider
from tests.unit.test_episode_turns import ScriptedHarness, _works, episode_of, single_step_task


def _run_started_ahead(tmp_path: Path, settings: HarborSettings, wait_s: float) -> FakeProvider:
    provider = FakeProvider()
    episode = episode_of(
        single_step_task(tmp_path), tmp_path, provider, ScriptedHarness(_works), settings
    )
    try:
        episode.start_early()
        time.sleep(wait_s)
        episode.seed()
        episode.run_turn(episode.task.turns[0])
        assert episode.result().reward == 1.0
    finally:
        episode.cleanup()
    return provider


def test_a_sandbox_started_ahead_is_the_episodes(tmp_path: Path) -> None:
    provider = _run_started_ahead(tmp_path, HarborSettings(), wait_s=0.3)
    assert len(provider.sandboxes) == 1


def test_a_sandbox_that_waited_too_long_is_removed_and_the_seed_starts_afresh(
    tmp_path: Path,
) -> None:
    provider = _run_started_ahead(tmp_path, HarborSettings(started_ahead_idle_s=0.2), wait_s=1.0)
    first, second = provider.sandboxes
    assert first.stopped  # removed when its wait ran out, not used
    assert all(call.sandbox == second.id for call in provider.calls if call.kind != "survey")
