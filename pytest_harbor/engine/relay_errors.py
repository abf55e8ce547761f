"""While an agent in the sandbox works, the endpoint's failed answers the relay passed on
to it, told as they happen (the agent retries on its own, so nothing else would show them
before its turn ends)."""

from __future__ import annotations

import threading

from pytest_harbor.agent_outcomes import ENDPOINT_ERROR, EndpointError
from pytest_harbor.display import harbor_logger
from pytest_harbor.relay import RelayClient, RelayError

__all__ = ["RelayErrorWatch"]

log = harbor_logger()

#: How often the relay's books are read while the agent works.
EVERY_S = 2.0


class RelayErrorWatch:
    """Reads one grant's books every EVERY_S from start() to stop(), and logs each new
    failed answer as an EndpointError (the run shows it on the terminal)."""

    def __init__(self, relay: RelayClient, token: str, episode: str, *, told: int = 0) -> None:
        self.relay = relay
        self.token = token
        self.episode = episode
        #: The failed answers told already (of the grant's, in order).
        self.told = told
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"relay-errors-{self.episode}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """No further reading; the failed answers not yet told are told now."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=EVERY_S * 2)
            self._thread = None
        self.poll()

    def _run(self) -> None:
        while not self._stop.wait(EVERY_S):
            self.poll()

    def poll(self) -> None:
        try:
            errors = self.relay.report(self.token).errors
        except RelayError:
            return  # the turn's own end reads the books, and says what went wrong
        for status, words in errors[self.told :]:
            error = EndpointError(
                scope="relay",
                status=status,
                message=words,
                attempt=1,
                attempts=1,
                episode=self.episode,
            )
            log.warning("%s", error.line(self.episode), extra={ENDPOINT_ERROR: error})
        self.told = max(self.told, len(errors))
