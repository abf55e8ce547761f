"""Sandbox providers behind one protocol; `docker` is built in."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pytest_harbor.sandboxes.base import (
    ExecResult,
    ImageConfig,
    ImageLayer,
    ImageSource,
    Sandbox,
    SandboxCapabilities,
    SandboxError,
    SandboxProvider,
    SandboxSpec,
    SandboxStartError,
)

__all__ = [
    "ExecResult",
    "ImageConfig",
    "ImageLayer",
    "ImageSource",
    "ProviderOptionsError",
    "Sandbox",
    "SandboxCapabilities",
    "SandboxError",
    "SandboxProvider",
    "SandboxSpec",
    "SandboxStartError",
    "UnknownProvider",
    "make_provider",
    "provider_names",
]


def _docker(options: Mapping[str, Any]) -> SandboxProvider:
    from pytest_harbor.sandboxes.docker import DockerProvider

    unknown = sorted(set(options) - {"network", "builder"})
    if unknown:
        raise ProviderOptionsError(
            "the docker provider takes the options network and builder, not: " + ", ".join(unknown)
        )
    builder = options.get("builder", "auto")
    if builder not in ("auto", "buildkit", "classic"):
        raise ProviderOptionsError("the docker provider's builder is auto, buildkit or classic")
    network = options.get("network")
    if network is not None and (not isinstance(network, str) or not network):
        raise ProviderOptionsError("the docker provider's network must be a network's name")
    return DockerProvider(network=network, builder=builder)


_PROVIDERS: dict[str, Callable[[Mapping[str, Any]], SandboxProvider]] = {"docker": _docker}


class UnknownProvider(LookupError):
    pass


class ProviderOptionsError(ValueError):
    """`sandbox_provider_options` the provider does not take; names the key."""


def provider_names() -> list[str]:
    return sorted(_PROVIDERS)


def make_provider(name: str, options: Mapping[str, Any] | None = None) -> SandboxProvider:
    """The provider `name`, set up with `options` (the `sandbox_provider_options`)."""
    try:
        factory = _PROVIDERS[name]
    except KeyError:
        raise UnknownProvider(
            f"unknown sandbox provider {name!r}; available: {', '.join(provider_names())}"
        ) from None
    return factory(dict(options or {}))
