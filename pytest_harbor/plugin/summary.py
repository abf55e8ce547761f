"""What the terminal shows of the run: a status line now and then during a long run, and
the `harbor` section at its end (scores, files, what was left out, kept or cut short)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_harbor.display import shown_number
from pytest_harbor.plugin.live import shows_live_block, workers_of
from pytest_harbor.plugin.progress import run_progress
from pytest_harbor.plugin.relay import spend_line
from pytest_harbor.plugin.reporting import RunReport, first_line
from pytest_harbor.relay import RunSpend
from pytest_harbor.run.metrics import TasksetScore
from pytest_harbor.sandboxes.base import NamesBuilder
from pytest_harbor.tasks import TaskLoadError
from pytest_harbor.tasks.loader import matches_any
from pytest_harbor.writers.runs import LATEST, latest_run

__all__ = ["TerminalSummary", "status_line"]

#: How many tasks the terminal's pass@k table shows before it says "and N more".
_PASS_AT_K_ROWS = 20

#: How many refused task folders the summary names (the rest are counted).
_LEFT_OUT_SHOWN = 3

_BUILDERS = {"buildkit": "BuildKit (docker buildx)", "classic": "the classic builder"}

#: TerminalReporter.write_line: a line, and markup such as red=True.
Write = Callable[..., None]


class TerminalSummary:
    """Registered on the controller (or the sole process); reads the run's report and
    plan, and writes only its own fields: the terminal, learnt as the session starts."""

    def __init__(self, state: RunReport) -> None:
        self.state = state
        self.run = state.run
        self._status_at: float | None = None
        #: What reports to the terminal (None without one), its verbosity, and the number
        #: of workers (for the status line's estimate).
        self.terminal: Any = None
        self.verbosity = 0
        self.workers = 1
        #: The live view keeps a block in the terminal: no plain status line then.
        self.live_block = False

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        config = session.config
        self.terminal = config.pluginmanager.get_plugin("terminalreporter")
        self.verbosity = config.get_verbosity()
        self.workers = workers_of(config)
        self.live_block = shows_live_block(config)

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """After the recorder's: the episode whose item ended is counted as ended."""
        self._maybe_status()

    def _maybe_status(self) -> None:
        """Where the output is no terminal (a CI log), a plain line now and then (at most
        every `--harbor-status-every` seconds), as an item ends: episodes done of all,
        images being made, those running with their phase and age, waiting, failed, spend,
        and the time left once the results folder recorded earlier runs. Not with -q, and
        not where the live view keeps its block in the terminal (plugin/live.py)."""
        every = self.run.options.status_every_s
        if not self.state.planned.manifests or every is None or self.live_block:
            return  # no taskset in this run (pytest-harbor's own tests, say)
        now = time.monotonic()
        if self._status_at is None:
            self._status_at = now
            if every > 0:
                return
        if now - self._status_at < every or self.verbosity < 0:
            return
        self._status_at = now
        reporter = self.terminal
        if reporter is None:
            return
        # On a line of its own, never glued to the progress dots.
        writer = getattr(reporter, "_tw", None)
        if writer is not None and writer.width_of_current_line:
            reporter.write("\n")
        reporter.write_line(self.run.redactor.shown(status_line(self.state, self.workers)))

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        state = self.state
        left_out = {
            taskset: plan.failures for taskset, plan in state.planned.plans.items() if plan.failures
        }
        unmatched = self._unmatched_filters(terminalreporter.config)
        if not self._ran() and not left_out and not unmatched:
            return
        write = self._writer(terminalreporter)
        terminalreporter.section("harbor")
        for message in unmatched:
            write(message, yellow=True)
        for taskset, failures in sorted(left_out.items()):
            self._write_left_out(write, taskset, failures)
        for taskset in sorted(state.planned.manifests):
            self._write_taskset(write, taskset)
        for taskset in sorted(state.planned.manifests):
            self._write_results_folder(write, taskset)
        if self.run.options.report_path in state.reports:
            write(f"report: {self.run.options.report_path}")
        for message in state.report_errors:
            write(message, yellow=True)
        if state.check is not None:
            self._write_check(write)
        self._write_run_notes(write)
        if state.spend is not None and (state.spend.counts.requests or state.spend.budget_reached):
            self._write_spend(write, state.spend)

    def _ran(self) -> bool:
        """Whether any taskset of the run has an episode in the ledger."""
        ledger = self.state.ledger
        return any(
            True for taskset in self.state.planned.manifests for _ in ledger.entries(taskset)
        )

    def _write_taskset(self, write: Write, taskset: str) -> None:
        """A taskset's score, when it has episodes, and the files this run wrote for it."""
        state, layout = self.state, self.run.layout
        score = state.ledger.score(taskset)
        if not score.episodes and not score.count("not_run"):
            return
        _write_score(write, taskset, score, unfinished=bool(state.cut_short))
        if not state.writer.begun(taskset):
            return
        write(f"  rows: {layout.rollouts_file(taskset)}")
        write(f"  summary: {layout.summary_file(taskset)}")
        report = layout.report_file(taskset)
        if report in state.reports:
            write(f"  report: {report}")

    def _write_results_folder(self, write: Write, taskset: str) -> None:
        """What the run did with the taskset's folder: runs of the earlier layout moved,
        the run a resume continued, or (writing no result) nothing kept of this one."""
        state = self.state
        for note in state.planned.folder_notes.get(taskset, []):
            write(note)
        if not state.writer.begun(taskset):
            layout = self.run.layout
            if layout.taskset_dir(taskset).is_dir():
                write(
                    f"{taskset}: nothing of this run was written; the run it resumed, in "
                    f"{layout.taskset_dir(taskset)}, is as it was"
                )
                return
            root = layout.root_dir(taskset)
            latest = latest_run(root)
            if latest is not None:
                write(
                    f"{taskset}: this run wrote no result, so it keeps no folder; "
                    f"{root / LATEST} still names {latest.name}"
                )

    def _writer(self, reporter: pytest.TerminalReporter) -> Write:
        """The section's one way to the terminal: each line as Redactor.shown renders it
        (task names, reasons and check details may quote a task or a sandbox)."""
        shown = self.run.redactor.shown

        def write(line: str, **markup: bool) -> None:
            reporter.write_line(shown(line), **markup)

        return write

    def _write_spend(self, write: Write, spend: RunSpend) -> None:
        """The run's model calls as the relay counted them, and the budget's stop."""
        counts = spend.counts
        cost = f"{counts.cost_usd:.4f} USD" + (
            f" (+ {counts.unpriced} call(s) of a model the price table lacks)"
            if counts.unpriced
            else ""
        )
        write(
            f"model calls: {counts.requests}, {counts.prompt_tokens} prompt and "
            f"{counts.completion_tokens} completion tokens, {cost}"
        )
        line = spend_line(spend)
        if line is not None:
            write(line, red=True)

    def _write_run_notes(self, write: Write) -> None:
        """What the run kept, cut short, removed and built, and what it could not do."""
        state = self.state
        self._write_resume_notes(write)
        if state.unwritten:
            write(
                f"not written: {state.unwritten} result(s) of this run, the last because "
                f"{state.unwritten_reason}",
                red=True,
            )
        reaped = state.planned.reaped + state.reaped
        if reaped:
            write(f"removed {reaped} sandbox(es) left by runs whose process is gone")
        builds = state.builds
        if builds.started and (builds.done or builds.failed):
            provider = self.run.provider
            builder = provider.builder if isinstance(provider, NamesBuilder) else None
            write(
                f"images made ahead for {builds.done} task{'s' if builds.done != 1 else ''}"
                + (f" ({builds.failed} failed)" if builds.failed else "")
                + (f", built with {_BUILDERS.get(builder, builder)}" if builder else "")
            )
        if self.run.harness.validates and state.nothing_validatable:
            write("no selected task has a solution/solve.sh: nothing was validated", red=True)
        partial = sum(
            state.ledger.score(taskset).count("partial") for taskset in state.planned.manifests
        )
        if partial:
            write(
                f"{partial} episode(s) ran only some of their steps (the others were not "
                "selected): their rows are marked partial, out of the score, and "
                "--harbor-resume runs them again in full",
                yellow=True,
            )

    def _write_resume_notes(self, write: Write) -> None:
        """What a resumed run kept, and what an interrupted one leaves the next to run."""
        state = self.state
        if state.all_kept:
            write(
                f"resumed: all {state.kept} episode(s) were kept from the earlier run and "
                "passed; nothing was left to run",
                green=True,
            )
        elif state.kept:
            write(
                f"resumed: {state.kept} episode(s) kept from the earlier run, not run again"
                + (
                    f"; {state.kept_failed} of them failed, which fails this run"
                    if state.kept_failed
                    else ""
                )
            )
        not_started = sum(
            state.ledger.score(taskset).count("not_run") for taskset in state.planned.manifests
        )
        if state.cut_short and any(
            state.writer.begun(taskset) for taskset in state.planned.manifests
        ):
            write(
                f"interrupted: {state.cut_short + not_started} episode(s) have no result "
                f"({state.cut_short} cut short, {not_started} not started); the same command "
                "with --harbor-resume runs only those, keeping the rest",
                yellow=True,
            )

    def _write_left_out(
        self, write: Write, taskset: str, failures: dict[Path, TaskLoadError]
    ) -> None:
        """Task folders that were refused or did not load (also under -q): how many, the
        first few reasons, and where the rest are."""
        count = len(failures)
        write(
            f"{taskset}: left out {count} task folder{'s' if count != 1 else ''} "
            "(refused, or could not load)",
            yellow=True,
        )
        for path, error in sorted(failures.items())[:_LEFT_OUT_SHOWN]:
            write(f"  {path.name}: {first_line(str(error))}")
        if count > _LEFT_OUT_SHOWN:
            write(f"  ... and {count - _LEFT_OUT_SHOWN} more")
        if self.run.options.skip_unloadable:
            if self.state.writer.begun(taskset):
                write(f"  all of them: {self.run.layout.skipped_file(taskset)}")
        else:
            write(
                "  (each is a collection error above; --harbor-skip-unloadable lists them in "
                "skipped.json and runs the rest)"
            )

    def _unmatched_filters(self, config: pytest.Config) -> list[str]:
        """The task filters that matched nothing: each `--harbor-only-tasks` name or glob
        that names no task, and `-k` or `-m` when they left no episode selected."""
        plans = self.state.planned.plans
        if not plans:
            return []
        ids = [task_id for plan in plans.values() for task_id in plan.task_ids]
        shown = ", ".join(sorted(ids)[:8]) + (" ..." if len(ids) > 8 else "")
        found = [
            f"--harbor-only-tasks={pattern}: no task matches (the tasks: {shown})"
            for pattern in self.run.options.only_tasks
            if not any(matches_any(task_id, (pattern,)) for task_id in ids)
        ]
        planned = [record for record in self.state.ledger.trials.values() if not record.earlier]
        if planned and not any(record.selected for record in planned):
            option = config.option
            for flag, value in (("-k", option.keyword), ("-m", option.markexpr)):
                if value:
                    found.append(f"{flag} {value!r}: no episode matches ({len(planned)} planned)")
        return found

    def _write_check(self, write: Write) -> None:
        """One table of problems per taskset: task, problem, detail."""
        state = self.state
        repeats = state.check.repeats if state.check else 1
        for taskset in sorted(state.planned.manifests):
            checked = {
                task: found for (owner, task), found in state.problems.items() if owner == taskset
            }
            if not checked:
                continue
            bad = {task: found for task, found in checked.items() if found}
            write(
                f"{taskset}: task check (oracle x{repeats}, nop and probe per task): "
                f"{len(checked)} task(s), {len(bad)} with problems",
                red=bool(bad),
                green=not bad,
            )
            if bad:
                width = max(len(task) for task in bad)
                kinds = max(len(problem.kind) for found in bad.values() for problem in found)
                write(f"  {'task':<{width}}  {'problem':<{kinds}}  detail")
                for task, found in sorted(bad.items()):
                    for problem in found:
                        write(
                            f"  {task:<{width}}  {problem.kind:<{kinds}}  "
                            f"{first_line(problem.detail, 160)}"
                        )
            if taskset in state.check_files:
                write(f"  check: {state.check_files[taskset]}")


def status_line(state: RunReport, workers: int = 1) -> str:
    """`harbor: 2/40 done, 2 images being made, 2 running (hello::r0 agent 1m03s; ...), 14
    waiting, about 3 min left` (the time left shared by `workers` processes)."""
    return run_progress(
        state.ledger,
        state.planned,
        phases=state.run.phases,
        building=state.builds.building,
        spend=state.spend,
        workers=workers,
    ).plain()


def _write_score(write: Write, taskset: str, score: TasksetScore, *, unfinished: bool) -> None:
    """A taskset's score; its pass@k is marked as so far when the run did not finish (cut
    short, or episodes not started)."""
    mean = "n/a" if score.mean_reward is None else shown_number(score.mean_reward)
    counts = ", ".join(
        f"{score.count(status)} {status.replace('_', ' ')}"
        for status in ("passed", "failed", "masked", "no_result")
    )
    extra = [
        f"{score.count(status)} {status.replace('_', ' ')}"
        for status in ("partial", "skipped", "not_run")
        if score.count(status)
    ]
    write(
        f"{taskset}: {score.episodes} episode{'s' if score.episodes != 1 else ''}, "
        f"mean reward {mean} ({counts})" + (f"; {', '.join(extra)}" if extra else "")
    )
    if score.usage is not None:
        usage = score.usage
        cost = "" if usage.cost_usd is None else f", ${usage.cost_usd:.4f}"
        write(
            f"  model usage: {usage.prompt_tokens:,} prompt + {usage.completion_tokens:,} "
            f"completion tokens in {usage.requests:,} requests{cost}"
        )
    if score.failure_kinds:
        width = max(len(kind) for kind in score.failure_kinds)
        write("  failure kind" + " " * (width - 10) + "episodes")
        for kind, count in sorted(
            score.failure_kinds.items(), key=lambda item: (-item[1], item[0])
        ):
            write(f"  {kind:<{width}}  {count}")
    if score.pass_at_k:
        _write_pass_at_k(write, score, so_far=unfinished or bool(score.count("not_run")))


def _write_pass_at_k(write: Write, score: TasksetScore, *, so_far: bool) -> None:
    ks = sorted(score.pass_at_k)
    label = "pass@k so far (the run did not finish)" if so_far else "pass@k"
    write(f"  {label}: " + "  ".join(f"pass@{k} {score.pass_at_k[k]:.3f}" for k in ks))
    tasks = sorted({task for per_task in score.pass_at_k_per_task.values() for task in per_task})
    width = max(len(task) for task in tasks)
    write("  " + "task".ljust(width) + "".join(f"  pass@{k}".rjust(9) for k in ks))
    for task in tasks[:_PASS_AT_K_ROWS]:
        cells = []
        for k in ks:
            value = score.pass_at_k_per_task.get(k, {}).get(task)
            cells.append(("-" if value is None else f"{value:.3f}").rjust(9))
        write("  " + task.ljust(width) + "".join(cells))
    if len(tasks) > _PASS_AT_K_ROWS:
        write(f"  ... and {len(tasks) - _PASS_AT_K_ROWS} more tasks (see the run summary)")
