"""The `opensandbox` sandbox provider: sandboxes of an OpenSandbox server, reached over its
documented HTTP APIs (docs/opensandbox.md)."""

from pytest_harbor.sandboxes.opensandbox.options import OpenSandboxOptions
from pytest_harbor.sandboxes.opensandbox.provider import OpenSandboxProvider, opensandbox_provider
from pytest_harbor.sandboxes.opensandbox.sandbox import OpenSandboxSandbox

__all__ = [
    "OpenSandboxOptions",
    "OpenSandboxProvider",
    "OpenSandboxSandbox",
    "opensandbox_provider",
]
