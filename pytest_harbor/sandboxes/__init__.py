"""Sandbox providers behind one protocol; `docker` is built in, others come from the
`pytest_harbor_sandbox_providers` hook or the `pytest_harbor.sandbox_providers` entry
points."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_harbor.registry import Registry
from pytest_harbor.sandboxes.base import (
    ArchiveStream,
    BuildOptions,
    ExecResult,
    ImageConfig,
    ImageLayer,
    ImageSource,
    NamesBuilder,
    Placement,
    PlacesEpisodes,
    ProviderContext,
    ProviderFactory,
    ProviderOptionsError,
    ReportsStart,
    Sandbox,
    SandboxCapabilities,
    SandboxError,
    SandboxProvider,
    SandboxSpec,
    SandboxStartError,
    SandboxStatus,
    ServiceGroup,
    SweepsLeftovers,
    service_of,
)

__all__ = [
    "BUILT_IN_PROVIDERS",
    "PROVIDERS",
    "PROVIDER_ENTRY_POINT_GROUP",
    "ArchiveStream",
    "BuildOptions",
    "ExecResult",
    "ImageConfig",
    "ImageLayer",
    "ImageSource",
    "NamesBuilder",
    "Placement",
    "PlacesEpisodes",
    "ProviderContext",
    "ProviderFactory",
    "ProviderOptionsError",
    "ReportsStart",
    "Sandbox",
    "SandboxCapabilities",
    "SandboxError",
    "SandboxProvider",
    "SandboxSpec",
    "SandboxStartError",
    "SandboxStatus",
    "ServiceGroup",
    "SweepsLeftovers",
    "UnknownProvider",
    "make_provider",
    "provider_names",
    "service_of",
]


#: The entry-point group an installed package names its sandbox providers in.
PROVIDER_ENTRY_POINT_GROUP = "pytest_harbor.sandbox_providers"


def _docker(*, options: Mapping[str, Any], context: ProviderContext) -> SandboxProvider:
    from pytest_harbor.sandboxes.docker import docker_provider

    return docker_provider(options, context)


def _opensandbox(*, options: Mapping[str, Any], context: ProviderContext) -> SandboxProvider:
    from pytest_harbor.sandboxes.opensandbox import opensandbox_provider

    return opensandbox_provider(options=options, context=context)


BUILT_IN_PROVIDERS: dict[str, ProviderFactory] = {"docker": _docker, "opensandbox": _opensandbox}


class UnknownProvider(LookupError):
    pass


#: Sandbox providers by name: built in, from the pytest hook, from installed packages.
PROVIDERS: Registry[ProviderFactory] = Registry(
    "sandbox provider", PROVIDER_ENTRY_POINT_GROUP, BUILT_IN_PROVIDERS
)


def provider_names(registered: Mapping[str, ProviderFactory] | None = None) -> list[str]:
    return PROVIDERS.names(registered)


def make_provider(
    name: str,
    options: Mapping[str, Any] | None = None,
    *,
    registered: Mapping[str, ProviderFactory] | None = None,
    context: ProviderContext | None = None,
) -> SandboxProvider:
    """The provider `name` (built in, `registered` by the pytest hook, or an installed
    entry point naming a factory or a class), set up with `options` (the
    `sandbox_provider_options`)."""
    factory = PROVIDERS.find(name, registered)
    if factory is None:
        raise UnknownProvider(
            f"unknown sandbox provider {name!r}; available: "
            + ", ".join(provider_names(registered))
        )
    return factory(options=dict(options or {}), context=context or ProviderContext())
