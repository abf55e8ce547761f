"""The docker provider's `sandbox_provider_options`, checked by one model, and the
provider they make: one engine, or a fleet of several (`hosts`)."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    ModelWrapValidatorHandler,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pytest_harbor.sandboxes.base import ProviderContext, ProviderOptionsError, SandboxProvider
from pytest_harbor.sandboxes.docker.engine import Endpoint
from pytest_harbor.sandboxes.docker.provider import DockerProvider

__all__ = ["DockerOptions", "EngineOption", "docker_provider"]

_URL_SCHEMES = ("unix://", "tcp://", "ssh://")
#: The builders the `builder` option names.
_BUILDERS = ("auto", "buildkit", "classic")
#: The key of the validation context that says where an engine of `hosts` is
#: (`hosts[0]`): the start of every sentence about it.
_WHERE = "where"
#: An engine's keys whose values are text, and what each says of a value that is not.
_TEXT_KEYS = {
    "name": "Input should be a valid string",
    "cert_path": "expected a folder's path",
    "socket": "expected the path of the engine's socket on its machine",
}


class EngineOption(BaseModel):
    """One engine of `hosts`: a URL, or a mapping with `url` and optionally `capacity`,
    `name`, `cert_path` (a folder of Docker's ca.pem, cert.pem and key.pem: TLS),
    `tls_verify` and `socket` (the engine's socket on its own machine, which its
    watchdog is given: the path of a unix:// URL, else /var/run/docker.sock).

    Each check raises the whole sentence its user reads, starting with where the engine
    is (the validation context's `where`, which DockerOptions gives)."""

    # Unknown keys are refused by _checked(), once the known keys' values are.
    model_config = ConfigDict(extra="ignore", frozen=True)

    url: StrictStr | None = None
    capacity: StrictInt | None = None
    name: StrictStr | None = None
    cert_path: StrictStr | None = None
    tls_verify: StrictBool = True
    socket: StrictStr | None = None

    @field_validator("url", mode="before")
    @classmethod
    def _url(cls, url: Any, info: ValidationInfo) -> Any:
        _check_url(url, _where(info))
        return url

    @field_validator("capacity", mode="before")
    @classmethod
    def _capacity(cls, capacity: Any, info: ValidationInfo) -> Any:
        if capacity is not None and (
            not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1
        ):
            raise ValueError(f"{_where(info)}.capacity: expected a whole number of at least 1")
        return capacity

    @field_validator(*_TEXT_KEYS, mode="before")
    @classmethod
    def _text(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and not isinstance(value, str):
            key = str(info.field_name)
            raise ValueError(f"{_where(info)}.{key}: {_TEXT_KEYS[key]}")
        return value

    @field_validator("tls_verify", mode="before")
    @classmethod
    def _tls_verify(cls, tls_verify: Any, info: ValidationInfo) -> Any:
        if not isinstance(tls_verify, bool):
            raise ValueError(f"{_where(info)}.tls_verify: expected true or false")
        return tls_verify

    @model_validator(mode="wrap")
    @classmethod
    def _checked(
        cls, value: Any, handler: ModelWrapValidatorHandler[Self], info: ValidationInfo
    ) -> Self:
        """A URL or a mapping; its keys' values, then its unknown keys, then its url,
        then its certificates: the first problem is the one told."""
        if isinstance(value, cls):
            return value
        where = _where(info)
        if isinstance(value, str):
            value = {"url": value}
        if not isinstance(value, Mapping):
            raise ValueError(f"{where}: expected an engine URL or a mapping with url")
        engine = handler(_named(value))
        unknown = _unknown_keys(value, cls.model_fields, where)
        if unknown:
            known = ", ".join(sorted(cls.model_fields))
            raise ValueError(f"{where}: unknown keys {unknown[0]} (an engine takes {known})")
        if engine.url is None:
            _check_url(None, where)
        if engine.cert_path is not None:
            needed = ["cert.pem", "key.pem", *(["ca.pem"] if engine.tls_verify else [])]
            missing = [name for name in needed if not (Path(engine.cert_path) / name).is_file()]
            if missing:
                raise ValueError(
                    f"{where}.cert_path: {engine.cert_path} has no {', '.join(missing)} (the "
                    "folder holds the client's TLS files as Docker names them)"
                )
        return engine

    def endpoint(self) -> Endpoint:
        assert self.url is not None
        return Endpoint(self.url, cert_path=self.cert_path, tls_verify=self.tls_verify)


class DockerOptions(BaseModel):
    """`network` (the Docker network sandboxes with the network are on), `builder` (auto,
    buildkit or classic) and `hosts` (several engines). Each check raises the whole
    sentence its user reads."""

    # Unknown keys are refused by _checked(), once the known keys' values are.
    model_config = ConfigDict(extra="ignore", frozen=True)

    network: StrictStr | None = None
    builder: Literal["auto", "buildkit", "classic"] = "auto"
    hosts: list[EngineOption] | None = None

    @field_validator("network", mode="before")
    @classmethod
    def _network(cls, network: Any) -> Any:
        if network is not None and (not isinstance(network, str) or not network):
            raise ValueError("the docker provider's network must be a network's name")
        return network

    @field_validator("builder", mode="before")
    @classmethod
    def _builder(cls, builder: Any) -> Any:
        if builder not in _BUILDERS:
            raise ValueError("the docker provider's builder is auto, buildkit or classic")
        return builder

    @field_validator("hosts", mode="before")
    @classmethod
    def _hosts(cls, hosts: Any) -> Any:
        if hosts is None:
            return None
        if not isinstance(hosts, list) or not hosts:
            raise ValueError("the docker provider's hosts must be a list of engines")
        return [
            EngineOption.model_validate(host, context={_WHERE: f"hosts[{index}]"})
            for index, host in enumerate(hosts)
        ]

    @model_validator(mode="wrap")
    @classmethod
    def _checked(cls, value: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        """The options' values, then their unknown keys (all named), then whether an
        engine is named twice: the first problem is the one told."""
        if not isinstance(value, Mapping):
            return handler(value)
        options = handler(_named(value))
        unknown = _unknown_keys(value, cls.model_fields, "")
        if unknown:
            raise ValueError(
                "the docker provider takes the options network, builder and hosts, not: "
                + ", ".join(unknown)
            )
        urls = [host.url for host in options.hosts or ()]
        if len(set(urls)) != len(urls):
            raise ValueError("the docker provider's hosts name one engine twice")
        return options

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
        raise ProviderOptionsError(_first_sentence(error)) from None


def _first_sentence(error: ValidationError) -> str:
    """The first problem found, as the check that found it worded it."""
    first = error.errors()[0]
    raised = first.get("ctx", {}).get("error")
    return str(first["msg"]) if raised is None else str(raised)


def _where(info: ValidationInfo) -> str:
    """Where the engine being checked is in the options (`hosts[0]`)."""
    return str((info.context or {}).get(_WHERE, "hosts"))


def _named(value: Mapping[Any, Any]) -> dict[str, Any]:
    """A mapping's entries under names (the others are refused by _unknown_keys())."""
    return {key: item for key, item in value.items() if isinstance(key, str)}


def _unknown_keys(value: Mapping[Any, Any], known: Mapping[str, Any], where: str) -> list[str]:
    """The names in `value` that are not `known`, in the order given; a key that is not a
    name is refused when it comes before them."""
    unknown: list[str] = []
    for key in value:
        if not isinstance(key, str):
            if not unknown:
                raise ValueError(f"{where}.{key}: Keys should be strings")
        elif key not in known:
            unknown.append(key)
    return unknown


def _check_url(url: Any, where: str) -> None:
    """An engine's URL: text in one of the schemes, ssh:// only where paramiko is."""
    if url is not None and not isinstance(url, str):
        raise ValueError(f"{where}.url: Input should be a valid string")
    if url is None or not url.startswith(_URL_SCHEMES):
        raise ValueError(
            f"{where}.url: expected unix://PATH, tcp://HOST:PORT or ssh://USER@HOST, got {url!r}"
        )
    if url.startswith("ssh://") and not _can_ssh():
        raise ValueError(
            f"{where}.url: an ssh:// engine needs paramiko, which the Docker SDK imports "
            "for it: pip install 'pytest-harbor[ssh]'"
        )


def _can_ssh() -> bool:
    return importlib.util.find_spec("paramiko") is not None
