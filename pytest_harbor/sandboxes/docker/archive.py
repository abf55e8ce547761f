"""A container's file or folder as the engine's tar stream, closable: closing it closes
the HTTP connection, so the engine stops writing the archive at once.

docker-py's `get_archive` hands out a generator over the response: closing that generator
leaves the response, and its connection, open; the engine then goes on writing the rest
of the archive into a socket nobody reads, and holds the container's next archive call
behind it until its own timeout (minutes, for a folder of 100,000 files).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

import docker
import docker.utils

from pytest_harbor.sandboxes.base import SandboxError
from pytest_harbor.sandboxes.docker.engine import TRANSPORT_ERRORS

__all__ = ["ARCHIVE_CHUNK", "ArchiveResponse", "open_archive"]

#: How much of the stream is asked for at a time.
ARCHIVE_CHUNK = 64 * 1024


class ArchiveResponse:
    """The chunks of one get-archive response (an ArchiveStream); `close()` from any
    thread shuts its socket down, which also ends a read waiting on it."""

    def __init__(self, response: Any, sock: Any, what: str) -> None:
        self._what = what
        self._response = response
        self._socket = sock
        self._chunks = response.raw.stream(ARCHIVE_CHUNK, decode_content=False)
        self._lock = threading.Lock()
        self._closed = False

    def __iter__(self) -> ArchiveResponse:
        return self

    def __next__(self) -> bytes:
        if self._closed:
            raise StopIteration
        try:
            chunk: bytes = next(self._chunks)
        except TRANSPORT_ERRORS as error:
            # A dropped connection, or one closed under the read.
            self.close()
            raise SandboxError(f"{self._what} failed: {error}") from None
        return chunk

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        raw = getattr(self._socket, "_sock", self._socket)
        with contextlib.suppress(Exception):
            raw.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(Exception):
            self._response.close()


def open_archive(
    api: docker.APIClient, container: str, path: str
) -> tuple[ArchiveResponse, dict[str, Any] | None]:
    """`path` of `container` as a tar stream, and the engine's stat of it (None when it
    sent none). Raises what docker-py raises (NotFound when the path is not there); a
    connection that drops while the stream is read raises SandboxError.

    The one place docker-py's private API is used for archives: `get_archive` without
    the generator it wraps the response in (tests/unit/test_docker_private_api.py fails
    when a name goes upstream)."""
    response = api._get(
        api._url("/containers/{0}/archive", container),
        params={"path": path},
        stream=True,
        headers={"Accept-Encoding": "identity"},
    )
    api._raise_for_status(response)
    # The engine may take a long time before the first byte of a large folder: the
    # copy's own deadline bounds the read, not the socket's timeout.
    sock = api._get_raw_response_socket(response)
    api._disable_socket_timeout(sock)
    header = response.headers.get("x-docker-container-path-stat")
    stat = docker.utils.decode_json_header(header) if header else None
    what = f"sandbox {container[:12]}: reading {path}"
    return ArchiveResponse(response, sock, what), stat
