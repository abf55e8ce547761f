"""The controller's account of every episode of a run: planned, selected, started, and how
it ended (a row, a failure, a skip), including what a resumed run kept."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from pytest_harbor.engine.failures import FailureKind
from pytest_harbor.engine.results import EpisodeResult
from pytest_harbor.run.metrics import (
    EpisodeStatus,
    TasksetScore,
    episode_status,
    score_taskset,
)
from pytest_harbor.writers.failures import FailureRecord, FailureStage
from pytest_harbor.writers.resume import ResumePoint
from pytest_harbor.writers.summary import EpisodeEntry

__all__ = ["EpisodeLedger", "TrialRecord", "trial_id", "trial_of"]


def task_node_id(taskset: str, task_id: str) -> str:
    """A task's node id: `quickstart/hello`; `hello` alone when the taskset has the task's
    name (a task folder given as the target)."""
    return taskset if task_id == taskset else f"{taskset}/{task_id}"


def trial_id(taskset: str, task_id: str, repeat: int) -> str:
    """A trial's node id: `quickstart/hello::r0` (`hello::r0`, see task_node_id)."""
    return f"{task_node_id(taskset, task_id)}::r{repeat}"


def split_trial(trial: str) -> tuple[str, str, str]:
    """`quickstart/hello::r0` -> (`quickstart`, `hello`, `r0`); `hello::r0` -> (`hello`,
    `hello`, `r0`)."""
    path, _, name = trial.rpartition("::")
    taskset, slash, task = path.partition("/")
    return taskset, task if slash else taskset, name


def trial_of(nodeid: str) -> str:
    """The trial of an item: `quickstart/hello::r0::episode` -> `quickstart/hello::r0`."""
    return nodeid.rsplit("::", 1)[0]


@dataclass
class TrialRecord:
    """One task and repeat of a taskset."""

    taskset: str
    task_id: str
    repeat: int
    digest: str | None
    selected: bool = False
    started: bool = False
    #: When its first item began (time.monotonic(), on the controller).
    began_at: float | None = None
    seeded: bool = False
    step: str | None = None
    result: EpisodeResult | None = None
    failure: FailureRecord | None = None
    skip_reason: str | None = None
    earlier: bool = False

    @property
    def finished(self) -> bool:
        return self.result is not None or self.failure is not None

    @property
    def stage(self) -> FailureStage:
        return "turn" if self.seeded else "seed"


@dataclass
class EpisodeLedger:
    run_id: str
    agent: str
    validation: bool
    pass_reward: float
    trials: dict[str, TrialRecord] = field(default_factory=dict)
    repeats: dict[str, int] = field(default_factory=dict)

    def plan(self, taskset: str, repeats: int, digests: dict[str, str]) -> list[str]:
        """Every task and repeat of a taskset; return the trials' ids."""
        self.repeats[taskset] = repeats
        planned = []
        for task_id, digest in sorted(digests.items()):
            for repeat in range(repeats):
                trial = trial_id(taskset, task_id, repeat)
                self.trials[trial] = TrialRecord(taskset, task_id, repeat, digest)
                planned.append(trial)
        return planned

    def keep(self, point: ResumePoint) -> list[str]:
        """Take over what the resumed run finished; return those trials' ids."""
        kept = []
        for key, result in point.results.items():
            kept.append(self._kept(point.taskset, key, result=result))
        for failure in point.kept_failures:
            kept.append(
                self._kept(point.taskset, (failure.task_id, failure.repeat), failure=failure)
            )
        return kept

    def _kept(
        self,
        taskset: str,
        key: tuple[str, int],
        *,
        result: EpisodeResult | None = None,
        failure: FailureRecord | None = None,
    ) -> str:
        task_id, repeat = key
        trial = trial_id(taskset, task_id, repeat)
        digest = result.digest if result is not None else failure.digest if failure else None
        record = self.trials.setdefault(trial, TrialRecord(taskset, task_id, repeat, digest))
        record.result, record.failure, record.earlier = result, failure, True
        return trial

    def select(self, nodeids: Iterable[str]) -> None:
        for nodeid in nodeids:
            record = self.trials.get(trial_of(nodeid))
            if record is not None:
                record.selected = True

    def get(self, nodeid: str) -> TrialRecord | None:
        return self.trials.get(trial_of(nodeid))

    def failed(self, record: TrialRecord, kind: str, reason: str) -> FailureRecord | None:
        """Record that the episode ended with no result; None when it already ended."""
        if record.finished:
            return None
        stage: FailureStage = "queue" if kind == FailureKind.QUEUE_TIMEOUT else record.stage
        record.failure = FailureRecord.new(
            failure_kind=kind,
            failure_reason=reason,
            stage=stage,
            step=record.step if stage == "turn" else None,
            task_id=record.task_id,
            taskset=record.taskset,
            repeat=record.repeat,
            agent=self.agent,
            digest=record.digest,
            run_id=self.run_id,
        )
        return record.failure

    def interrupted(self) -> list[FailureRecord]:
        """Episodes that started and never ended: the run was interrupted under them."""
        found = []
        for record in self.trials.values():
            if record.started and not record.finished and record.skip_reason is None:
                failure = self.failed(
                    record,
                    FailureKind.INTERRUPTED,
                    "the run was interrupted before the episode ended",
                )
                if failure is not None:
                    found.append(failure)
        return found

    def entries(self, taskset: str) -> Iterator[EpisodeEntry]:
        """This run's episodes of `taskset`: those it selected, and those it kept."""
        for record in sorted(
            (r for r in self.trials.values() if r.taskset == taskset),
            key=lambda r: (r.task_id, r.repeat),
        ):
            if not (record.selected or record.earlier):
                continue
            yield EpisodeEntry(
                task_id=record.task_id,
                repeat=record.repeat,
                digest=record.digest,
                status=self.status(record),
                result=record.result,
                failure=record.failure,
                skip_reason=record.skip_reason,
                earlier=record.earlier,
            )

    def ran_any(self, taskset: str) -> bool:
        """Whether any trial of `taskset` started, ended or was skipped in this run."""
        return any(
            record.started or record.finished or record.skip_reason is not None
            for record in self.trials.values()
            if record.taskset == taskset and not record.earlier
        )

    def status(self, record: TrialRecord) -> EpisodeStatus:
        """What became of the episode: scored, no result, skipped, or not run (yet)."""
        if record.result is not None:
            return episode_status(
                record.result, validation=self.validation, pass_reward=self.pass_reward
            )
        if record.failure is not None:
            return "no_result"
        if record.skip_reason is not None:
            return "skipped"
        return "not_run"

    def score(self, taskset: str) -> TasksetScore:
        return score_taskset(
            (
                (
                    entry.task_id,
                    entry.status,
                    entry.result,
                    (entry.result.failure_kind if entry.result else None)
                    or (entry.failure.failure_kind if entry.failure else None),
                )
                for entry in self.entries(taskset)
            ),
            repeats=self.repeats.get(taskset, 1),
        )
