"""The docker provider's `sandbox_provider_options`, checked by one model, and the
provider they make: one engine, or a fleet of several (`hosts`)."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from pytest_harbor.sandboxes.base import ProviderContext, ProviderOptionsError, SandboxProvider
from pytest_harbor.sandboxes.docker.engine import Endpoint
from pytest_harbor.sandboxes.docker.provider import DockerProvider

__all__ = ["DockerOptions", "EngineOption", "docker_provider"]

_URL_SCHEMES = ("unix://", "tcp://", "ssh://")


class EngineOption(BaseModel):
    """One engine of `hosts`: a URL, or a mapping with `url` and optionally `capacity`,
    `name`, `cert_path` (a folder of Docker's ca.pem, cert.pem and key.pem: TLS),
    `tls_verify` and `socket` (the engine's socket on its own machine, which its
    watchdog is given: the path of a unix:// URL, else /var/run/docker.sock)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: StrictStr | None = None
    capacity: StrictInt | None = None
    name: StrictStr | None = None
    cert_path: StrictStr | None = None
    tls_verify: StrictBool = True
    socket: StrictStr | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_url(cls, value: Any) -> Any:
        return {"url": value} if isinstance(value, str) else value

    @field_validator("url")
    @classmethod
    def _scheme(cls, url: str | None) -> str | None:
        if url is None or not url.startswith(_URL_SCHEMES):
            raise ValueError(
                f"expected unix://PATH, tcp://HOST:PORT or ssh://USER@HOST, got {url!r}"
            )
        if url.startswith("ssh://") and not _can_ssh():
            raise ValueError(
                "an ssh:// engine needs paramiko, which the Docker SDK imports for it: "
                "pip install 'pytest-harbor[ssh]'"
            )
        return url

    @field_validator("capacity")
    @classmethod
    def _capacity(cls, capacity: int | None) -> int | None:
        if capacity is not None and capacity < 1:
            raise ValueError("expected a whole number of at least 1")
        return capacity

    @model_validator(mode="after")
    def _certificates(self) -> EngineOption:
        if self.url is None:
            self._scheme(None)
        if self.cert_path is not None:
            needed = ["cert.pem", "key.pem", *(["ca.pem"] if self.tls_verify else [])]
            missing = [name for name in needed if not (Path(self.cert_path) / name).is_file()]
            if missing:
                raise ValueError(
                    f"cert_path: {self.cert_path} has no {', '.join(missing)} (the folder holds "
                    "the client's TLS files as Docker names them)"
                )
        return self

    def endpoint(self) -> Endpoint:
        assert self.url is not None
        return Endpoint(self.url, cert_path=self.cert_path, tls_verify=self.tls_verify)


class DockerOptions(BaseModel):
    """`network` (the Docker network sandboxes with the network are on), `builder` (auto,
    buildkit or classic) and `hosts` (several engines)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    network: StrictStr | None = None
    builder: Literal["auto", "buildkit", "classic"] = "auto"
    hosts: list[EngineOption] | None = None

    @field_validator("network")
    @classmethod
    def _network(cls, network: str | None) -> str | None:
        if network is not None and not network:
            raise ValueError("must be a network's name")
        return network

    @field_validator("hosts", mode="before")
    @classmethod
    def _hosts(cls, hosts: Any) -> Any:
        if hosts is not None and (not isinstance(hosts, list) or not hosts):
            raise ValueError("must be a list of engines")
        return hosts

    @model_validator(mode="after")
    def _distinct(self) -> DockerOptions:
        urls = [host.url for host in self.hosts or ()]
        if len(set(urls)) != len(urls):
            raise ValueError("name one engine twice")
        return self

    def provider(self, context: ProviderContext) -> SandboxProvider:
        """One engine's provider (the environment's engine), or a fleet of `hosts`."""
        if self.hosts is None:
            return DockerProvider(network=self.network, builder=self.builder)
        # Loaded only by a run over several engines.
        from pytest_harbor.sandboxes.docker.fleet import DockerFleet, FleetEngine

        engines = [
            FleetEngine(
                name=host.name or str(host.url),
                provider=DockerProvider(
                    network=self.network,
                    builder=self.builder,
                    endpoint=host.endpoint(),
                    engine_socket=host.socket,
                ),
                capacity=host.capacity,
            )
            for host in self.hosts
        ]
        return DockerFleet(engines, context)


def docker_provider(options: Mapping[str, Any], context: ProviderContext) -> SandboxProvider:
    """The docker provider from its `sandbox_provider_options`; ProviderOptionsError, naming
    the option, for what it does not take."""
    try:
        return DockerOptions.model_validate(dict(options)).provider(context)
    except ValidationError as error:
        raise ProviderOptionsError(_message(error)) from None


def _message(error: ValidationError) -> str:
    """The first problem in the words the options' users read: where, then what."""
    first = error.errors()[0]
    location = [part for part in first["loc"] if part not in ("function-after", "[key]")]
    message = str(first["msg"]).removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        *parent, key = location
        if parent:
            where = _where(parent)
            known = ", ".join(sorted(EngineOption.model_fields))
            return f"{where}: unknown keys {key} (an engine takes {known})"
        return (
            "the docker provider takes the options network, builder and hosts, not: "
            + ", ".join(str(e["loc"][0]) for e in error.errors() if e["type"] == "extra_forbidden")
        )
    if location == ["builder"]:
        return "the docker provider's builder is auto, buildkit or classic"
    if location == ["network"]:
        return "the docker provider's network must be a network's name"
    if location == ["hosts"]:
        return f"the docker provider's hosts {message}"
    if not location:
        return f"the docker provider's hosts {message}"
    if len(location) == 2:  # the engine itself, or a check across its keys
        if message.startswith("cert_path: "):
            return f"{_where(location)}.{message}"
        if first["type"] in ("model_type", "dict_type", "model_attributes_type"):
            return f"{_where(location)}: expected an engine URL or a mapping with url"
        if message.startswith("expected unix://"):
            return f"{_where(location)}.url: {message}"
        return f"{_where(location)}: {message}"
    field = str(location[-1])
    expected = {
        "capacity": "expected a whole number of at least 1",
        "cert_path": "expected a folder's path",
        "tls_verify": "expected true or false",
        "socket": "expected the path of the engine's socket on its machine",
    }
    if field in expected and first["type"] != "value_error":
        message = expected[field]
    return f"{_where(location[:-1])}.{field}: {message}"


def _where(location: list[Any]) -> str:
    """`["hosts", 0]` -> `hosts[0]`."""
    text = ""
    for part in location:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _can_ssh() -> bool:
    return importlib.util.find_spec("paramiko") is not None
