"""The watchdog of one pytest-harbor process (pytest-harbor).

It runs in a container of its own on the engine, with the engine's socket, in the engine
host's network namespace with CAP_NET_ADMIN alone (it holds the border, border.py). The
process that started it holds the container's input open through the engine (an attach),
and writes nothing to it. When that connection drops, whatever the cause (the process
ended, was killed with SIGKILL, or its machine went away), the engine closes the input;
the watchdog lets its openings in the border go, then removes everything on the engine
that carries both labels it was given (the run's and the process's): containers, then
networks, volumes and snapshot images. What is kept as a cache (labelled
`pytest-harbor.cache`) and built images are left alone. A process that wrote a line to
its input first has a new watchdog: this one retires, sweeping nothing. Standard library
only.

    python3 watchdog.py SOCKET ENGINE_ID [--border HOLDER [--open OPENING]...] [LABEL=VALUE ...]

With `--border`, it first makes the engine host's border (border.py) and holds the
OPENINGs under HOLDER (12 hex digits) until its input ends. With no LABEL it sweeps
nothing.

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

import border  # type: ignore[import-not-found]  # beside it in the image

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
    # A container is never a cache, whatever its labels say: it inherits its image's, which
    # a task's Dockerfile or an install layer (pytest-harbor.cache=layer) gives it.
    for container in _listed(
        engine.call("GET", "/containers/json", {"all": "1", "filters": filters})
    ):
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


def parse(arguments: list[str]) -> tuple[str, str, str | None, list[str], list[str]] | None:
    """(socket, engine id, border holder or None, openings, labels), or None when the
    arguments do not say all of it."""
    if len(arguments) < 2:
        return None
    path, expected, rest = arguments[0], arguments[1], arguments[2:]
    holder: str | None = None
    openings: list[str] = []
    labels: list[str] = []
    while rest:
        word, rest = rest[0], rest[1:]
        if word in ("--border", "--open"):
            if not rest:
                return None
            value, rest = rest[0], rest[1:]
            if word == "--border":
                holder = value
            else:
                openings.append(value)
        elif "=" in word:
            labels.append(word)
        else:
            return None
    if openings and holder is None:
        return None
    return path, expected, holder, openings, labels


def main(arguments: list[str]) -> int:
    parsed = parse(arguments)
    if parsed is None:
        say(
            "usage: watchdog.py SOCKET ENGINE_ID [--border HOLDER [--open OPENING]...] "
            "[LABEL=VALUE ...]"
        )
        return 2
    path, expected, holder, openings, labels = parsed
    engine = Engine(path)
    try:
        info = engine.call("GET", "/info")
    except (OSError, ValueError) as error:
        say(f"cannot reach the engine at {engine.path}: {error}")
        return 1
    found = info.get("ID") if isinstance(info, dict) else None
    if found != expected:
        say(f"the socket at {engine.path} leads to another engine ({found}, not {expected})")
        return 1
    guard: border.Border | None = None
    if holder is not None:
        try:
            guard = border.Border(holder)
            guard.install(openings, border.resolvers(), border.neighbours())
        except border.BorderError as error:
            say(f"cannot hold the border: {error}")
            return 1
    say("ready")
    retired = False
    while sys.stdin.buffer.read(4096):
        # Anything sent: the process has a new watchdog, and this one retires.
        retired = True
    if guard is not None:
        try:
            guard.release()
        except border.BorderError as error:
            say(f"openings not released (the next watchdog deletes them): {error}")
    if retired or not labels:
        say("retired" if retired else "done")
        return 0
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
