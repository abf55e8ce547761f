"""Sandbox providers behind one protocol; `docker` is built in."""

from __future__ import annotations

from collections.abc import Callable

from pytest_harbor.sandboxes.base import (
    ExecResult,
    ImageConfig,
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
    "ImageSource",
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


def _docker() -> SandboxProvider:
    from pytest_harbor.sandboxes.docker import DockerProvider

    return DockerProvider()


_PROVIDERS: dict[str, Callable[[], SandboxProvider]] = {"docker": _docker}


class UnknownProvider(LookupError):
    pass


def provider_names() -> list[str]:
    return sorted(_PROVIDERS)


def make_provider(name: str) -> SandboxProvider:
    try:
        factory = _PROVIDERS[name]
    except KeyError:
        raise UnknownProvider(
            f"unknown sandbox provider {name!r}; available: {', '.join(provider_names())}"
        ) from None
    return factory()
