"""The relay's process: between every harness of a run and the model endpoint.

Started by the run (relay/control.py) with its `RelayStart` on its input, it listens on
127.0.0.1 for harnesses on this machine (and on the addresses the run's engines reach it
at, as it is asked), and on a Unix socket for the run's processes. A request must carry a
token the run granted to an episode, while that episode's agent works, and be one the
relay serves (admission.py); only then is its body read. The relay puts the real key in
the token's place, counts what the answer says it took, prices it, keeps it for a replay,
and admits no call past the run's budget (calls.py, ledger.py). It ends when its input
closes (the run ended, or died).

Every connection is the stranger's: a head must come within `IDLE_S`, a body within
`BODY_S`, and when connections near the process's file limit the longest idle are closed
first, so that no harness can hold the relay from the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pytest_harbor.relay.admission import Call, Refusal, expected_tokens, read_call, route_of
from pytest_harbor.relay.calls import Exchanges, refusal_body
from pytest_harbor.relay.cassettes import request_key
from pytest_harbor.relay.ledger import MOST_AT_ONCE, Budget, Grant, Ledger
from pytest_harbor.relay.prices import PriceTable, default_prices, load_prices
from pytest_harbor.relay.reports import RELAY_FOLDER_PREFIX, Counts, GrantRequest, RelayStart
from pytest_harbor.relay.upstream import AUTH_HEADERS, Upstream
from pytest_harbor.relay.usage import CallUsage
from pytest_harbor.relay.wire import (
    BODY_CAP,
    HEAD_CAP,
    Head,
    WireError,
    read_body,
    read_head,
    write_head,
)

__all__ = ["BUDGET_SPENT", "Relay", "main"]

#: What a refusal for the budget says it is (the `type` of its JSON error).
BUDGET_SPENT = "budget_spent"
#: How long a connection may wait between requests, and a body take to arrive.
IDLE_S = 60.0
BODY_S = 120.0
#: File descriptors kept free for the endpoint's connections and the run's questions.
_SPARE_FILES = 128
#: The longest a grant's close waits for its calls under way to end.
_CLOSE_S = 10.0
_JSON = [("content-type", "application/json")]
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class Relay:
    """One run's relay (see the module's docstring)."""

    def __init__(self, start: RelayStart, prices: PriceTable) -> None:
        self.start = start
        self.ledger = Ledger(Budget(start.max_cost_usd, start.max_tokens))
        self.upstream = Upstream(start.upstream, start.api_key)
        self.exchanges = Exchanges(start, prices, self.ledger, self.upstream)
        self.prices = prices
        self._servers: dict[str, asyncio.base_events.Server] = {}
        #: Set whenever a call under way ends: the calls waiting for room look again.
        self._ended = asyncio.Event()
        #: Open connections, oldest first, with whether each is waiting between requests.
        self._connections: dict[asyncio.StreamWriter, bool] = {}
        self.port = 0

    # ------------------------------------------------------------------ listening

    async def listen(self, address: str) -> int:
        """Serve harnesses on `address` too (on the relay's port when it is free there);
        the port it serves on."""
        if address in self._servers:
            return self._servers[address].sockets[0].getsockname()[1]  # type: ignore[no-any-return]
        for port in (self.port, 0) if self.port else (0,):
            try:
                server = await asyncio.start_server(
                    self._serve_model, address, port, limit=HEAD_CAP
                )
                break
            except OSError:
                if port == 0:
                    raise
        self._servers[address] = server
        bound: int = server.sockets[0].getsockname()[1]
        if not self.port:
            self.port = bound
        return bound

    async def serve_control(self, path: str) -> asyncio.base_events.Server:
        return await asyncio.start_unix_server(self._serve_control, path, limit=HEAD_CAP)

    def close(self) -> None:
        for server in self._servers.values():
            server.close()
        self.upstream.close()

    def _make_room(self) -> None:
        """Close the longest-idle connections while the open ones near the file limit."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        most = max(16, soft - _SPARE_FILES)
        idle = [writer for writer, waiting in self._connections.items() if waiting]
        for writer in idle[: max(0, len(self._connections) - most + 1)]:
            writer.close()
            self._connections.pop(writer, None)

    # ------------------------------------------------------------------ model calls

    async def _serve_model(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._make_room()
        self._connections[writer] = True
        try:
            while True:
                self._connections[writer] = True
                head = await asyncio.wait_for(read_head(reader, answer=False), IDLE_S)
                if head is None:
                    return
                self._connections[writer] = False
                kept = await self._answer(head, reader, writer)
                await writer.drain()
                if not kept or not head.keep_alive:
                    return
        except (WireError, ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            return
        finally:
            self._connections.pop(writer, None)
            writer.close()

    async def _answer(
        self, head: Head, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one request; False when the connection cannot carry another (a refusal
        before the body was read closes it)."""
        used, token = _token_of(head)
        grant = self.ledger.find(token)
        route = route_of(head.method, head.target)
        refusal = _before_body(head, grant, route)
        if refusal is not None or grant is None or isinstance(route, Refusal):
            refused = refusal or Refusal(401, "authentication_error", "unknown or ended token")
            return _refuse(writer, refused, close=True)
        # Under way from its head on: closing the grant ends it even while its body comes.
        task = asyncio.current_task()
        assert task is not None
        grant.tasks.add(task)
        try:
            if head.expects_continue:
                writer.write(_CONTINUE)
            body = await asyncio.wait_for(read_body(reader, head), BODY_S)
            if not grant.open or self.ledger.find(token) is not grant:
                refusal = Refusal(401, "authentication_error", "the token closed meanwhile")
                return _refuse(writer, refusal, close=True)
            kind, api = route
            call = read_call(kind, api, body, grant.request.models)
            if isinstance(call, Refusal):
                grant.note(grant.refused, call.message)
                return _refuse(writer, call, close=False)
            return await self._serve(grant, head, call, used, writer)
        finally:
            grant.tasks.discard(task)

    async def _serve(
        self, grant: Grant, head: Head, call: Call, used: str | None, writer: asyncio.StreamWriter
    ) -> bool:
        reserved = Counts()
        if call.kind == "call":
            reserved = self._expected(call)
            if not await self._admit(reserved):
                grant.refused_for_budget += 1
                reached = self.ledger.budget.reached(self.ledger.spent) or "budget spent"
                refusal = Refusal(402, BUDGET_SPENT, f"the run's budget: {reached}")
                return _refuse(writer, refusal, close=False)
        try:
            kept = self.start.record is not None or self.start.replay is not None
            key = request_key(head.method, head.target, call.body) if kept else ""
            if self.start.replay is not None:
                self.exchanges.replay(grant, head, call, key, writer)
                return True
            return await self.exchanges.forward(grant, head, call, used, key, writer)
        finally:
            if call.kind == "call":
                # At once, with no await: a second cancel cannot skip it.
                self.ledger.release(reserved)
                self._ended.set()

    def _expected(self, call: Call) -> Counts:
        """What a call is expected to take, in tokens and, priced, in dollars."""
        prompt, completion = expected_tokens(call, self.ledger.longest_completion)
        price = self.prices.price_of(call.model or "")
        usage = CallUsage(prompt_tokens=prompt, completion_tokens=completion)
        cost = 0.0 if price is None else price.cost(usage)
        return Counts(prompt_tokens=prompt, completion_tokens=completion, cost_usd=cost)

    async def _admit(self, expected: Counts) -> bool:
        """Room for one model call under the budget (reserved), waiting for calls under
        way while there is none; False once the budget is spent."""
        while True:
            admitted = self.ledger.admits(expected)
            if admitted is None:
                return False
            if admitted:
                self.ledger.reserve(expected)
                return True
            self._ended.clear()
            await self._ended.wait()

    # ------------------------------------------------------------------ the run's asks

    async def _serve_control(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            while True:
                head = await read_head(reader, answer=False)
                if head is None:
                    return
                body = await read_body(reader, head)
                status, answer = await self._control(head.method, head.target, body)
                data = json.dumps(answer).encode()
                write_head(writer, Head(status=status, headers=_JSON), length=len(data))
                writer.write(data)
                await writer.drain()
        except (WireError, ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    async def _control(self, method: str, target: str, body: bytes) -> tuple[int, Any]:
        ledger = self.ledger
        try:
            if (method, target) == ("POST", "/grants"):
                grant = ledger.grant(GrantRequest.model_validate_json(body))
                return 200, {"token": grant.token}
            if target.startswith("/grants/"):
                return await self._grant_ask(method, target.removeprefix("/grants/"))
            if (method, target) == ("GET", "/spend"):
                return 200, ledger.state().model_dump(mode="json")
            if (method, target) == ("POST", "/listen"):
                address = str(json.loads(body)["address"])
                return 200, {"port": await self.listen(address)}
        except (ValidationError, ValueError, KeyError, TypeError, OSError) as error:
            return 400, {"error": str(error)}
        return 404, {"error": f"no {method} {target}"}

    async def _grant_ask(self, method: str, path: str) -> tuple[int, Any]:
        """A grant's report (GET), opened (`/open`) or closed (`/close`: its calls under
        way ended and counted as far as they went), or ended for good (DELETE)."""
        token, _, action = path.partition("/")
        grant = self.ledger.find(token)
        if grant is None:
            return 404, {"error": "no such grant"}
        if (method, action) == ("POST", "open"):
            grant.open = True
        elif (method, action) in (("POST", "close"), ("DELETE", "")):
            grant.open = False
            await _end_calls(grant)
            if method == "DELETE":
                self.ledger.end(token)
        elif (method, action) != ("GET", ""):
            return 404, {"error": f"no {method} {action!r} of a grant"}
        return 200, grant.report().model_dump(mode="json")


async def _end_calls(grant: Grant) -> None:
    """End the calls a grant has under way (each counts what it got) and wait for them."""
    tasks = list(grant.tasks)
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=_CLOSE_S)


def _before_body(head: Head, grant: Grant | None, route: object) -> Refusal | None:
    """What refuses a request from its head alone, before its body is read."""
    if grant is None:
        return Refusal(401, "authentication_error", "unknown or ended token")
    if isinstance(route, Refusal):
        return route
    if not grant.open:
        return Refusal(401, "authentication_error", "the token's episode is not in an agent turn")
    coding = (head.get("content-encoding") or "identity").lower().strip()
    if coding != "identity":
        return Refusal(415, "invalid_request_error", "the relay reads bodies as they are sent")
    try:
        length = head.length
    except WireError:
        return Refusal(400, "invalid_request_error", "a bad Content-Length")
    if length is not None and length > BODY_CAP:
        return Refusal(413, "invalid_request_error", f"a body over {BODY_CAP} bytes")
    if len(grant.tasks) >= MOST_AT_ONCE:
        return Refusal(429, "too_many_calls", f"more than {MOST_AT_ONCE} calls at once")
    return None


def _token_of(head: Head) -> tuple[str | None, str | None]:
    """The header the harness put its token in, and the token."""
    for name in AUTH_HEADERS:
        value = head.get(name)
        if value is None:
            continue
        if name == "authorization":
            scheme, _, value = value.partition(" ")
            if scheme.lower() != "bearer":
                continue
        return name, value.strip()
    return None, None


def _refuse(writer: asyncio.StreamWriter, refusal: Refusal, *, close: bool) -> bool:
    body = refusal_body(refusal.kind, refusal.message)
    write_head(writer, Head(status=refusal.status, headers=_JSON), length=len(body), close=close)
    writer.write(body)
    return not close


# ---------------------------------------------------------------------- the process


def _die_with_parent() -> None:
    """Linux: end this process when the one that started it ends (its input closing says
    so too; this covers a parent killed while the pipe is held by another)."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


def _more_files() -> None:
    """The soft limit on open files raised to the hard one: connections are files."""
    with contextlib.suppress(ValueError, OSError):
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def _run(start: RelayStart, prices: PriceTable, say: Callable[[str], None]) -> None:
    relay = Relay(start, prices)
    port = await relay.listen("127.0.0.1")
    control = await relay.serve_control(start.control_socket)
    os.chmod(start.control_socket, 0o600)
    loop = asyncio.get_running_loop()
    ended = asyncio.Event()
    # Before the port is said: the run may be killed the moment it has it.
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, ended.set)
    say(json.dumps({"port": port}))
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    waiting = asyncio.ensure_future(reader.read())
    stopping = asyncio.ensure_future(ended.wait())
    await asyncio.wait([waiting, stopping], return_when=asyncio.FIRST_COMPLETED)
    control.close()
    relay.close()
    _remove_socket(Path(start.control_socket))


def _remove_socket(socket: Path) -> None:
    """The control socket goes as the relay ends (its run may be gone, killed), and the
    folder the run made for it (RELAY_FOLDER_PREFIX) with it, when nothing else is there."""
    with contextlib.suppress(OSError):
        socket.unlink()
    if socket.parent.name.startswith(RELAY_FOLDER_PREFIX):
        with contextlib.suppress(OSError):
            socket.parent.rmdir()


def main() -> None:
    """`python -m pytest_harbor.relay.server`: one line of `RelayStart` JSON on the input,
    then `{"port": N}` on the output once it serves; it ends when its input closes."""
    _die_with_parent()
    _more_files()
    line = sys.stdin.buffer.readline()
    try:
        start = RelayStart.model_validate_json(line)
        prices = default_prices() if start.prices is None else load_prices(Path(start.prices))
    except (ValidationError, ValueError) as error:
        print(json.dumps({"error": str(error)}), flush=True)
        sys.exit(2)

    def say(text: str) -> None:
        print(text, flush=True)

    asyncio.run(_run(start, prices, say))


if __name__ == "__main__":
    main()
