"""The watchdog of one pytest-harbor process (pytest-harbor).

It runs in a container of its own on the engine, with the engine's socket and no network.
The process that started it holds the container's input open through the engine (an
attach), and never writes to it. When that connection drops, whatever the cause (the
process ended, was killed with SIGKILL, or its machine went away), the engine closes the
input; the watchdog then removes everything on the engine that carries both labels it
was given (the run's and the process's): containers, then networks, volumes and snapshot
images. What is kept as a cache (labelled `pytest-harbor.cache`) and built images are
left alone. Standard library only.

    python3 watchdog.py SOCKET ENGINE_ID LABEL=VALUE [LABEL=VALUE ...]

ENGINE_ID is the engine's ID as the process sees it: a socket that leads to another engine
(a remote engine's default socket path on a machine that runs two) is refused at start.
"""

from __future__ import annotations

import http.client
import json
import socket
import sys
import time
import urllib.parse

CACHE_LABEL = "pytest-harbor.cache"
SNAPSHOT_REPOSITORY = "pytest-harbor-snapshot"
#: After the connection drops: a moment for the engine to finish what the process asked.
GRACE_S = 1.0
PASSES = 3
TIMEOUT_S = 60.0


def say(message: str) -> None:
    print(f"watchdog: {message}", flush=True)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=TIMEOUT_S)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(TIMEOUT_S)
        sock.connect(self._path)
        self.sock = sock


class Engine:
    def __init__(self, path: str) -> None:
        self.path = path

    def call(self, method: str, path: str, query: dict[str, str] | None = None) -> object:
        """The answer's JSON (None for an empty one); raises OSError or ValueError."""
        connection = _UnixConnection(self.path)
        try:
            url = path + ("?" + urllib.parse.urlencode(query) if query else "")
            connection.request(method, url)
            response = connection.getresponse()
            body = response.read()
        finally:
            connection.close()
        if response.status >= 400 and response.status != 404:
            raise ValueError(f"{method} {path}: {response.status} {body[:200]!r}")
        if not response.getheader("Content-Type", "").startswith("application/json"):
            return None
        return json.loads(body) if body.strip() else None


def sweep(engine: Engine, labels: list[str]) -> int:
    """Remove what carries every one of `labels`; how many were removed."""
    filters = json.dumps({"label": labels})
    removed = 0
    for container in _listed(
        engine.call("GET", "/containers/json", {"all": "1", "filters": filters})
    ):
        if _cached(container):
            continue
        engine.call("DELETE", f"/containers/{container['Id']}", {"force": "1", "v": "1"})
        removed += 1
    for network in _listed(engine.call("GET", "/networks", {"filters": filters})):
        if not _cached(network):
            engine.call("DELETE", f"/networks/{network['Id']}")
            removed += 1
    volumes = engine.call("GET", "/volumes", {"filters": filters})
    for volume in _listed(volumes.get("Volumes") if isinstance(volumes, dict) else None):
        if not _cached(volume):
            engine.call(
                "DELETE", f"/volumes/{urllib.parse.quote(str(volume['Name']))}", {"force": "1"}
            )
            removed += 1
    images = json.dumps({"label": labels, "reference": [SNAPSHOT_REPOSITORY]})
    for image in _listed(engine.call("GET", "/images/json", {"filters": images})):
        engine.call("DELETE", f"/images/{image['Id']}", {"force": "1"})
        removed += 1
    return removed


def _listed(found: object) -> list[dict[str, object]]:
    return [item for item in found if isinstance(item, dict)] if isinstance(found, list) else []


def _cached(item: dict[str, object]) -> bool:
    labels = item.get("Labels")
    return isinstance(labels, dict) and CACHE_LABEL in labels


def main(arguments: list[str]) -> int:
    if len(arguments) < 3 or not all("=" in label for label in arguments[2:]):
        say("usage: watchdog.py SOCKET ENGINE_ID LABEL=VALUE [LABEL=VALUE ...]")
        return 2
    engine, expected, labels = Engine(arguments[0]), arguments[1], arguments[2:]
    try:
        info = engine.call("GET", "/info")
    except (OSError, ValueError) as error:
        say(f"cannot reach the engine at {engine.path}: {error}")
        return 1
    found = info.get("ID") if isinstance(info, dict) else None
    if found != expected:
        say(f"the socket at {engine.path} leads to another engine ({found}, not {expected})")
        return 1
    say("ready")
    while sys.stdin.buffer.read(4096):
        pass  # nothing is ever sent: only the end of the input counts
    time.sleep(GRACE_S)
    removed = 0
    for _ in range(PASSES):
        try:
            swept = sweep(engine, labels)
        except (OSError, ValueError) as error:
            say(f"sweep failed: {error}")
            time.sleep(1.0)
            continue
        removed += swept
        if swept == 0:
            break
    say(f"removed {removed}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
