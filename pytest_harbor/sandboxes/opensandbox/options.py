"""The opensandbox provider's `sandbox_provider_options`, checked by one model.

The server's address and the name of the variable holding its key default to what the
reference design and OpenSandbox's own SDK read from the environment; the key itself is
never an option, so it is never written where the run records its settings. Neither is
a server's pool: a pooled sandbox's command daemon cannot be the run's alone."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationError,
    field_validator,
)

from pytest_harbor.sandboxes.base import ProviderOptionsError
from pytest_harbor.sandboxes.opensandbox.api import Bounds

__all__ = [
    "DOMAIN_VARIABLES",
    "KEY_VARIABLES",
    "POOL_KEYS",
    "OpenSandboxOptions",
    "read_options",
]

#: Where the server's address is read from when the options name none: the reference's
#: name first, then the OpenSandbox SDK's.
DOMAIN_VARIABLES = ("OPENSANDBOX_DOMAIN", "OPEN_SANDBOX_DOMAIN")
#: The variables the key is read from, in that order, unless `api_key_env` names one.
KEY_VARIABLES = ("OPENSANDBOX_API_KEY", "OPEN_SANDBOX_API_KEY")

#: The keys that would start sandboxes from the server's pools, refused saying why
#: (docs/opensandbox.md, "Server pools").
POOL_KEYS = ("pools", "pool", "pool_ref", "poolRef")
_NO_POOLS = (
    "the opensandbox provider does not start sandboxes from the server's pools: a pooled "
    "sandbox gets the run's environment, and its command daemon the run's token, only "
    "through the pool's task executor, which runs as root whatever any process in the "
    "sandbox asks of it and keeps the token where every user reads it; without one, the "
    "daemon answers without the run's token. Leave it out: each sandbox is created from "
    "the task's image (docs/opensandbox.md, Server pools)"
)

_REGISTRY = re.compile(r"^[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[a-z0-9._/-]+)?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")


class OpenSandboxOptions(BaseModel):
    """`sandbox_provider_options` of the opensandbox provider."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The lifecycle server: `host:port`, with `http://` or `https://` or not.
    domain: StrictStr | None = None
    #: The variable holding the server's key (its value is a secret: never an option).
    api_key_env: StrictStr | None = None
    #: Where images built here are pushed for the cluster to pull: `host[:port][/path]`.
    registry: StrictStr | None = None
    #: Reach each sandbox's execd through the server's proxy instead of its own address.
    use_server_proxy: StrictBool = False
    #: cpu and memory for a task that names none (the server requires both).
    default_cpu: StrictStr = "1"
    default_memory: StrictStr = "2Gi"
    #: A sandbox's lifetime when the engine gives none, in seconds.
    default_ttl_s: int = Field(default=6 * 3600, ge=60)
    #: The bounds on every call (api.Bounds): one answer; a command's stream or a
    #: download that sends nothing; execd answering nothing before the sandbox is lost.
    request_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    quiet_timeout_s: float = Field(default=15.0, gt=0, le=3600)
    unanswered_timeout_s: float = Field(default=60.0, gt=0, le=86400)
    #: Sandboxes being created at once (from the create to its execd's first answer),
    #: and creates a second, across every process of the run on this machine.
    #: The server attaches its egress sidecar in `dns+nft` mode: phases without the
    #: network and allow-lists are held by each sandbox's egress policy.
    network_policy: StrictBool = False
    max_starting: int = Field(default=4, ge=1, le=100_000)
    starts_per_second: float = Field(default=10.0, gt=0, le=100_000)

    @field_validator("registry")
    @classmethod
    def _registry(cls, value: str | None) -> str | None:
        if value is not None and not _REGISTRY.match(value):
            raise ValueError(f"expected host[:port][/path], got {value!r}")
        return value

    @field_validator("default_cpu", "default_memory")
    @classmethod
    def _quantity(cls, value: str) -> str:
        if not _QUANTITY.match(value):
            raise ValueError(f"expected a quantity like 500m, 2 or 2Gi, got {value!r}")
        return value

    @field_validator("api_key_env")
    @classmethod
    def _variable(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", value):
            raise ValueError(f"expected the name of an environment variable, got {value!r}")
        return value

    def bounds(self) -> Bounds:
        return Bounds(
            request_s=self.request_timeout_s,
            quiet_s=self.quiet_timeout_s,
            unanswered_s=self.unanswered_timeout_s,
        )

    def server(self, environ: Mapping[str, str]) -> str:
        """The server's address, from the options or the environment."""
        found = self.domain or next(
            (environ[name] for name in DOMAIN_VARIABLES if environ.get(name)), ""
        )
        if not found:
            raise ProviderOptionsError(
                "the opensandbox provider needs its server's address: set "
                f"{DOMAIN_VARIABLES[0]} (or {DOMAIN_VARIABLES[1]}), or "
                "sandbox_provider_options.domain"
            )
        return found

    def key(self, environ: Mapping[str, str]) -> str:
        """The server's key, from the variable the options name (else the usual ones);
        empty for a server that takes none."""
        if self.api_key_env is not None:
            value = environ.get(self.api_key_env)
            if not value:
                raise ProviderOptionsError(
                    f"api_key_env: the variable {self.api_key_env} is not set"
                )
            return value
        return next((environ[name] for name in KEY_VARIABLES if environ.get(name)), "")


def read_options(options: Mapping[str, Any]) -> OpenSandboxOptions:
    """The options checked; ProviderOptionsError naming the key that is wrong."""
    if "api_key" in options:
        raise ProviderOptionsError(
            "api_key: the key is a secret and the run records its options; name the "
            "variable that holds it instead (api_key_env), or set OPENSANDBOX_API_KEY"
        )
    pooled = next((key for key in POOL_KEYS if key in options), None)
    if pooled is not None:
        raise ProviderOptionsError(f"{pooled}: {_NO_POOLS}")
    try:
        return OpenSandboxOptions.model_validate(dict(options))
    except ValidationError as error:
        first = error.errors()[0]
        key = ".".join(str(part) for part in first["loc"]) or "options"
        if first["type"] == "extra_forbidden":
            known = ", ".join(OpenSandboxOptions.model_fields)
            raise ProviderOptionsError(
                f"the opensandbox provider takes the options {known}; not: {key}"
            ) from None
        raise ProviderOptionsError(f"{key}: {first['msg']}") from None


def environment() -> Mapping[str, str]:
    return os.environ
