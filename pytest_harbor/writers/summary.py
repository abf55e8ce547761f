"""`rollouts_run_summary.json`: what ran, every file of the run, and per task and repeat
its status, reward and log paths. Every path is relative to the summary's own folder, so a
results folder moved as a whole still resolves (rows name their log folders absolutely)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_harbor import strict_json
from pytest_harbor.engine.results import EpisodeResult, TurnResult
from pytest_harbor.redaction import Redactor
from pytest_harbor.run.metrics import EpisodeStatus, TasksetScore
from pytest_harbor.writers.failures import FailureRecord
from pytest_harbor.writers.files import write_atomically
from pytest_harbor.writers.manifest import RunManifest
from pytest_harbor.writers.rollouts import SUMMARY, ResultsLayout

__all__ = ["EpisodeEntry", "run_summary", "write_run_summary"]

#: The harness's own log of a turn, when it kept one: the oracle's, a CLI agent's.
_AGENT_LOGS = ("oracle.txt", "stdout.txt")
#: The files a verification leaves, under the names the summary gives them.
_LOG_FILES = {
    "test_stdout": ("test-stdout.txt",),
    "reward_file": ("reward.json", "reward.txt"),
    "trajectory": ("trajectory.json",),
}


@dataclass
class EpisodeEntry:
    """One task and repeat as the run ends."""

    task_id: str
    repeat: int
    digest: str | None
    status: EpisodeStatus
    result: EpisodeResult | None = None
    failure: FailureRecord | None = None
    skip_reason: str | None = None
    #: The row or failure comes from the run this one resumed.
    earlier: bool = False


def run_summary(
    layout: ResultsLayout,
    manifest: RunManifest,
    *,
    finished_at: str,
    interrupted: bool,
    episodes: Iterable[EpisodeEntry],
    score: TasksetScore,
) -> dict[str, Any]:
    taskset = manifest.taskset
    folder = layout.taskset_dir(taskset)

    def relative(path: str | Path) -> str:
        return os.path.relpath(Path(path), folder)

    named = {
        "rollouts": layout.rollouts_file(taskset),
        "failures": layout.failures_file(taskset),
        "manifest": layout.manifest_file(taskset),
        "skipped": layout.skipped_file(taskset),
        "tasks": layout.tasks_file(taskset, manifest.agent),
        "verifier": layout.verifier_root_of(taskset),
        "agent": layout.agent_root_of(taskset),
        "artifacts": layout.artifacts_root_of(taskset),
    }
    return {
        "schema_version": 1,
        "run_id": manifest.run_id,
        "started_at": manifest.started_at,
        "finished_at": finished_at,
        "interrupted": interrupted,
        "target": relative(manifest.target),
        "taskset": taskset,
        "agent": manifest.agent,
        "model": manifest.model,
        "sandbox": manifest.sandbox,
        "repeats": manifest.repeats,
        "dataset_digest": manifest.dataset_digest,
        "settings": manifest.settings,
        "files": {name: relative(path) for name, path in named.items() if path.exists()},
        "all_files": sorted(relative(path) for path in _files(folder, named["verifier"])),
        "counts": {
            "episodes": score.episodes,
            **{
                status: score.count(status)
                for status in (
                    "passed",
                    "failed",
                    "masked",
                    "partial",
                    "no_result",
                    "skipped",
                    "not_run",
                )
            },
            "mean_reward": score.mean_reward,
        },
        "usage": None if score.usage is None else score.usage.model_dump(mode="json"),
        "usage_per_task": {
            task: usage.model_dump(mode="json")
            for task, usage in sorted(score.usage_per_task.items())
        },
        "failure_kinds": dict(sorted(score.failure_kinds.items())),
        "pass_at_k": {str(k): value for k, value in score.pass_at_k.items()},
        "pass_at_k_per_task": {
            str(k): per_task for k, per_task in score.pass_at_k_per_task.items()
        },
        "episodes": [_episode(entry, relative) for entry in episodes],
    }


def _episode(entry: EpisodeEntry, relative: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "task_id": entry.task_id,
        "repeat": entry.repeat,
        "status": entry.status,
        "digest": entry.digest,
        "from_earlier_run": entry.earlier,
    }
    if entry.result is not None:
        result = entry.result
        data.update(
            reward=result.reward,
            mask_sample=result.mask_sample,
            failure_kind=result.failure_kind,
            failure_reason=result.failure_reason,
            failure_cause=result.failure_cause,
            partial=result.partial,
            usage=None if result.usage is None else result.usage.model_dump(mode="json"),
            retried_usage=None
            if result.retried_usage is None
            else result.retried_usage.model_dump(mode="json"),
            logs=[_logs(turn, relative) for turn in result.turns],
        )
    elif entry.failure is not None:
        failure = entry.failure
        data.update(
            reward=None,
            failure_kind=failure.failure_kind,
            failure_reason=failure.failure_reason,
            stage=failure.stage,
            retry=failure.retry,
        )
    elif entry.skip_reason is not None:
        data["skip_reason"] = entry.skip_reason
    return data


def _logs(turn: TurnResult, relative: Any) -> dict[str, Any]:
    logs: dict[str, Any] = {"step": turn.step, "verifier_dir": None}
    folder, agent_folder = turn.verifier_logs_dir, turn.agent_logs_dir
    if agent_folder is not None and Path(agent_folder).is_dir():
        logs["agent_dir"] = relative(agent_folder)
        for name in _AGENT_LOGS:
            if (Path(agent_folder) / name).is_file():
                logs["agent_log"] = relative(Path(agent_folder) / name)
                break
    if turn.artifacts_dir is not None and Path(turn.artifacts_dir).is_dir():
        logs["artifacts_dir"] = relative(turn.artifacts_dir)
    if folder is not None and Path(folder).is_dir():
        logs["verifier_dir"] = relative(folder)
        for name, candidates in _LOG_FILES.items():
            for candidate in candidates:
                if (Path(folder) / candidate).is_file():
                    logs[name] = relative(Path(folder) / candidate)
                    break
    if agent_folder is not None and (Path(agent_folder) / "trajectory.json").is_file():
        # Kept with the harness's files; the verifier's copy is the earlier layout's.
        logs["trajectory"] = relative(Path(agent_folder) / "trajectory.json")
    return logs


def _files(folder: Path, verifier_root: Path) -> set[Path]:
    found = set()
    for root in {folder, verifier_root}:
        if not root.is_dir():
            continue
        for path in root.rglob("*"):
            if path.is_file() and not path.name.startswith(".") and path.name != SUMMARY:
                found.add(path)
    return found


def write_run_summary(
    layout: ResultsLayout,
    taskset: str,
    summary: dict[str, Any],
    redactor: Redactor,
) -> Path:
    path = layout.summary_file(taskset)
    summary = redactor.data(summary)
    write_atomically(path, strict_json.dumps(summary, indent=2, sort_keys=False) + "\n")
    return path
