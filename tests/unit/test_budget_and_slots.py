"""The episode time budget and the cross-process episode cap."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest

from pytest_harbor.engine.budget import episode_budget
from pytest_harbor.engine.failures import EpisodeError, FailureKind
from pytest_harbor.locks import Pace, Slots
from pytest_harbor.settings import HarborSettings
from pytest_harbor.tasks import load_task
from tests.fixtures import BASE_IMAGE, write_task


def task_with(tmp_path: Path, agent: float | None, verifier: float = 100.0, hooks: int = 0):  # type: ignore[no-untyped-def]
    agent_line = "" if agent is None else f"timeout_sec = {agent}"
    collect = "".join(f'[[verifier.collect]]\ncommand = "hook {i}"\n' for i in range(hooks))
    return load_task(
        write_task(
            tmp_path,
            "timed",
            toml=f"[agent]\n{agent_line}\n[verifier]\ntimeout_sec = {verifier}\n{collect}"
            f'[environment]\ndocker_image = "{BASE_IMAGE}"\n',
        )
    )


def test_figures_sum_the_phases(tmp_path: Path) -> None:
    settings = HarborSettings(
        harness_setup_allowance_s=300,
        verifier_grace_s=30,
        sandbox_ready_timeout_s=900,
        cleanup_timeout_seconds=180,
        image_pull_retries=2,
    )
    budget = episode_budget(
        task_with(tmp_path, agent=1000, hooks=2), settings, separate_verifier=False
    )
    turns = 300 + 1000 + 2 * 30 + 100 + 30
    assert budget.turns_s == turns
    assert budget.nominal_s == turns + 900
    assert budget.worst_s == turns + (900 + 180) * 3
    assert budget.deadline_s == budget.worst_s
    assert budget.warning is None
    separate = episode_budget(
        task_with(tmp_path / "b", agent=1000, hooks=2), settings, separate_verifier=True
    )
    assert separate.turns_s == turns + 900


def test_above_the_default_the_deadline_follows_the_worst_case_with_a_warning(
    tmp_path: Path,
) -> None:
    settings = HarborSettings(default_episode_timeout_seconds=3000)
    budget = episode_budget(task_with(tmp_path, agent=2000), settings, separate_verifier=False)
    assert budget.deadline_s == budget.worst_s
    assert budget.worst_s is not None and budget.worst_s > 3000
    assert budget.warning is not None
    for figure in (budget.turns_s, budget.nominal_s, budget.worst_s):
        assert f"{figure:g} s" in budget.warning


def test_without_enforcement_the_default_is_the_deadline(tmp_path: Path) -> None:
    settings = HarborSettings(enforce_task_timeouts=False, default_episode_timeout_seconds=3000)
    budget = episode_budget(task_with(tmp_path, agent=100), settings, separate_verifier=False)
    assert budget.deadline_s == 3000
    # Nominal (turns 530 + 900) fits; the worst case (turns + 3 x 1080) does not.
    assert budget.warning is not None and "only without a retried seed" in budget.warning


def test_without_enforcement_a_task_that_cannot_fit_is_refused(tmp_path: Path) -> None:
    settings = HarborSettings(enforce_task_timeouts=False, default_episode_timeout_seconds=1000)
    with pytest.raises(EpisodeError) as caught:
        episode_budget(task_with(tmp_path, agent=600), settings, separate_verifier=False)
    assert caught.value.failure_kind == FailureKind.BUDGET_REFUSED
    message = str(caught.value)
    assert "enforce_task_timeouts off" in message
    assert "raise default_episode_timeout_seconds to at least 1930 s" in message


def test_an_unbounded_agent_gets_the_default(tmp_path: Path) -> None:
    budget = episode_budget(
        task_with(tmp_path, agent=None), HarborSettings(), separate_verifier=False
    )
    assert (budget.turns_s, budget.deadline_s, budget.warning) == (None, 21600, None)


def _hold(folder: str, seconds: float, started: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    slot = Slots(Path(folder), 1).acquire(5)
    assert slot is not None
    started.set()
    time.sleep(seconds)
    slot.release()


def test_slots_are_shared_between_processes(tmp_path: Path) -> None:
    started = multiprocessing.Event()
    holder = multiprocessing.Process(target=_hold, args=(str(tmp_path), 1.0, started))
    holder.start()
    assert started.wait(10)
    slots = Slots(tmp_path, 1)
    assert slots.acquire(0.1) is None  # the other process holds the only slot
    slot = slots.acquire(10)  # ... until it lets go
    assert slot is not None
    slot.release()
    holder.join()


def test_a_dead_process_gives_its_slot_back(tmp_path: Path) -> None:
    started = multiprocessing.Event()
    holder = multiprocessing.Process(target=_hold, args=(str(tmp_path), 60.0, started))
    holder.start()
    assert started.wait(10)
    holder.kill()
    holder.join()
    slot = Slots(tmp_path, 1).acquire(5)
    assert slot is not None
    slot.release()


def test_a_steps_setup_and_healthcheck_count_in_its_turn(tmp_path: Path) -> None:
    task_dir = write_task(
        tmp_path,
        "stepped",
        toml=(
            "[agent]\ntimeout_sec = 100\n[verifier]\ntimeout_sec = 10\n"
            f'[environment]\ndocker_image = "{BASE_IMAGE}"\n'
            '[[steps]]\nname = "a"\n'
            '[[steps]]\nname = "b"\n'
            '[steps.healthcheck]\ncommand = "true"\ninterval_sec = 2\ntimeout_sec = 3\n'
            "retries = 4\nstart_period_sec = 5\n"
        ),
        extra_files={
            "steps/a/instruction.md": "a\n",
            "steps/b/instruction.md": "b\n",
            "steps/b/workdir/setup.sh": "true\n",
        },
    )
    task = load_task(task_dir)
    plain = HarborSettings(harness_setup_allowance_s=0, verifier_grace_s=0)
    per_turn = 100 + 10
    healthcheck = 5 + 4 * (3 + 2)
    budget = episode_budget(task, plain, separate_verifier=False)
    # The set-up is bounded by the step's agent budget unless step_setup_timeout_s says.
    assert budget.turns_s == 2 * per_turn + 100 + healthcheck
    bounded = plain.model_copy(update={"step_setup_timeout_s": 7.0})
    assert episode_budget(task, bounded, separate_verifier=False).turns_s == (
        2 * per_turn + 7 + healthcheck
    )


def _paced(folder: str, times: int, moments: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    pace = Pace(Path(folder), 20.0)
    for _ in range(times):
        pace.wait()
        moments.put(time.time())


def test_a_pace_spaces_events_across_processes(tmp_path: Path) -> None:
    """Three processes take 4 turns each at 20 a second: 12 turns, 50 ms apart whoever
    takes them, span at least 550 ms (less a little for a first turn taken late)."""
    moments: multiprocessing.Queue[float] = multiprocessing.Queue()
    workers = [
        multiprocessing.Process(target=_paced, args=(str(tmp_path), 4, moments)) for _ in range(3)
    ]
    for worker in workers:
        worker.start()
    taken = sorted(moments.get(timeout=30) for _ in range(12))
    for worker in workers:
        worker.join()
    assert taken[-1] - taken[0] >= 0.5, taken
