"""Command-line options and their `harbor_*` ini keys, read into one frozen object."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_harbor.datasets import (
    DEFAULT_REGISTRY,
    ResolvedDataset,
    default_cache_dir,
    is_reference,
)
from pytest_harbor.harnesses import harness_names
from pytest_harbor.harnesses.model import DEFAULT_API_KEY_ENV
from pytest_harbor.plugin.model_options import ModelOptions
from pytest_harbor.plugin.option_table import OPTIONS as _OPTIONS
from pytest_harbor.settings import (
    Assignment,
    HarborSettings,
    SettingsError,
    literal_secrets,
    load_settings,
    parse_assignments,
)
from pytest_harbor.writers.run_config import RunRecord

__all__ = [
    "HarborOptions",
    "ModelOptions",
    "add_options",
    "config_files",
    "given_where",
    "parse_key_values",
    "read_options",
]


@dataclass(frozen=True)
class HarborOptions:
    """The resolved options: command line over ini over defaults."""

    datasets: tuple[Path, ...]
    agent: str
    sandbox: str
    repeats: int | None
    results_dir: Path
    pass_reward: float
    #: Whether to write the HTML report, and where: None puts report.html beside each
    #: taskset's run summary; a path is one file covering every taskset of the run.
    report: bool = True
    report_path: Path | None = None
    #: `--harbor-live-report`: rewrite the report this often during the run (None: not).
    live_report_s: float | None = None
    #: `--harbor-status-every`: a non-terminal's status line at most this often (None: never).
    status_every_s: float | None = 60.0
    only_tasks: tuple[str, ...] = ()
    exclude_tasks: tuple[str, ...] = ()
    skip_unloadable: bool = False
    resume: bool = False
    #: `--harbor-resume-or-start`: resume, and start afresh when nothing matches.
    resume_or_start: bool = False
    allow_unsupported_pairing: bool = False
    settings: HarborSettings = field(default_factory=HarborSettings)
    agent_options: dict[str, Any] = field(default_factory=dict)
    model: ModelOptions = field(default_factory=ModelOptions)
    #: Author check mode (`--harbor-check`): the oracle `repeats` times and nop once per task.
    check: bool = False
    #: Things worth a warning at start-up (a secret given literally on the command line).
    warnings: tuple[str, ...] = ()
    #: `--harbor-dataset` references (`harbor:...`, `git+...`), as given.
    references: tuple[str, ...] = ()
    registry: str = DEFAULT_REGISTRY
    cache_dir: Path = field(default_factory=default_cache_dir)
    #: References as a run config recorded them: made again from their commits.
    pinned_datasets: tuple[ResolvedDataset, ...] = ()
    #: Where each option and setting given came from (`--harbor-agent`: "command line").
    sources: dict[str, str] = field(default_factory=dict)
    #: The runs the `--harbor-config` run configs record, by taskset.
    recorded: dict[str, RunRecord] = field(default_factory=dict)


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("harbor", "Harbor task folders")
    for option in _OPTIONS.values():
        action = {"value": "store", "list": "append", "flag": "store_true"}[option.kind]
        extra = {} if option.kind == "flag" else {"metavar": option.metavar}
        text = option.help
        if option.name == "agent":
            # The names there are: built in, shipped recipes, installed plugins.
            text = (
                f"harness to run (default: oracle): {', '.join(harness_names())}; or a "
                "recipe file (.toml), one a plugin registers, or harbor:NAME (one of "
                "Harbor's own agents)"
            )
        group.addoption(
            option.flag,
            dest=option.dest,
            action=action,
            default=None,
            help=f"{text} (ini: {option.dest})",
            **extra,
        )
        parser.addini(option.dest, option.help, type=option.ini_type, default=option.default)  # type: ignore[arg-type]
    for key in HarborSettings.model_fields:
        parser.addini(
            f"harbor_{key}",
            f"setting {key} (YAML value; see the settings table)",
            type="string",
            default=None,
        )


def _raw(config: pytest.Config, name: str) -> Any:
    option = _OPTIONS[name]
    given = config.getoption(option.dest)
    if option.kind == "flag":
        return bool(given) or bool(config.getini(option.dest))
    return given if given is not None else config.getini(option.dest)


def read_options(config: pytest.Config) -> HarborOptions:
    """Read and check every option; a bad value is a usage error naming the option."""
    invocation_dir = config.invocation_params.dir
    check = bool(_raw(config, "check"))
    if not check and _raw(config, "check-repeats") not in (None, ""):
        raise pytest.UsageError(
            "--harbor-check-repeats / harbor_check_repeats: only with --harbor-check"
        )
    report, report_path = _report(config)
    folders, references = _datasets(config)
    sources: dict[str, str] = {}
    for name, option in _OPTIONS.items():
        where = given_where(config, name)
        if where is not None:
            sources[option.flag] = where
    typed = config.getoption(_OPTIONS["set"].dest)
    assignments = _assignments(typed or config.getini(_OPTIONS["set"].dest))
    return HarborOptions(
        sources=sources,
        datasets=folders,
        references=references,
        registry=_registry(config),
        cache_dir=_cache_dir(config),
        # In check mode the run's harness is the oracle (an ini file's agent included).
        agent="oracle" if check else str(_raw(config, "agent")),
        sandbox=str(_raw(config, "sandbox")),
        repeats=_check_repeats(config) if check else _number(config, "repeats", int, minimum=1),
        check=check,
        results_dir=_absolute(invocation_dir / str(_raw(config, "results-dir"))),
        pass_reward=_number(config, "pass-reward", float, minimum=None),
        report=report,
        report_path=report_path,
        live_report_s=_seconds(config, "live-report", positive=True),
        status_every_s=_seconds(config, "status-every", positive=False),
        only_tasks=_names(_raw(config, "only-tasks")),
        exclude_tasks=_names(_raw(config, "exclude-tasks")),
        skip_unloadable=_raw(config, "skip-unloadable"),
        resume=bool(_raw(config, "resume") or _raw(config, "resume-or-start")),
        resume_or_start=_raw(config, "resume-or-start"),
        allow_unsupported_pairing=_raw(config, "allow-unsupported-pairing"),
        settings=_settings(config, assignments, sources),
        # A secret typed on the command line is in the process list; one in an ini file is not.
        warnings=tuple(
            f"--harbor-set secrets.{name}: a secret on the command line can be read by other "
            "users of this machine; give it as env:VARIABLE or file:PATH instead"
            for name in literal_secrets(assignments if typed else [])
        )
        + _live_report_warning(config, report),
        agent_options=parse_key_values(_raw(config, "agent-option"), "agent-option"),
        model=ModelOptions(
            name=_text(config, "model"),
            url=_text(config, "model-url"),
            params=parse_key_values(_raw(config, "model-param"), "model-param"),
            api_key_env=_text(config, "model-api-key-env") or DEFAULT_API_KEY_ENV,
            api_key=_text(config, "model-api-key"),
            concurrency=_number(config, "model-concurrency", int, minimum=1),
            preflight_request=not _raw(config, "no-preflight-request"),
            max_cost_usd=_number(config, "max-cost", float, minimum=0),
            max_tokens=_number(config, "max-tokens", int, minimum=1),
            prices=_path(config, invocation_dir, "prices"),
            record=_path(config, invocation_dir, "record"),
            replay=_path(config, invocation_dir, "replay"),
        ),
    )


def _check_repeats(config: pytest.Config) -> int:
    """The oracle's repeats in check mode; options that would contradict the mode are
    usage errors, not silently overridden."""
    clashes = {
        "agent": "the check runs the oracle and nop; leave out --harbor-agent",
        "repeats": "the check's repeats are --harbor-check-repeats",
        "resume": "a check runs every selected task afresh (use --lf to run the tasks with "
        "problems again)",
        "resume-or-start": "a check runs every selected task afresh",
    }
    for name, why in clashes.items():
        if config.getoption(_OPTIONS[name].dest) not in (None, False, "oracle"):
            raise pytest.UsageError(f"--harbor-check with {_OPTIONS[name].flag}: {why}")
    repeats = _number(config, "check-repeats", int, minimum=1)
    return 1 if repeats is None else int(repeats)


def parse_key_values(values: list[str], name: str) -> dict[str, Any]:
    """`KEY=VALUE` pairs (the last of a key wins); a value is read as JSON when it parses
    (`0.2`, `true`, `{"a": 1}`), else kept as text."""
    option = _OPTIONS[name]
    parsed: dict[str, Any] = {}
    for text in values:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise pytest.UsageError(
                f"{option.flag} / {option.dest}: expected KEY=VALUE, got {text!r}"
            )
        try:
            parsed[key.strip()] = json.loads(value)
        except ValueError:
            parsed[key.strip()] = value
    return parsed


def _path(config: pytest.Config, invocation_dir: Path, name: str) -> Path | None:
    text = _text(config, name)
    return None if text is None else _absolute(invocation_dir / text)


def _text(config: pytest.Config, name: str) -> str | None:
    value = _raw(config, name)
    return str(value) if value not in (None, "") else None


def _paths(config: pytest.Config, name: str) -> list[Path]:
    """Paths from the command line (relative to where pytest runs) or from the ini file
    (relative to the ini file)."""
    option = _OPTIONS[name]
    given = config.getoption(option.dest)
    if given is not None:
        base, values = config.invocation_params.dir, given
    else:
        base = config.inipath.parent if config.inipath else config.invocation_params.dir
        values = config.getini(option.dest)
    return [_absolute(base / value) for value in values]


def _datasets(config: pytest.Config) -> tuple[tuple[Path, ...], tuple[str, ...]]:
    """The folders (checked to exist) and the references among `--harbor-dataset`."""
    option = _OPTIONS["dataset"]
    given = config.getoption(option.dest)
    values: list[str] = given if given is not None else config.getini(option.dest)
    references = tuple(dict.fromkeys(value for value in values if is_reference(value)))
    folders = [
        path
        for value, path in zip(values, _paths(config, "dataset"), strict=True)
        if not is_reference(value)
    ]
    for path in folders:
        if not path.is_dir():
            raise pytest.UsageError(f"{option.flag}: {path} is not a folder")
    return tuple(dict.fromkeys(folders)), references


def _registry(config: pytest.Config) -> str:
    """A URL as given; a file relative to where pytest runs (or to the ini file)."""
    value = _text(config, "registry") or DEFAULT_REGISTRY
    if "://" in value:
        return value
    given = config.getoption(_OPTIONS["registry"].dest) is not None
    base = config.invocation_params.dir
    if not given and config.inipath is not None:
        base = config.inipath.parent
    return str(_absolute(base / Path(value).expanduser()))


def _cache_dir(config: pytest.Config) -> Path:
    value = _text(config, "cache-dir")
    if value is None:
        return default_cache_dir()
    given = config.getoption(_OPTIONS["cache-dir"].dest) is not None
    base = config.invocation_params.dir
    if not given and config.inipath is not None:
        base = config.inipath.parent
    return _absolute(base / Path(value).expanduser())


def _report(config: pytest.Config) -> tuple[bool, Path | None]:
    """`--harbor-report`: none, a path (relative to where pytest runs), or unset."""
    value = _text(config, "report")
    if value is None:
        return True, None
    if value.strip().lower() == "none":
        return False, None
    path = _absolute(config.invocation_params.dir / value)
    if path.is_dir():
        raise pytest.UsageError(
            f"--harbor-report / harbor_report: {path} is a folder; give the report's file "
            "name (say report.html), or none to write no report"
        )
    return True, path


def _live_report_warning(config: pytest.Config, report: bool) -> tuple[str, ...]:
    if report or _seconds(config, "live-report", positive=True) is None:
        return ()
    return (
        "--harbor-live-report: --harbor-report=none writes no report, so none is written "
        "during the run either",
    )


def _seconds(config: pytest.Config, name: str, *, positive: bool) -> float | None:
    """A number of seconds (more than 0 when `positive`), or None for none or unset."""
    raw = _raw(config, name)
    if raw is None or str(raw).strip().lower() in ("", "none"):
        return None
    option = _OPTIONS[name]
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value < 0 or (positive and value == 0) or value != value:
        raise pytest.UsageError(
            f"{option.flag} / {option.dest}: expected a number of seconds"
            f"{' above 0' if positive else ''}, got {raw!r}"
        )
    return value


def _names(values: list[str]) -> tuple[str, ...]:
    return tuple(name.strip() for value in values for name in value.split(",") if name.strip())


def config_files(config: pytest.Config) -> list[Path]:
    """The `--harbor-config` files, in order."""
    return _paths(config, "config")


def given_where(config: pytest.Config, name: str) -> str | None:
    """Where the option `name` was given: "command line", "ini file PATH", or None when
    it has its default."""
    option = _OPTIONS[name]
    if config.getoption(option.dest) not in (None, False, []):
        return "command line"
    value = config.getini(option.dest)
    if value not in (option.default, None, "", []) and value != option.default:
        return f"ini file {config.inipath}" if config.inipath else "ini file"
    return None


def _assignments(texts: list[str]) -> list[Assignment]:
    try:
        return parse_assignments(texts)
    except SettingsError as error:
        raise pytest.UsageError(str(error)) from None


def _settings(
    config: pytest.Config, assignments: list[Assignment], sources: dict[str, str]
) -> HarborSettings:
    ini = {}
    for key in HarborSettings.model_fields:
        value = config.getini(f"harbor_{key}")
        if value is not None:
            ini[key] = str(value)
    files = _paths(config, "config")
    found: dict[str, str] = {}
    try:
        settings = load_settings(ini, files, assignments, found)
        sources.update({f"setting {key}": where for key, where in found.items()})
        return settings
    except SettingsError as error:
        raise pytest.UsageError(str(error)) from None


def _number(config: pytest.Config, name: str, kind: type, minimum: int | None) -> Any:
    option = _OPTIONS[name]
    raw = _raw(config, name)
    if raw is None:
        return None
    try:
        value = kind(raw)
    except (TypeError, ValueError):
        raise pytest.UsageError(
            f"{option.flag} / {option.dest}: expected {'an integer' if kind is int else 'a number'}"
            f", got {raw!r}"
        ) from None
    if minimum is not None and value < minimum:
        raise pytest.UsageError(f"{option.flag} / {option.dest}: must be at least {minimum}")
    return value


def _absolute(path: Path) -> Path:
    # Like pytest's own argument paths: absolute, symlinks not resolved.
    return Path(os.path.abspath(path))
