"""Command-line options and their `harbor_*` ini keys, read into one frozen object."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

__all__ = ["HarborOptions", "add_options", "read_options"]


@dataclass(frozen=True)
class _Option:
    name: str
    help: str
    ini_type: str
    default: Any
    metavar: str
    repeatable: bool = False

    @property
    def flag(self) -> str:
        return f"--harbor-{self.name}"

    @property
    def dest(self) -> str:
        return f"harbor_{self.name.replace('-', '_')}"


_OPTIONS = (
    _Option(
        "dataset",
        "a task folder or a folder of task folders to run (repeatable)",
        "paths",
        [],
        "PATH",
        repeatable=True,
    ),
    _Option("agent", "harness to run: oracle, nop or a registered one", "string", "oracle", "NAME"),
    _Option("sandbox", "sandbox provider", "string", "docker", "NAME"),
    _Option("repeats", "trials per task", "string", "1", "N"),
    _Option(
        "results-dir",
        "where results go: DIR/harbor/[validation/]<taskset>/",
        "string",
        "results",
        "DIR",
    ),
    _Option(
        "pass-reward",
        "reward an agent run needs to pass (oracle runs always need 1)",
        "string",
        "1.0",
        "REWARD",
    ),
)


@dataclass(frozen=True)
class HarborOptions:
    """The resolved options: command line over ini over defaults."""

    datasets: tuple[Path, ...]
    agent: str
    sandbox: str
    repeats: int
    results_dir: Path
    pass_reward: float


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("harbor", "Harbor task folders")
    for option in _OPTIONS:
        group.addoption(
            option.flag,
            dest=option.dest,
            action="append" if option.repeatable else "store",
            default=None,
            metavar=option.metavar,
            help=f"{option.help} (ini: {option.dest})",
        )
        parser.addini(option.dest, option.help, type=option.ini_type, default=option.default)  # type: ignore[arg-type]


def _raw(config: pytest.Config, option: _Option) -> Any:
    given = config.getoption(option.dest)
    return given if given is not None else config.getini(option.dest)


def read_options(config: pytest.Config) -> HarborOptions:
    """Read and check every option; a bad value is a usage error naming the option."""
    by_name = {option.name: option for option in _OPTIONS}
    invocation_dir = config.invocation_params.dir
    dataset_option = by_name["dataset"]
    given_datasets = config.getoption(dataset_option.dest)
    if given_datasets is not None:
        datasets = [_absolute(invocation_dir / value) for value in given_datasets]
    else:
        datasets = [_absolute(Path(value)) for value in config.getini(dataset_option.dest)]
    for dataset in datasets:
        if not dataset.is_dir():
            raise pytest.UsageError(f"{dataset_option.flag}: {dataset} is not a folder")
    return HarborOptions(
        datasets=tuple(dict.fromkeys(datasets)),
        agent=str(_raw(config, by_name["agent"])),
        sandbox=str(_raw(config, by_name["sandbox"])),
        repeats=_number(config, by_name["repeats"], int, minimum=1),
        results_dir=_absolute(invocation_dir / str(_raw(config, by_name["results-dir"]))),
        pass_reward=_number(config, by_name["pass-reward"], float, minimum=None),
    )


def _number(config: pytest.Config, option: _Option, kind: type, minimum: int | None) -> Any:
    raw = _raw(config, option)
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
