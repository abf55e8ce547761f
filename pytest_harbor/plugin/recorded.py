"""`--harbor-config=run_config_<agent>.yaml`: the run a run config records, made again.

What the file records is what the run does, unless an option says otherwise; an option or
setting that would make the rows incomparable with the recorded ones (another agent,
model, dataset, repeats, selection or grading setting) is a usage error naming both."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_harbor.datasets import ResolvedDataset
from pytest_harbor.plugin.options import HarborOptions, ModelOptions, config_files
from pytest_harbor.plugin.run import HarborRun, Target
from pytest_harbor.settings import HarborSettings
from pytest_harbor.writers.manifest import RUN_ONLY_SETTINGS, RunManifest
from pytest_harbor.writers.run_config import (
    RunConfigError,
    RunRecord,
    Selection,
    read_run_config,
)

__all__ = ["apply_run_configs", "describe_run", "recorded_differences"]


def apply_run_configs(config: pytest.Config, options: HarborOptions) -> HarborOptions:
    """`options` with what the run configs among `--harbor-config` record."""
    records: dict[Path, RunRecord] = {}
    for path in config_files(config):
        try:
            record = read_run_config(path)
        except RunConfigError as error:
            raise pytest.UsageError(f"--harbor-config {error}") from None
        if record is not None:
            records[path] = record
    if not records:
        return options
    (first_path, first), *others = records.items()
    for path, record in others:
        for name in ("agent", "agent_options", "model", "check", "repeats", "sandbox"):
            if getattr(record, name) != getattr(first, name):
                raise pytest.UsageError(
                    f"--harbor-config: {first_path} and {path} record runs with another "
                    f"{name}; one run has one"
                )
    updates: dict[str, Any] = {}
    where = f"run config {first_path}"

    def take(flag: str, field: str, recorded: Any, current: Any) -> None:
        given = options.sources.get(flag)
        if given is not None and current != recorded:
            raise pytest.UsageError(
                f"{flag}: {current!r} (from {given}), but {first_path} records {recorded!r}; "
                "the rows would not compare with the recorded run's: leave the option out, "
                "or leave --harbor-config out to run otherwise"
            )
        updates[field] = recorded
        sources = updates.setdefault("sources", dict(options.sources))
        if given is None and flag in first.sources:
            sources[flag] = f"{where} (there: {first.sources[flag]})"

    take("--harbor-agent", "agent", first.agent, options.agent)
    take("--harbor-check", "check", first.check, options.check)
    take("--harbor-agent-option", "agent_options", first.agent_options, options.agent_options)
    take("--harbor-repeats", "repeats", first.repeats, options.repeats)
    take("--harbor-sandbox", "sandbox", first.sandbox, options.sandbox)
    take("--harbor-pass-reward", "pass_reward", first.pass_reward, options.pass_reward)
    selection = first.selection
    take("--harbor-only-tasks", "only_tasks", tuple(selection.only_tasks), options.only_tasks)
    take(
        "--harbor-exclude-tasks",
        "exclude_tasks",
        tuple(selection.exclude_tasks),
        options.exclude_tasks,
    )
    _pytest_selection(config, "keyword", "-k", selection.keyword, first_path)
    _pytest_selection(config, "markexpr", "-m", selection.markexpr, first_path)
    if first.model is not None:
        updates["model"] = _model(options, first.model, first_path)
    _check_settings(options, first, first_path)
    folders = list(options.datasets)
    references = list(options.references)
    pinned = list(options.pinned_datasets)
    for path, record in records.items():
        if record.reference is not None:
            if record.dataset not in references:
                references.append(record.dataset)
            pinned.append(ResolvedDataset.model_validate({**record.reference, "folder": ""}))
            continue
        folder = Path(record.dataset)
        if not folder.is_dir():
            raise pytest.UsageError(
                f"--harbor-config {path}: the dataset folder it records, {folder}, is gone"
            )
        if folder not in folders:
            folders.append(folder)
    return replace(
        options,
        **updates,
        datasets=tuple(folders),
        references=tuple(references),
        pinned_datasets=tuple(pinned),
        recorded={record.taskset: record for record in records.values()},
    )


def _pytest_selection(
    config: pytest.Config, name: str, flag: str, recorded: str, path: Path
) -> None:
    current = getattr(config.option, name, "") or ""
    if current and current != recorded:
        raise pytest.UsageError(
            f"{flag} {current!r}, but {path} records {flag} {recorded!r}; leave it out to "
            "run the recorded selection"
        )
    setattr(config.option, name, recorded)


def _model(options: HarborOptions, recorded: dict[str, Any], path: Path) -> ModelOptions:
    model = options.model
    mine = {
        "name": model.name,
        "base_url": model.url,
        "params": model.params,
        "api_key_env": model.api_key_env,
    }
    for key, flag in (
        ("name", "--harbor-model"),
        ("base_url", "--harbor-model-url"),
        ("params", "--harbor-model-param"),
        ("api_key_env", "--harbor-model-api-key-env"),
    ):
        if flag in options.sources and mine[key] != recorded.get(key):
            raise pytest.UsageError(
                f"{flag}: {mine[key]!r}, but {path} records the model's {key} "
                f"{recorded.get(key)!r}; the rows would not compare with the recorded run's"
            )
    return replace(
        model,
        name=recorded.get("name"),
        url=recorded.get("base_url"),
        params=dict(recorded.get("params") or {}),
        api_key_env=recorded.get("api_key_env") or model.api_key_env,
    )


def _check_settings(options: HarborOptions, record: RunRecord, path: Path) -> None:
    """The settings in force must be the recorded ones, but for those that only schedule
    (RUN_ONLY_SETTINGS); the secrets must have the recorded names (their values are never
    written: give them again, as env:VARIABLE or file:PATH)."""
    defaults = HarborSettings().model_dump(mode="json")
    current = options.settings.model_dump(mode="json")
    for key in sorted(defaults):
        if key in RUN_ONLY_SETTINGS or key == "secrets":
            continue
        recorded = record.settings.get(key, defaults[key])
        if current[key] != recorded:
            source = options.sources.get(f"setting {key}", "its default")
            raise pytest.UsageError(
                f"setting {key}: {current[key]!r} (from {source}), but {path} records "
                f"{recorded!r}; the rows would not compare with the recorded run's"
            )
    missing = sorted(set(record.secrets) - set(options.settings.secrets))
    if missing:
        raise pytest.UsageError(
            f"--harbor-config {path}: the recorded run had the secrets {', '.join(missing)}, "
            "whose values a run config never holds; give them again "
            "(--harbor-set secrets.NAME=env:VARIABLE)"
        )


def recorded_differences(record: RunRecord, task_digests: dict[str, str]) -> list[str]:
    """What makes this run's tasks other than the recorded run's, one line each."""
    found = []
    for task in sorted(set(record.task_digests) | set(task_digests)):
        before, now = record.task_digests.get(task), task_digests.get(task)
        if before == now:
            continue
        if before is None:
            found.append(f"task {task}: not in the recorded run")
        elif now is None:
            found.append(f"task {task}: in the recorded run, not in this one")
        else:
            found.append(f"task {task}: digest {before[7:19]} then, {now[7:19]} now")
    return found


def describe_run(
    run: HarborRun, config: pytest.Config, target: Target, manifest: RunManifest
) -> RunRecord:
    """What `run_config_<agent>.yaml` records of this run of `target`'s taskset."""
    options = run.options
    defaults = HarborSettings().model_dump(mode="json")
    settings = {
        key: value
        for key, value in run.settings.model_dump(mode="json").items()
        if key != "secrets" and value != defaults[key]
    }
    model = None
    if run.model is not None:
        model = {
            "name": options.model.name,
            "base_url": options.model.url,
            "params": dict(options.model.params),
            "api_key_env": options.model.api_key_env,
        }
    return RunRecord(
        taskset=manifest.taskset,
        run_id=run.run_id,
        pytest_harbor_version=manifest.pytest_harbor_version,
        dataset=target.described,
        reference=run.reference_record(target),
        dataset_digest=manifest.dataset_digest,
        task_digests=manifest.task_digests,
        agent=options.agent,
        agent_options=dict(options.agent_options),
        model=model,
        check=options.check,
        repeats=manifest.repeats,
        sandbox=manifest.sandbox,
        pass_reward=options.pass_reward,
        selection=Selection(
            only_tasks=list(options.only_tasks),
            exclude_tasks=list(options.exclude_tasks),
            keyword=getattr(config.option, "keyword", "") or "",
            markexpr=getattr(config.option, "markexpr", "") or "",
        ),
        settings=settings,
        secrets=sorted(run.settings.secrets),
        sources=dict(options.sources),
    )
