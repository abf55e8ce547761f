"""Several Docker engines as one provider: each episode is placed on an engine with room,
and everything of that episode (its images, its sandbox) happens on that engine."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors
import requests

from pytest_harbor.display import harbor_logger
from pytest_harbor.locks import FileLock, Slots
from pytest_harbor.sandboxes.base import (
    ImageConfig,
    ImageLayer,
    ImageSource,
    Opening,
    ProviderContext,
    Sandbox,
    SandboxCapabilities,
    SandboxError,
    SandboxSpec,
    SandboxStartError,
)
from pytest_harbor.sandboxes.docker.engine import Endpoint
from pytest_harbor.sandboxes.docker.provider import DockerProvider

log = harbor_logger()

_T = TypeVar("_T")

__all__ = ["DockerFleet", "EnginePlacement", "FleetEngine"]

#: How long an engine may take to answer a ping before it counts as gone.
PING_TIMEOUT_S = 3.0
#: The API version pings and the CPU count are asked in (any engine of Docker 20.10 on).
_PING_API_VERSION = "1.41"
#: After a call failed on an engine: pings, this far apart, that must all be answered
#: for the failure to be the call's own rather than the engine's.
_STEADY_PINGS = 4
_STEADY_PAUSE_S = 0.25
#: Pause between rounds of looking for an engine with room.
_POLL_S = 0.05
#: What a call to an engine that went away raises.
_GONE = (SandboxError, docker.errors.DockerException, OSError, requests.exceptions.RequestException)


class EnginePlacement:
    """An episode's place on one engine of the fleet: a provider that makes everything of
    the episode there, holding one unit of the engine's capacity until release(). When
    the engine stops answering while the episode makes its images or starts its
    sandbox, the place moves to another engine (images follow: an engine loads what it
    lacks from the others) and the call is made again there."""

    def __init__(self, fleet: DockerFleet, engine: FleetEngine, slot: FileLock) -> None:
        self._fleet = fleet
        self.engine = engine
        self._slot: FileLock | None = slot

    @property
    def provider(self) -> EnginePlacement:
        return self

    @property
    def name(self) -> str:
        return self._fleet.name

    @property
    def capabilities(self) -> SandboxCapabilities:
        return self._fleet.capabilities

    def release(self) -> None:
        slot, self._slot = self._slot, None
        if slot is not None:
            slot.release()

    def _retry(self, call: Callable[[DockerProvider], _T]) -> _T:
        """`call` on this engine; when the engine stops answering, on the next with room."""
        while True:
            try:
                return call(self.engine.provider)
            except _GONE:
                if self._fleet.answers_steadily(self.engine):
                    raise
                self.release()
                moved = self._fleet.place()
                self.engine, self._slot = moved.engine, moved._slot

    def prepare_image(self, source: ImageSource) -> str:
        return self._retry(lambda provider: provider.prepare_image(source))

    def image_config(self, image: str) -> ImageConfig:
        return self._retry(lambda provider: provider.image_config(image))

    def prepare_layer(self, layer: ImageLayer) -> str:
        return self._retry(lambda provider: provider.prepare_layer(layer))

    def start(self, spec: SandboxSpec) -> Sandbox:
        return self._retry(lambda provider: provider.start(spec))

    def remove_labelled(self, labels: Mapping[str, str]) -> int:
        return self.engine.provider.remove_labelled(labels)

    def labelled(self, key: str) -> list[tuple[str, dict[str, str]]]:
        return self.engine.provider.labelled(key)

    def remove(self, sandbox_id: str) -> None:
        self.engine.provider.remove(sandbox_id)

    def remove_image(self, image: str) -> None:
        self.engine.provider.remove_image(image)


@dataclass
class FleetEngine:
    """One engine of the fleet: where it is, how many episodes it takes at once."""

    name: str
    provider: DockerProvider
    #: Episodes at once on this engine, across every process of the run (None: as many
    #: as the engine has CPUs).
    capacity: int | None = None
    #: Why it stopped answering, once it did: no new episode goes to it.
    down: str | None = None
    _slots: Slots | None = field(default=None, repr=False)

    @property
    def endpoint(self) -> Endpoint:
        assert self.provider.endpoint is not None
        return self.provider.endpoint


class DockerFleet:
    """The `docker` provider over the engines `sandbox_provider_options.hosts` names.

    An episode is placed (place()) before its images are made: on the engine, among
    those that answer, with the most free capacity, waiting while every one is full.
    The engine builds the images its episodes need once per content hash, or loads them
    from another engine of the fleet that has them. An engine that stops answering is
    left out from then on; the episodes running on it fail with `harbor:sandbox_lost`
    (which --harbor-resume runs again) while the others go on.
    """

    name = "docker"

    def __init__(self, engines: Sequence[FleetEngine], context: ProviderContext) -> None:
        if not engines:
            raise ValueError("a fleet needs at least one engine")
        self.engines = list(engines)
        self.context = context
        for engine in self.engines:
            engine.provider.peers = [
                other.provider for other in self.engines if other is not engine
            ]
        self.capabilities: SandboxCapabilities = self.engines[0].provider.capabilities
        self._lock = threading.Lock()

    def gpu_problem(self) -> str | None:
        """An episode may land on any engine: each must have a GPU runtime."""
        for engine in self.engines:
            problem = engine.provider.gpu_problem()
            if problem is not None:
                return problem
        return None

    # ------------------------------------------------------------------------ placing

    def place(self) -> EnginePlacement:
        """A place on the engine with the most room; waits while all are full, and fails
        when none answers."""
        while True:
            alive = self._answering(required=True)
            for engine in sorted(alive, key=self._room, reverse=True):
                slot = self._slots(engine).try_acquire()
                if slot is not None:
                    return EnginePlacement(self, engine, slot)
            time.sleep(_POLL_S)

    def _room(self, engine: FleetEngine) -> float:
        """The share of the engine's capacity free now (0 to 1)."""
        slots = self._slots(engine)
        return slots.free() / slots.count

    def _slots(self, engine: FleetEngine) -> Slots:
        with self._lock:
            if engine._slots is None:
                capacity = engine.capacity or self._cpus(engine)
                folder = self.context.scratch_dir / "engines" / engine.endpoint.key
                engine._slots = Slots(folder, capacity)
            return engine._slots

    def _cpus(self, engine: FleetEngine) -> int:
        try:
            with self._client(engine) as client:
                return max(1, int(client.info().get("NCPU") or 1))
        except _GONE as error:
            raise SandboxStartError(f"engine {engine.name}: {error}") from None

    def answers_steadily(self, engine: FleetEngine) -> bool:
        """Whether the engine still answers a little later (an engine shutting down may
        answer a ping while it no longer runs anything)."""
        for _ in range(_STEADY_PINGS):
            if not self.answers(engine):
                return False
            time.sleep(_STEADY_PAUSE_S)
        return True

    def answers(self, engine: FleetEngine) -> bool:
        """Whether the engine answers now (one that did not is never asked again)."""
        if engine.down is not None:
            return False
        marker = self._down_marker(engine)
        if marker.exists():
            # Another process of the run found it gone.
            self.mark_down(engine, marker.read_text(errors="replace").strip() or "gone")
            return False
        try:
            with self._client(engine) as client:
                client.ping()
        except Exception as error:  # any way of not answering
            self.mark_down(engine, str(error) or type(error).__name__)
            return False
        return True

    def _down_marker(self, engine: FleetEngine) -> Path:
        return self.context.scratch_dir / "engines" / f"{engine.endpoint.key}.down"

    def mark_down(self, engine: FleetEngine, why: str) -> None:
        """Leave the engine out of every later placement, in every process of the run."""
        if engine.down is not None:
            return
        engine.down = why
        log.warning(
            "Docker engine %s stopped answering (%s): no new episode goes to it", engine.name, why
        )
        marker = self._down_marker(engine)
        with contextlib.suppress(OSError):
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(why + "\n")

    @staticmethod
    def _client(engine: FleetEngine) -> Any:
        """A client of its own with a short timeout, on a new connection: an engine that
        shuts down keeps answering on connections it had, not on new ones."""
        return engine.endpoint.client(version=_PING_API_VERSION, timeout=PING_TIMEOUT_S)

    # ------------------------------------------------------------------------ images

    @property
    def _first(self) -> DockerProvider:
        """The engine unplaced work goes to (images made ahead, say): the first answering."""
        return self._answering(required=True)[0].provider

    def watch(self, labels: Mapping[str, str]) -> None:
        """A watchdog on every engine that answers; SandboxError names those where none
        could start (the others keep theirs)."""
        problems = []
        for engine in self._answering():
            try:
                engine.provider.watch(labels)
            except SandboxError as error:
                problems.append(f"{engine.name}: {error}")
        if problems:
            raise SandboxError("; ".join(problems))

    def unwatch(self) -> None:
        for engine in self.engines:
            engine.provider.unwatch()

    def open_to(self, openings: Sequence[Opening]) -> None:
        """The same openings in every engine's border."""
        for engine in self.engines:
            engine.provider.open_to(openings)

    def check_ready(self) -> None:
        """At least one engine answers, or SandboxStartError naming every one tried."""
        self._answering(required=True)

    def _answering(self, required: bool = False) -> list[FleetEngine]:
        """The engines that answer now; with `required`, none is an error."""
        alive = [engine for engine in self.engines if self.answers(engine)]
        if required and not alive:
            raise SandboxStartError(
                "no Docker engine of sandbox_provider_options.hosts answers: "
                + "; ".join(f"{engine.name}: {engine.down}" for engine in self.engines)
            )
        return alive

    def prepare_image(self, source: ImageSource) -> str:
        return self._first.prepare_image(source)

    def image_config(self, image: str) -> ImageConfig:
        return self._first.image_config(image)

    def prepare_layer(self, layer: ImageLayer) -> str:
        return self._first.prepare_layer(layer)

    def start(self, spec: SandboxSpec) -> Sandbox:
        """A sandbox on the engine with the most room, without holding capacity (an
        Episode places itself first and starts on its engine instead)."""
        return max(self._answering(required=True), key=self._room).provider.start(spec)

    # ------------------------------------------------------------------------ cleanup

    def _split(self, reference: str) -> tuple[FleetEngine | None, str]:
        key, _, rest = reference.partition("/")
        for engine in self.engines:
            if engine.endpoint.key == key:
                return engine, rest
        return None, reference

    def labelled(self, key: str) -> list[tuple[str, dict[str, str]]]:
        """Every engine's sandboxes with the label, named `<engine key>/<id>`."""
        return self._gather(lambda provider: provider.labelled(key))

    def remove(self, sandbox_id: str) -> None:
        engine, ident = self._split(sandbox_id)
        if engine is not None:
            engine.provider.remove(ident)

    def labelled_leftovers(self, key: str) -> list[tuple[str, dict[str, str]]]:
        return self._gather(lambda provider: provider.labelled_leftovers(key))

    def _gather(
        self, listing: Callable[[DockerProvider], list[tuple[str, dict[str, str]]]]
    ) -> list[tuple[str, dict[str, str]]]:
        """What `listing` gives on each answering engine, references named
        `<engine key>/<reference>` (for remove() and remove_leftover())."""
        found: list[tuple[str, dict[str, str]]] = []
        for engine in self._answering():
            with contextlib.suppress(*_GONE):
                found += [
                    (f"{engine.endpoint.key}/{reference}", labels)
                    for reference, labels in listing(engine.provider)
                ]
        return found

    def remove_leftover(self, reference: str) -> None:
        engine, rest = self._split(reference)
        if engine is not None:
            engine.provider.remove_leftover(rest)

    def remove_labelled(self, labels: Mapping[str, str]) -> int:
        removed = 0
        for engine in self._answering():
            try:
                removed += engine.provider.remove_labelled(labels)
            except _GONE as error:
                log.warning("engine %s: %s", engine.name, error)
        return removed

    def remove_image(self, image: str) -> None:
        for engine in self._answering():
            with contextlib.suppress(*_GONE):
                engine.provider.remove_image(image)
