"""The pytest plugin (entry point `pytest11: harbor`): options, targets, node creation."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import warnings
from collections.abc import Callable, Generator, Mapping
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import pytest

from pytest_harbor.datasets import ResolvedDataset, default_cache_dir, is_reference
from pytest_harbor.harnesses import HARNESSES, HarnessFactory
from pytest_harbor.plugin.deadlines import pytest_timeout_cancel_timer, pytest_timeout_set_timer
from pytest_harbor.plugin.endpoint_errors import watch_endpoint_errors
from pytest_harbor.plugin.item_reports import pytest_report_teststatus, pytest_runtest_makereport
from pytest_harbor.plugin.ledger import trial_of
from pytest_harbor.plugin.live import LiveView
from pytest_harbor.plugin.nodes import HarborTaskset, HarborTurnItem, HarborWarning
from pytest_harbor.plugin.options import add_options, read_options
from pytest_harbor.plugin.planned import PLANNED_RUN, PlannedRun
from pytest_harbor.plugin.preflight import PreFlight
from pytest_harbor.plugin.recorded import apply_run_configs
from pytest_harbor.plugin.recording import ResultRecorder
from pytest_harbor.plugin.references import resolve_references
from pytest_harbor.plugin.reporting import RunReport
from pytest_harbor.plugin.run import (
    HARBOR_RUN,
    SETTLED_TRIALS,
    HandedTrials,
    HarborRun,
    Target,
    find_target,
    new_run_id,
)
from pytest_harbor.plugin.scheduling import (
    SPLITTING_MODES,
    keep_turns_together,
    trial_scheduler,
)
from pytest_harbor.plugin.summary import TerminalSummary
from pytest_harbor.plugin.worker_start import WorkerStart
from pytest_harbor.registry import NameTaken, Registry
from pytest_harbor.relay import RelayClient
from pytest_harbor.run.reaper import owner_of_this_process
from pytest_harbor.sandboxes import PROVIDERS, PlacesEpisodes, ProviderFactory, SandboxError
from pytest_harbor.tasks import is_task_dir

_Factory = TypeVar("_Factory")

__all__ = [
    "pytest_addhooks",
    "pytest_addoption",
    "pytest_collect_directory",
    "pytest_collection_finish",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_configure_node",
    "pytest_ignore_collect",
    "pytest_load_initial_conftests",
    "pytest_report_teststatus",
    "pytest_runtest_call",
    "pytest_runtest_makereport",
    "pytest_runtest_protocol",
    "pytest_sessionfinish",
    "pytest_timeout_cancel_timer",
    "pytest_timeout_set_timer",
    "pytest_unconfigure",
    "pytest_xdist_make_scheduler",
]


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from pytest_harbor.plugin import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> Generator[None, None, None]:
    """pytest imports conftest.py from each argument folder and its `test*` subfolders
    (a task's `tests/`!); for a task folder argument, look from its parent instead. With
    no argument but --harbor-dataset, look from the datasets, not from `testpaths` (a
    checkout's own tests would load their fixtures for a run of some dataset in it)."""
    namespace = early_config.known_args_namespace
    given = list(namespace.file_or_dir or [])
    invocation_dir = early_config.invocation_params.dir
    datasets = [str(path) for path in getattr(namespace, "harbor_dataset", None) or []]
    folders = [dataset for dataset in datasets if not is_reference(dataset)]
    anchors = [_conftest_anchor(invocation_dir, arg) for arg in given or folders]
    if not given and not folders and datasets:
        # Only references: a fetched dataset's conftest.py is never imported, and the
        # checkout pytest runs in has nothing to do with the dataset.
        anchors = [str(_reference_anchor(early_config))]
    if not given and is_task_dir(invocation_dir):
        anchors = [str(invocation_dir.parent)]
    namespace.file_or_dir = anchors
    # With no ini file, `pytest path/to/task` makes the task folder the rootdir and the
    # conftest cut-off: every conftest.py pytest could still load is inside the task.
    cutoff = _absolute(invocation_dir / (namespace.confcutdir or early_config.rootpath))
    if any(is_task_dir(folder) for folder in (cutoff, *cutoff.parents)):
        namespace.noconftest = True
    try:
        return (yield)
    finally:
        namespace.file_or_dir = given


def _reference_anchor(early_config: pytest.Config) -> Path:
    """An empty folder of the dataset cache: no conftest.py, no test folders."""
    given = getattr(early_config.known_args_namespace, "harbor_cache_dir", None)
    root = default_cache_dir()
    if given:
        root = _absolute(early_config.invocation_params.dir / given)
    anchor = root / "anchor"
    anchor.mkdir(parents=True, exist_ok=True)
    return anchor


def _conftest_anchor(invocation_dir: Path, arg: str) -> str:
    path = _absolute(invocation_dir / arg.split("::")[0])
    return str(path.parent) if is_task_dir(path) else arg


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    if isinstance(item, HarborTurnItem):
        item.next_item = nextitem
    return (yield)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    run = item.config.stash.get(HARBOR_RUN, None)
    if run is not None and isinstance(item, HarborTurnItem):
        run.watch()
    if isinstance(item, HarborTurnItem) and not isinstance(run and run.provider, PlacesEpisodes):
        item.start_next_trial_early()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    if isinstance(item, HarborTurnItem):
        item.start_next_trial_early()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """--harbor-resume: trials the earlier run finished are not run again."""
    settled = config.stash.get(SETTLED_TRIALS, None)
    if settled is None or not settled.done_trials:
        return
    done = [item for item in items if trial_of(item.nodeid) in settled.done_trials]
    if done:
        config.hook.pytest_deselected(items=done)
        kept = set(map(id, done))
        items[:] = [item for item in items if id(item) not in kept]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """After every plugin selected and ordered (-k, -m, --lf, shufflers), before anyone
    reports or sends the items: keep each trial's turns together, with the earlier ones."""
    keep_turns_together(session.items, session.config)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's default `load` distribution, by trial: a trial's turns go to one worker."""
    run = config.stash.get(HARBOR_RUN, None)
    if run is None or not run.targets or config.getvalue("dist") != "load":
        return None
    planned = config.stash[PLANNED_RUN]
    return trial_scheduler(config, log, frozenset(planned.trial_ids), planned.expected_s)


def pytest_configure(config: pytest.Config) -> None:
    options = apply_run_configs(config, read_options(config))
    # What the controller gave this xdist worker (pytest_configure_node); None elsewhere.
    worker_input: dict[str, Any] | None = getattr(config, "workerinput", None)
    handed = None if worker_input is None else WorkerStart.unpack(worker_input)
    said: list[str] = []
    references = resolve_references(options, handed, said)
    options = replace(options, datasets=options.datasets + tuple(r.path for r in references))
    if options.datasets:
        # --harbor-dataset replaces the default arguments (testpaths, the current folder)
        # and adds to arguments given on the command line.
        dataset_args = [str(path) for path in options.datasets]
        if config.args_source != pytest.Config.ArgsSource.ARGS:
            config.args = dataset_args
        else:
            config.args += [arg for arg in dataset_args if arg not in config.args]
    targets = _targets(config, options.datasets, references)
    dist = getattr(config.option, "dist", "no")
    if targets and dist in SPLITTING_MODES:
        raise pytest.UsageError(
            f"--dist {dist} may split the turns of a trial across workers; use -n alone "
            "(trial-grouped load balancing), --dist loadscope or --dist loadfile"
        )
    run = HarborRun(
        options,
        run_id=(handed and handed.run_id) or new_run_id(),
        owner=owner_of_this_process(),
        targets=targets,
        is_worker=worker_input is not None,
        registered_harnesses=_registered_harnesses(config),
        registered_providers=_registered_providers(config),
        references=references,
    )
    if worker_input is None:
        _warn_about_options(config, run)
        for text in said:
            config.issue_config_time_warning(HarborWarning(text), stacklevel=2)
    config.stash[HARBOR_RUN] = run
    if run.model is not None and targets:
        watch_endpoint_errors(config, worker=handed is not None, redact=run.redactor.shown)
    if handed is not None:
        run.relay = None if handed.relay is None else RelayClient(handed.relay)
        run.layout.runs.update(handed.run_folders)
        config.stash[SETTLED_TRIALS] = HandedTrials(
            row_digests=handed.row_digests, done_trials=frozenset(handed.done_trials)
        )
    else:
        _register_reporters(config, run)
    if targets:
        config.add_cleanup(_interrupt_on_sigterm())


def _register_reporters(config: pytest.Config, run: HarborRun) -> None:
    """The controller's reporting plugins, one job each, sharing what they learn; the
    plan the pre-flight writes is also what this process's collection reads."""
    planned = PlannedRun()
    config.stash[PLANNED_RUN] = planned
    config.stash[SETTLED_TRIALS] = planned
    state = RunReport.of(run, planned)
    config.pluginmanager.register(PreFlight(state), "harbor-preflight")
    config.pluginmanager.register(ResultRecorder(state), "harbor-recorder")
    config.pluginmanager.register(TerminalSummary(state), "harbor-summary")
    config.pluginmanager.register(LiveView(state), "harbor-live")


def _registered_harnesses(config: pytest.Config) -> dict[str, HarnessFactory]:
    """Harnesses from the `pytest_harbor_harnesses` hook."""
    return _registered(HARNESSES, config.hook.pytest_harbor_harnesses(), "pytest_harbor_harnesses")


def _registered_providers(config: pytest.Config) -> dict[str, ProviderFactory]:
    """Sandbox providers from the `pytest_harbor_sandbox_providers` hook."""
    return _registered(
        PROVIDERS, config.hook.pytest_harbor_sandbox_providers(), "pytest_harbor_sandbox_providers"
    )


def _registered(
    registry: Registry[_Factory], results: list[Mapping[str, _Factory]], hook: str
) -> dict[str, _Factory]:
    """The names a hook's implementations give; a name given twice (by the hook, built in,
    or by an installed package's entry point) is a usage error."""
    try:
        return registry.admit(results, hook)
    except NameTaken as error:
        raise pytest.UsageError(str(error)) from None


def _warn_about_options(config: pytest.Config, run: HarborRun) -> None:
    for warning in run.options.warnings:
        config.issue_config_time_warning(HarborWarning(warning), stacklevel=2)
    model = run.options.model
    if model.given and run.model is None:
        config.issue_config_time_warning(
            HarborWarning(
                f"the model options are not used: the {run.harness.name} harness talks to no model"
            ),
            stacklevel=2,
        )
    keyword = str(getattr(config.option, "keyword", "") or "").strip()
    if run.targets and keyword.isdigit():
        config.issue_config_time_warning(
            HarborWarning(
                f"-k {keyword} is pytest's keyword filter: it runs only the items whose names "
                f"hold {keyword!r} (repeat r{keyword} of each task, say), not {keyword} "
                f"attempts as harbor run's -k; --harbor-repeats={keyword} runs each task "
                f"{keyword} times"
            ),
            stacklevel=2,
        )
    if model.api_key is not None and run.model is not None:
        config.issue_config_time_warning(
            HarborWarning(
                "--harbor-model-api-key: other users of this machine can read a command line "
                "(and anyone an ini file); put the key in the environment variable that "
                "--harbor-model-api-key-env names instead"
            ),
            stacklevel=2,
        )


def _targets(
    config: pytest.Config, datasets: tuple[Path, ...], references: list[ResolvedDataset]
) -> list[Target]:
    patterns = config.getini("python_files")
    given = {reference.path: reference.given for reference in references}
    targets = [
        Target(path, is_task=is_task_dir(path), reference=given.get(path)) for path in datasets
    ]
    for arg in config.args:
        if "::" in arg:
            continue
        target = find_target(_absolute(config.invocation_params.dir / arg), patterns)
        if target is not None and target.path not in datasets:
            targets.append(target)
    by_taskset: dict[str, Path] = {}
    for target in targets:
        other = by_taskset.setdefault(target.taskset, target.path)
        if other != target.path:
            first = given.get(other, str(other))
            raise pytest.UsageError(
                f"two targets share the taskset name {target.taskset!r}: {first} and "
                f"{target.reference or target.path} (a folder's name is its taskset, and a "
                "reference's the dataset's name: rename the folder, or give a git "
                "reference #name=)"
            )
    return targets


def _absolute(path: Path) -> Path:
    return Path(os.path.abspath(path))


def _interrupt_on_sigterm() -> Callable[[], None]:
    """Turn SIGTERM into KeyboardInterrupt, so teardown removes every live sandbox; return
    what puts the previous handler back."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    def restore() -> None:
        if signal.getsignal(signal.SIGTERM) is interrupt:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    try:
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, interrupt)
    except ValueError:
        pass  # not the main thread: leave signals alone
    return restore


@pytest.hookimpl(tryfirst=True)
def pytest_collect_directory(path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    run = parent.config.stash.get(HARBOR_RUN, None)
    target = None if run is None else run.targets.get(path)
    if target is None:
        return None
    return HarborTaskset.for_target(parent, target)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A task folder that is not a target is never walked into: its Python files are for
    the sandbox."""
    run = config.stash.get(HARBOR_RUN, None)
    is_target = run is not None and collection_path in run.targets
    if not is_target and collection_path.is_dir() and is_task_dir(collection_path):
        return True
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist: every worker of a run shares the controller's run id; each labels its
    sandboxes with itself as owner, so the sandboxes of a worker that died are orphans."""
    run, planned = node.config.stash[HARBOR_RUN], node.config.stash[PLANNED_RUN]
    handed = WorkerStart(
        run_id=run.run_id,
        row_digests=dict(planned.row_digests),
        done_trials=tuple(sorted(planned.done_trials)),
        run_folders=dict(run.layout.runs),
        datasets=tuple(run.references.values()),
        relay=None if run.relay is None else run.relay.address,
    )
    node.workerinput.update(handed.pack())


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """After the last teardown: wait until every sandbox of this process is removed."""
    run = session.config.stash.get(HARBOR_RUN, None)
    if run is None:
        return
    run.wait_for_cleanup()
    errors = run.cleanup_errors()
    if errors:
        warnings.warn(
            HarborWarning(f"{len(errors)} sandbox(es) could not be removed: {'; '.join(errors)}"),
            stacklevel=1,
        )


def pytest_unconfigure(config: pytest.Config) -> None:
    run = config.stash.get(HARBOR_RUN, None)
    if run is None:
        return
    run.wait_for_cleanup()
    run.unwatch()
    if run.is_worker or not run.targets or config.option.collectonly:
        return
    shutil.rmtree(run.scratch_dir, ignore_errors=True)
    with contextlib.suppress(SandboxError):  # no engine: nothing of this run is left on it
        run.remove_sandboxes()
    run.reap()
