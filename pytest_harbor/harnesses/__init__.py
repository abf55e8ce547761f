"""Harnesses: built in `oracle` and `nop`, others from the `pytest_harbor.harnesses` group."""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points

from pytest_harbor.harnesses.base import AgentRun, Harness
from pytest_harbor.harnesses.nop import NopHarness
from pytest_harbor.harnesses.oracle import OracleHarness

__all__ = [
    "ENTRY_POINT_GROUP",
    "AgentRun",
    "Harness",
    "UnknownHarness",
    "harness_names",
    "make_harness",
]

ENTRY_POINT_GROUP = "pytest_harbor.harnesses"

_BUILT_IN: dict[str, Callable[[], Harness]] = {"oracle": OracleHarness, "nop": NopHarness}


class UnknownHarness(LookupError):
    pass


def harness_names() -> list[str]:
    return sorted(set(_BUILT_IN) | {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def make_harness(name: str) -> Harness:
    """A harness by name; an installed entry point may name a class or a factory."""
    if name in _BUILT_IN:
        return _BUILT_IN[name]()
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            factory: Callable[[], Harness] = ep.load()
            return factory()
    raise UnknownHarness(f"unknown harness {name!r}; available: {', '.join(harness_names())}")
