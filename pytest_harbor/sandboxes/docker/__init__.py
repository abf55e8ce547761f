"""The `docker` sandbox provider, on the Docker SDK (never the docker CLI, but for Compose
and BuildKit): one engine (`provider`), or several as one (`fleet`), made from its options
(`options`). Inside: the connection to an engine (`engine`), its images (`images`), a
sandbox (`sandbox`), its limits (`limits`) and its commands' streams (`stream`), Compose
projects (`projects`)."""

from typing import TYPE_CHECKING, Any

from pytest_harbor.sandboxes.docker.engine import Endpoint
from pytest_harbor.sandboxes.docker.images import TOOLS_IMAGE
from pytest_harbor.sandboxes.docker.options import docker_provider
from pytest_harbor.sandboxes.docker.provider import DockerProvider
from pytest_harbor.sandboxes.docker.sandbox import ComposeSandbox, DockerSandbox

if TYPE_CHECKING:
    from pytest_harbor.sandboxes.docker.fleet import DockerFleet, FleetEngine

__all__ = [
    "TOOLS_IMAGE",
    "ComposeSandbox",
    "DockerFleet",
    "DockerProvider",
    "DockerSandbox",
    "Endpoint",
    "FleetEngine",
    "docker_provider",
]


def __getattr__(name: str) -> Any:
    # The fleet's code loads with the first run over several engines.
    if name in ("DockerFleet", "FleetEngine"):
        from pytest_harbor.sandboxes.docker import fleet

        return getattr(fleet, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
