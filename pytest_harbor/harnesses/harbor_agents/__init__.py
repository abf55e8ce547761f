"""Harbor's own agents as harnesses (`--harbor-agent=harbor:NAME`), through an adapter
that presents the episode's sandbox as a Harbor environment. Needs the optional extra
`pytest-harbor[harbor-agents]` (Harbor, on Python 3.12 or newer)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from pytest_harbor.harnesses.base import Harness

__all__ = ["HARBOR_PREFIX", "harbor_agent"]

HARBOR_PREFIX = "harbor:"
#: Harbor's releases this adapter is tested with.
HARBOR_VERSIONS = ">=0.26,<0.27"


def harbor_agent(name: str, options: Mapping[str, Any] | None) -> Harness:
    """The harness for `harbor:NAME`; ImportError says what to install when Harbor is not
    importable here."""
    major, minor = sys.version_info.major, sys.version_info.minor
    if (major, minor) < (3, 12):
        raise ImportError(
            f"Harbor's agents need Python 3.12 or newer (this is {sys.version.split()[0]}); "
            "run pytest from a Python 3.12 environment with pytest-harbor[harbor-agents]"
        )
    try:
        import harbor  # noqa: F401
    except ImportError:
        raise ImportError(
            "Harbor is not installed: install pytest-harbor[harbor-agents] "
            f"(Harbor {HARBOR_VERSIONS})"
        ) from None
    from pytest_harbor.harnesses.harbor_agents.harness import HarborAgentHarness
    from pytest_harbor.harnesses.harbor_agents.private import require_all

    require_all()
    return HarborAgentHarness(name.removeprefix(HARBOR_PREFIX), options)
