"""Collection nodes: taskset (folder) -> task -> trial (repeat) -> item per turn."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

import pluggy
import pytest
from xdist import get_xdist_worker_id, is_xdist_worker

from pytest_harbor.display import escape_controls
from pytest_harbor.engine import Episode, EpisodeResult, TurnResult, decide_outcome
from pytest_harbor.engine.admission import model_route_refusal
from pytest_harbor.engine.budget import backstop_seconds
from pytest_harbor.engine.failures import EpisodeError, disk_full
from pytest_harbor.engine.outcomes import nop_check_outcome, probe_check_outcome
from pytest_harbor.engine.progress import EpisodeProgress
from pytest_harbor.engine.results import episode_id
from pytest_harbor.engine.verifiers import verifies_separately
from pytest_harbor.harnesses import Harness
from pytest_harbor.locks import FileLock
from pytest_harbor.plugin.ledger import task_node_id
from pytest_harbor.plugin.markers import metadata_markers
from pytest_harbor.plugin.payload import ReportPayload
from pytest_harbor.plugin.run import HARBOR_RUN, SETTLED_TRIALS, HarborRun, Target
from pytest_harbor.redaction import clip_head
from pytest_harbor.run.planning import TasksetPlan
from pytest_harbor.tasks import Task, TaskLoadError, Turn

__all__ = [
    "HarborDataset",
    "HarborTask",
    "HarborTaskset",
    "HarborTrial",
    "HarborTurnItem",
    "HarborWarning",
]

_TAIL_LINES = 30
#: The name of the nop trial of each task in check mode: `quickstart/hello::nop::episode`.
NOP_TRIAL = "nop"
#: And of the probe's (harnesses/probe.py): `quickstart/hello::probe::episode`.
PROBE_TRIAL = "probe"
_ANSWER_CHARS = 300


class HarborWarning(pytest.PytestWarning):
    """Something pytest-harbor ignored or could not do, worth a look; `line` is the line of
    task.toml it is about, when it is about one. Its message may quote a task or a
    sandbox: control characters in it are escaped."""

    line: int | None = None

    def __init__(self, message: str) -> None:
        super().__init__(escape_controls(message))


def task_warnings(task: Task) -> list[HarborWarning]:
    """What the loader ignored in a task folder: each unknown key (at its line, with the
    key it most likely misspells), legacy keys."""
    found = []
    for key in task.unknown_keys:
        line = task.unknown_key_lines.get(key)
        meant = task.unknown_key_meant.get(key)
        warning = HarborWarning(
            f"{task.path / 'task.toml'}: unknown key ignored: {key}"
            + (f" (line {line})" if line is not None else "")
            + (f": did you mean {meant}?" if meant else "")
        )
        warning.line = line
        found.append(warning)
    found += [HarborWarning(f"{task.path / 'task.toml'}: {note}") for note in task.notes]
    return found


def _run(node: pytest.Item | pytest.Collector) -> HarborRun:
    return node.config.stash[HARBOR_RUN]


class _HarborNode:
    """Hooks of harbor nodes come from outside the task folder, so no conftest.py in a
    task folder is ever imported."""

    session: pytest.Session
    _hook_path: Path

    @property
    def ihook(self) -> pluggy.HookRelay:
        return self.session.gethookproxy(self._hook_path)


class HarborTaskset(_HarborNode, pytest.Collector):
    """A target folder: one task, or a dataset of task folders up to six levels deep.

    Not a `pytest.Directory` when the target is one task: pytest imports the conftest.py
    of every Directory it collects, and nothing inside a task folder may be imported.
    """

    def __init__(self, *, target: Target, **kwargs: Any) -> None:
        # Ids name the taskset, not the folder's path: `quickstart/hello::r0::episode`.
        # A name is shown escaped (a folder whose name holds control characters is refused).
        taskset = escape_controls(target.taskset)
        super().__init__(name=taskset, nodeid=cast(Any, taskset), **kwargs)
        self.target = target
        self._hook_path = target.hook_path

    @classmethod
    def for_target(cls, parent: pytest.Collector, target: Target) -> HarborTaskset:
        kind = HarborTaskset if target.is_task else HarborDataset
        return kind.from_parent(parent, path=target.path, target=target)

    def collect(self) -> Iterator[HarborTask]:
        run = _run(self)
        try:
            plan = run.plan(self.target)
        except TaskLoadError as error:
            if run.options.skip_unloadable:
                # The taskset is left out as its tasks would be; the run goes on.
                warnings.warn(
                    HarborWarning(f"left out: {escape_controls(str(error))}"), stacklevel=1
                )
                return
            raise self.CollectError(escape_controls(str(error))) from None
        entries: list[tuple[Path, Task | None, TaskLoadError | None]] = [
            (task.path, task, None) for task in plan.tasks
        ]
        if not run.options.skip_unloadable:
            entries += [(path, None, failure) for path, failure in plan.failures.items()]
        taskset = escape_controls(self.target.taskset)
        for path, task, load_error in sorted(entries, key=lambda entry: entry[0]):
            yield HarborTask.from_parent(
                self,
                name=escape_controls(path.name),
                path=path,
                nodeid=task_node_id(taskset, escape_controls(path.name)),
                plan=plan,
                task=task,
                load_error=load_error,
            )


class HarborDataset(HarborTaskset, pytest.Directory):
    """A dataset folder: a Directory, so a conftest.py at its top applies as usual."""


class HarborTask(_HarborNode, pytest.Collector):
    """One task folder; a folder that did not load is its own collection error."""

    def __init__(
        self,
        *,
        plan: TasksetPlan,
        task: Task | None,
        load_error: TaskLoadError | None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        assert isinstance(self.parent, HarborTaskset)
        self.taskset = plan.taskset
        self.repeats = plan.repeats
        self.task = task
        self.load_error = load_error
        self._hook_path = self.parent.target.hook_path

    def collect(self) -> Iterator[HarborTrial]:
        if self.load_error is not None:
            raise self.CollectError(str(self.load_error))
        task = self.task
        assert task is not None
        if self.config.option.collectonly and not _run(self).is_worker:
            # A run warns once per task, from its start (not once per worker).
            for warning in task_warnings(task):
                # At the line of task.toml it is about, not at the collector.
                warnings.warn_explicit(
                    warning,
                    type(warning),
                    filename=str(task.path / "task.toml"),
                    lineno=warning.line or 1,
                )
        markers = metadata_markers(task.config.metadata)
        for marker in markers:
            self.config.addinivalue_line("markers", f"{marker}: from [metadata] of task folders")
        run = _run(self)
        skip_reason = run.harness.unavailable_reason(task) or model_route_refusal(
            task, run.harness, run.provider_for(task), relayed=run.model is not None
        )
        trials = [
            HarborTrial.from_parent(
                self, name=f"r{repeat}", task=task, repeat=repeat, skip_reason=skip_reason
            )
            for repeat in range(self.repeats)
        ]
        if run.check_harness is not None:
            # Check mode: an agent that does nothing must not pass the task.
            trials.append(
                HarborTrial.from_parent(
                    self,
                    name=NOP_TRIAL,
                    task=task,
                    repeat=0,
                    skip_reason=run.check_harness.unavailable_reason(task),
                    check_role="nop",
                )
            )
        if run.probe_harness is not None:
            # And one that only creates the files the tests name must score nothing.
            trials.append(
                HarborTrial.from_parent(
                    self,
                    name=PROBE_TRIAL,
                    task=task,
                    repeat=0,
                    skip_reason=run.probe_harness.unavailable_reason(task),
                    check_role="probe",
                )
            )
        for trial in trials:
            for marker in markers:
                trial.add_marker(marker)
            yield trial


class HarborTrial(_HarborNode, pytest.Collector):
    """One repeat of a task; its sandbox lives from setup() to teardown(), shared by the
    items of its turns, which run in order on one worker."""

    def __init__(
        self,
        *,
        task: Task,
        repeat: int,
        skip_reason: str | None,
        check_role: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        assert isinstance(self.parent, HarborTask)
        self.task = task
        self.repeat = repeat
        #: In check mode, `nop` for the trial of the empty agent (its row is not written).
        self.check_role = check_role
        self.taskset = self.parent.taskset
        self.skip_reason = skip_reason
        self._hook_path = self.parent._hook_path
        self.episode: Episode | None = None
        self.slot: FileLock | None = None
        #: Why the task could not be built, when --harbor-skip-unloadable skipped it.
        self.unloadable: str | None = None
        #: The turn in which the episode broke down with no result: later turns skip.
        self.lost_in: str | None = None
        #: One item per turn, in the task's order; `selected` is what this session runs.
        self.turn_items: list[HarborTurnItem] = []
        self.selected: list[HarborTurnItem] = []

    def collect(self) -> Iterator[HarborTurnItem]:
        self.turn_items = []
        settings = _run(self).settings
        backstop = backstop_seconds(
            self.task, settings, separate_verifier=verifies_separately(self.task, settings)
        )
        for turn in self.task.turns:
            item = HarborTurnItem.from_parent(self, name=turn.name, turn=turn)
            if self.skip_reason is not None:
                item.add_marker(pytest.mark.skip(reason=self.skip_reason))
            # pytest-timeout's timer, run by plugin/deadlines.py: a backstop only.
            item.add_marker(pytest.mark.timeout(backstop))
            self.turn_items.append(item)
        self.selected = list(self.turn_items)
        yield from self.turn_items

    @property
    def harness(self) -> Harness:
        run = _run(self)
        if self.check_role == "nop" and run.check_harness is not None:
            return run.check_harness
        if self.check_role == "probe" and run.probe_harness is not None:
            return run.probe_harness
        return run.harness

    @property
    def episode_name(self) -> str:
        """The name of its folders: `<task>__r<repeat>`, or `<task>__nop` in check mode."""
        if self.check_role is not None:
            return f"{self.task.id}__{self.check_role}"
        return episode_id(self.task.id, self.repeat)

    def _episode(self) -> Episode:
        if self.episode is None:
            run = _run(self)
            key = f"{self.taskset}/{self.task.id}"
            self.episode = Episode(
                self.task,
                taskset=self.taskset,
                repeat=self.repeat,
                name=self.episode_name,
                harness=self.harness,
                provider=run.provider_for(self.task),
                labels=run.labels(task=key, trial=self.nodeid),
                image_labels=run.image_labels(),
                settings=run.settings,
                expected_digest=self.config.stash[SETTLED_TRIALS].row_digests.get(
                    key, self.task.digest
                ),
                model=run.model,
                model_gate=run.model_gate,
                # Staged: the controller moves them into place with the episode's row, so
                # that an earlier run's folders stay untouched until then.
                agent_logs_dir=run.layout.staged_agent_dir(
                    self.taskset, run.run_id, self.episode_name
                ),
                verifier_logs_dir=run.layout.staged_verifier_dir(
                    self.taskset, run.run_id, self.episode_name
                ),
                artifacts_dir=run.layout.staged_artifacts_dir(
                    self.taskset, run.run_id, self.episode_name
                ),
                redactor=run.redactor,
                relay=run.relay,
                progress=EpisodeProgress(partial(run.phases.post, self.nodeid)),
            )
        return self.episode

    def start_early(self) -> None:
        """Start this trial's sandbox while the episode before it still runs (not under a
        cap on episodes at once, which a waiting sandbox would dodge); once."""
        run = _run(self)
        if self.skip_reason is None and run.settings.max_concurrent_episodes is None:
            episode = self._episode()
            if episode not in run.started_early:
                episode.start_early()
                run.started_early.append(episode)

    def setup(self) -> None:
        run = _run(self)
        episode = self._episode()
        episode.progress.enter("building")
        try:
            episode.prepare()
        except EpisodeError as error:
            if not run.options.skip_unloadable:
                raise
            self.unloadable = error.reason
            pytest.skip(f"unloadable: {error.reason}")
        self.slot = run.acquire_slot()
        episode.seed()

    def abort(self) -> None:
        """Remove the sandbox now (the backstop timer fired); teardown finds it gone."""
        if self.episode is not None:
            self.episode.cleanup()

    def teardown(self) -> None:
        if self.episode is not None:
            _run(self).release(self.episode, self.slot)
        elif self.slot is not None:
            self.slot.release()


class HarborTurnItem(_HarborNode, pytest.Item):
    """One turn of an episode (a single-step task has one, `episode`). The item that ends
    the episode (its last selected turn, or the turn it stopped after) carries the row."""

    def __init__(self, *, turn: Turn, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        assert isinstance(self.parent, HarborTrial)
        self.trial = self.parent
        self.turn = turn
        self._hook_path = self.parent._hook_path
        #: What the report of the call phase carries (see item_reports.py).
        self.harbor_payload: ReportPayload | None = None
        #: The item pytest runs after this one, when it knows it.
        self.next_item: pytest.Item | None = None

    def start_next_trial_early(self) -> None:
        """Start the next trial's sandbox: as this turn's setup begins where sandboxes
        take no place on an engine (two starts may then overlap), else once it runs (its
        own place taken: the next one cannot take the last place before it)."""
        following = self.next_item
        if isinstance(following, HarborTurnItem) and following.trial is not self.trial:
            following.trial.start_early()

    def runtest(self) -> None:
        run = _run(self)
        episode = self.trial.episode
        assert episode is not None, "the trial's setup() seeds the episode"
        if episode.stopped_after is not None:
            pytest.skip(f"stopped after turn {episode.stopped_after}: {episode.stop_reason}")
        if self.trial.lost_in is not None:
            pytest.skip(f"the episode has no result: turn {self.trial.lost_in} broke down")
        try:
            output = episode.run_turn(self.turn)
        except Exception as error:
            # Whatever broke, the sandbox is in no state to go on from: the later turns
            # are skipped, and it goes now rather than after them.
            self.trial.lost_in = self.turn.name
            self.trial.abort()
            full = disk_full(error, run.layout.taskset_dir(self.trial.taskset))
            if full is not None:
                raise full from None
            raise
        # Paths as they will be once the controller has moved the staged folders in place.
        turn = self._placed(output.result)
        # The worker wrote the verifier's files itself; the controller gets their folder.
        payload = ReportPayload(
            taskset=self.trial.taskset,
            task_id=self.trial.task.id,
            episode_id=episode.id,
            step=self.turn.name,
            verifier_dir=turn.verifier_logs_dir,
        )
        # Set at once: should the row or the outcome fail, the report carries this much.
        self.harbor_payload = payload
        if episode.stopped_after is not None or self is self.trial.selected[-1]:
            payload = payload.model_copy(update={"result": self._row(episode)})
            self.harbor_payload = payload
        if self.trial.check_role == "nop":
            outcome = nop_check_outcome(turn)
        elif self.trial.check_role == "probe":
            outcome = probe_check_outcome(turn)
        else:
            outcome = decide_outcome(
                turn, validation=run.harness.validates, pass_reward=run.options.pass_reward
            )
        self.harbor_payload = payload.model_copy(update={"status": outcome.status})
        self.user_properties.append(("reward", turn.reward))
        self.user_properties.append(("failure_kind", turn.failure_kind or ""))
        if outcome.status == "passed":
            return
        if outcome.status == "skipped":
            pytest.skip(outcome.headline)
        stdout = _tail(output.verifier_dir / "test-stdout.txt")
        details = _details(turn, stdout, validation=self.trial.harness.validates)
        pytest.fail(f"{outcome.headline}\n{details}", pytrace=False)

    def _placed(self, turn: TurnResult) -> TurnResult:
        """`turn` with its verifier folder, and the harness's folder of the turn when the
        harness kept files there, where the controller puts them (see _episode)."""
        run, trial = _run(self), self.trial
        update: dict[str, str] = {}
        for key in ("verifier_logs_dir", "artifacts_dir"):
            staged = getattr(turn, key)
            if staged is not None:
                update[key] = run.layout.placed(trial.taskset, run.run_id, staged)
        agent = run.layout.staged_agent_dir(trial.taskset, run.run_id, trial.episode_name)
        if trial.task.config.is_multi_step:
            agent = agent / turn.step
        if agent.is_dir() and any(agent.iterdir()):
            update["agent_logs_dir"] = run.layout.placed(trial.taskset, run.run_id, str(agent))
        return turn.model_copy(update=update)

    def _row(self, episode: Episode) -> EpisodeResult:
        """The episode's result, with (single-step) the episode's verifier folder."""
        result = episode.result()
        turns = [self._placed(turn) for turn in result.turns]
        single = not self.trial.task.config.is_multi_step
        left_out = [item.name for item in self.trial.turn_items if item not in self.trial.selected]
        return result.model_copy(
            update={
                "turns": turns,
                "verifier_logs_dir": turns[0].verifier_logs_dir if single else None,
                # Stopped early, the episode is whole: the rest would not have run.
                "partial": bool(left_out) and episode.stopped_after is None,
                "unselected_steps": left_out if episode.stopped_after is None else [],
                "worker": get_xdist_worker_id(self.session)
                if is_xdist_worker(self.session)
                else "main",
            }
        )

    def reportinfo(self) -> tuple[Path, int, str]:
        # Line 0: task.toml has no line for an episode, and skip reports need a number.
        return self.path / "task.toml", 0, self.nodeid


def _tail(path: Path, size: int = 16 * 1024) -> bytes:
    """The end of a file (it may be large), or nothing when there is none."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(handle.tell() - size, 0))
            return handle.read()
    except OSError:
        return b""


def _details(turn: TurnResult, test_stdout: bytes, *, validation: bool) -> str:
    lines = []
    if turn.verifier_rewards is not None and list(turn.verifier_rewards) != ["reward"]:
        lines.append(f"verifier rewards: {turn.verifier_rewards}")
    if validation and turn.agent_exit_code is not None:
        lines.append(f"solve.sh exit code: {turn.agent_exit_code}")
    if turn.response:
        answer = turn.response.strip().replace("\n", " ")
        lines.append(f"agent's answer: {clip_head(answer, _ANSWER_CHARS)}")
    lines.append(f"verifier logs: {turn.verifier_logs_dir}")
    tail = _lines(test_stdout.decode("utf-8", errors="replace"))[-_TAIL_LINES:]
    lines.append("---- last lines of test-stdout.txt ----")
    lines.extend(tail or ["(empty)"])
    if turn.agent_log_tail:
        lines.append("---- last lines of /logs/agent/oracle.txt ----")
        lines.extend(_lines(turn.agent_log_tail)[-_TAIL_LINES:])
    return "\n".join(lines)


def _lines(text: str) -> list[str]:
    """The lines of `text`, split at newlines only: a carriage return or another break
    str.splitlines knows stays in its line, to be shown escaped (a `\\r` that writes over
    a line is not a line of its own)."""
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines
