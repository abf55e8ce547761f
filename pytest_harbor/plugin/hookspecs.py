"""Hooks a pytest plugin or a conftest.py implements to extend pytest-harbor."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from pytest_harbor.harnesses.base import HarnessFactory
from pytest_harbor.sandboxes import ProviderFactory

__all__ = ["pytest_harbor_harnesses", "pytest_harbor_sandbox_providers"]


@pytest.hookspec
def pytest_harbor_harnesses() -> Mapping[str, HarnessFactory]:  # type: ignore[empty-body]
    """Harnesses by the name `--harbor-agent` gives them, each a factory called with
    `options=` (the `--harbor-agent-option` values). Every implementation's names are
    added to the built-in ones and the `pytest_harbor.harnesses` entry points; a name
    given twice is a usage error."""


@pytest.hookspec
def pytest_harbor_sandbox_providers() -> Mapping[str, ProviderFactory]:  # type: ignore[empty-body]
    """Sandbox providers by the name `--harbor-sandbox` gives them, each a factory called
    with `options=` (the `sandbox_provider_options` setting) and `context=` (a
    ProviderContext). Every implementation's names are added to the built-in `docker` and
    the `pytest_harbor.sandbox_providers` entry points; a name given twice is a usage
    error."""
