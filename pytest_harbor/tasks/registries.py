"""Which registry an image reference names, and whether the engine may pull from it: an
image is pulled by the engine itself, over this machine's own network, so a registry on
this machine or a private network reaches what no sandbox may.

A reference names a registry when its first component (before the first `/`) holds a `.`
or a `:`, is `localhost`, or holds a capital letter: Docker's own rule (distribution's
`splitDockerDomain`); `ubuntu:24.04` and `library/debian` name Docker Hub. The registry's
host is refused when it is this machine (`localhost`, `*.localhost`) or an address that is
not a global public one (loopback, private, shared 100.64/10, link-local such as the cloud
metadata service's 169.254.169.254, unique-local, multicast, unspecified, reserved), IPv4
in any form a resolver reads (`127.1`, `0x7f000001`) or IPv6 in brackets. A host name is
not resolved: what DNS says it is can change between this check and the pull.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from ipaddress import IPv4Address, IPv6Address
from pathlib import Path

from pytest_harbor.tasks.config import EnvironmentConfig, TaskConfig
from pytest_harbor.tasks.errors import TaskLoadError

__all__ = ["check_task_images", "registry_host", "registry_problem"]

#: What the refusal tells the task's author to do instead.
INSTEAD = (
    "name an image in a registry the engine reaches over the public network, or one "
    "already on the engine under a name without that registry"
)
#: Names of this machine itself (RFC 6761: every name under `localhost` is loopback).
_THIS_MACHINE = re.compile(r"^(.*\.)?localhost$")
#: An IPv4 address as inet_aton reads it: one to four numbers, each decimal, octal
#: (a leading 0) or hexadecimal (0x).
_LEGACY_IPV4 = re.compile(r"^(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+)){0,3}$")
#: The address kinds that are not public, first match named.
_KINDS = (
    ("is_loopback", "a loopback address of this machine"),
    ("is_unspecified", "the unspecified address, which is this machine"),
    ("is_link_local", "a link-local address (where cloud metadata services answer)"),
    ("is_multicast", "a multicast address"),
    ("is_private", "a private-network address"),
    ("is_reserved", "a reserved address"),
)


def registry_host(reference: str) -> str | None:
    """The registry part of an image `reference` (`host[:port]`), or None when it names
    none (Docker Hub, or a build stage)."""
    first, slash, _ = reference.strip().partition("/")
    if not slash:
        return None
    if "." in first or ":" in first or first == "localhost" or first != first.lower():
        return first
    return None


def registry_problem(reference: str) -> str | None:
    """Why the engine may not pull `reference` (its registry is this machine or not a
    public address: `names the registry HOST, KIND: ...; INSTEAD`), or None."""
    registry = registry_host(reference)
    if registry is None:
        return None
    kind = _host_kind(_host_of(registry))
    if kind is None:
        return None
    return (
        f"names the registry {registry}, {kind}: the engine would pull it over this "
        "machine's own network, where a sandbox's rules do not apply; " + INSTEAD
    )


def check_task_images(task_file: Path, config: TaskConfig) -> None:
    """TaskLoadError naming `task_file` and the `docker_image` key whose registry the
    engine may not pull from."""
    for key, environment in _environments(config):
        image = environment.docker_image if environment is not None else None
        problem = registry_problem(image) if image is not None else None
        if problem is not None:
            raise TaskLoadError(task_file, f"{image} {problem}", key=f"{key}.docker_image")


def _environments(config: TaskConfig) -> Iterator[tuple[str, EnvironmentConfig | None]]:
    yield "environment", config.environment
    yield "verifier.environment", config.verifier.environment
    for index, step in enumerate(config.steps or []):
        yield f"steps[{index}].verifier.environment", step.verifier.environment


def _host_of(registry: str) -> str:
    """The host of `host[:port]` (an IPv6 address is in brackets; one without them, which
    Docker refuses, is judged whole)."""
    if registry.startswith("["):
        return registry[1:].partition("]")[0]
    if registry.count(":") > 1:
        return registry
    return registry.partition(":")[0]


def _host_kind(host: str) -> str | None:
    """What a registry's host is, when it is not a public one; None when it is, or when
    it is a name."""
    host = host.lower().rstrip(".")
    if _THIS_MACHINE.match(host):
        return "a name of this machine"
    address = _address(host)
    if address is None:
        return None
    if isinstance(address, IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    for attribute, kind in _KINDS:
        if getattr(address, attribute):
            return kind
    return None if address.is_global else "not a public address"


def _address(host: str) -> IPv4Address | IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return _legacy_ipv4(host)


def _legacy_ipv4(host: str) -> IPv4Address | None:
    """`host` read as inet_aton reads it (`127.1`, `2130706433`, `0177.0.0.1`), which the
    engine's resolver may do; None when it is not such a number."""
    if not _LEGACY_IPV4.match(host):
        return None
    numbers = []
    for part in host.split("."):
        if part.startswith("0x"):
            base, digits = 16, part[2:] or "0"
        else:
            base, digits = (8 if len(part) > 1 and part.startswith("0") else 10), part
        try:
            numbers.append(int(digits, base))
        except ValueError:  # an octal number with an 8 or a 9
            return None
    *leading, last = numbers
    rest = 32 - 8 * len(leading)
    if any(number > 255 for number in leading) or last >= 1 << rest:
        return None
    value = last
    for index, number in enumerate(leading):
        value |= number << (24 - 8 * index)
    return IPv4Address(value)
