"""Images built ahead: once the run knows which trials it runs, a bounded pool in the
controller makes every image they need (task images, verifier images, Compose builds,
agent installs), longest first, while the episodes start. An episode whose image is still
being made waits for it in its preparation, before its clock starts (the build lock of
each content hash makes sure no image is built twice); a build that fails fails once, and
every trial of that task gets its failure."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable

from pytest_harbor.display import harbor_logger
from pytest_harbor.engine import Episode, EpisodeError
from pytest_harbor.plugin.planned import PlannedRun
from pytest_harbor.plugin.run import HarborRun
from pytest_harbor.tasks.task import Task

__all__ = ["BuildsAhead"]

log = harbor_logger()


class BuildsAhead:
    """The pool (`image_build_concurrency` threads); `start` once, `close` at the end."""

    def __init__(self, run: HarborRun, planned: PlannedRun) -> None:
        self.run = run
        #: Read for each task's expected time, to build the longest first.
        self.planned = planned
        self.size = run.settings.image_build_concurrency
        self._queue: queue.SimpleQueue[tuple[str, Task] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False
        self.started = False
        self.building = 0
        self.done = 0
        self.failed = 0

    def start(self, tasks: Iterable[tuple[str, Task]]) -> None:
        """Make the images of `tasks` (taskset, task), most expensive first."""
        if self.started or self.size == 0:
            return
        self.started = True
        unique = {(taskset, task.id): (taskset, task) for taskset, task in tasks}
        ordered = sorted(
            unique.values(),
            key=lambda pair: -self.planned.expected_s.get(f"{pair[0]}/{pair[1].id}", 0.0),
        )
        for pair in ordered:
            self._queue.put(pair)
        # Daemon threads: a run that ends (or is interrupted) does not wait for a build.
        for index in range(min(self.size, len(ordered))):
            thread = threading.Thread(
                target=self._work, name=f"harbor-build-ahead-{index}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def _work(self) -> None:
        while True:
            try:
                pair = self._queue.get_nowait()
            except queue.Empty:
                return
            if pair is None or self._closed:
                return
            self._prepare(*pair)

    def _prepare(self, taskset: str, task: Task) -> None:
        run = self.run
        # The process's watchdog, which holds the border a build's steps run under, before
        # the first build (else the build would hold it alone, and the first item again).
        run.watch()
        with self._lock:
            self.building += 1
        try:
            episode = Episode(
                task,
                taskset=taskset,
                repeat=0,
                harness=run.harness,
                provider=run.provider_for(task),
                labels=run.image_labels(),
                image_labels=run.image_labels(),
                settings=run.settings,
                model=run.model,
                redactor=run.redactor,
            )
            episode.prepare_images()
        except EpisodeError as error:
            with self._lock:
                self.failed += 1
            log.debug("building ahead for %s/%s failed: %s", taskset, task.id, error)
        except Exception as error:  # never let the pool take the run down
            with self._lock:
                self.failed += 1
            log.warning("building ahead for %s/%s: %r", taskset, task.id, error)
        finally:
            with self._lock:
                self.building -= 1
                self.done += 1

    def close(self) -> None:
        """Builds not started are dropped; those under way finish in their threads."""
        self._closed = True
