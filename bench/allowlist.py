"""What an allow-listed network costs a sandbox: its start and its removal, with and
without the egress beside it (the docker provider, this machine's engine).

A sandbox of a task with an allow-listed phase starts beside an egress container of its
own, on a network of the two of them; both, and the network, go when it is removed. The
egress image is made once (not counted: one start of each kind runs first).

    .venv/bin/python bench/allowlist.py [--starts 8]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

from pytest_harbor.sandboxes.base import SandboxSpec
from pytest_harbor.sandboxes.docker import DockerProvider

IMAGE = "debian:bookworm-slim"


def once(provider: DockerProvider, labels: dict[str, str], filtered: bool) -> tuple[float, float]:
    """Seconds to start a sandbox, and to remove it."""
    started = time.monotonic()
    sandbox = provider.start(
        SandboxSpec(
            image=IMAGE,
            labels=labels,
            filtered=filtered,
            allowed_hosts=("pypi.org",) if filtered else None,
        )
    )
    start_s = time.monotonic() - started
    started = time.monotonic()
    sandbox.stop()
    return start_s, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=8)
    starts = parser.parse_args().starts
    provider = DockerProvider()
    labels = {"pytest-harbor.run": f"bench-allowlist-{uuid.uuid4().hex[:8]}"}
    try:
        once(provider, labels, True)
        once(provider, labels, False)
        for filtered in (False, True):
            runs = [once(provider, labels, filtered) for _ in range(starts)]
            kind = "with its egress" if filtered else "plain"
            print(
                f"{kind:>16}: start p50 {statistics.median(r[0] for r in runs) * 1000:.0f} ms, "
                f"removal p50 {statistics.median(r[1] for r in runs) * 1000:.0f} ms "
                f"({starts} each)"
            )
    finally:
        provider.remove_labelled(labels)


if __name__ == "__main__":
    main()
