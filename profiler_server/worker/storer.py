"""The ingest worker's second stage: storing assembled groups, in order, on a thread of its
own, so that the worker assembles the next group while the database takes this one (on
PostgreSQL the worker otherwise sat idle for a third of its time, waiting for the commit).

A group that fails stops the line: it and every group handed in after it are given back
unstored, in order, for the worker to redo one by one (`returned`), since each was
assembled on the state the failed one left in memory."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

Job = TypeVar("Job")


class Storer(Generic[Job]):
    """Runs `store(job)` for each submitted job on its thread, one job waiting at most
    (the worker blocks on a second: the backpressure that bounds memory)."""

    def __init__(self, store: Callable[[Job], None], name: str = "profiler-store") -> None:
        self._store = store
        self._name = name
        self._lock = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._busy = False  # a job is being stored
        self._failed = False  # a job failed: later ones are returned, not stored
        self._returned: list[Job] = []
        self._stopping = False
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Stores what was submitted, then ends the thread."""
        if self._thread is None:
            return
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("the storage thread is still storing a group at shutdown")
        self._thread = None

    def submit(self, job: Job) -> None:
        with self._lock:
            while self._waiting:
                self._lock.wait()
            self._waiting.append(job)
            self._lock.notify_all()

    def wait_idle(self) -> None:
        """Returns once every submitted job is stored or returned."""
        with self._lock:
            while self._waiting or self._busy:
                self._lock.wait()

    def returned(self) -> list[Job]:
        """The jobs not stored since a failure (the failed one first), once the line is
        idle; the line stores again after this. Cheap when nothing failed."""
        if not self._failed:
            return []
        self.wait_idle()  # the worker, the only one to submit, is here: idle stays idle
        with self._lock:
            jobs, self._returned = self._returned, []
            self._failed = False
            return jobs

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._waiting and not self._stopping:
                    self._lock.wait()
                if not self._waiting:
                    return
                job = self._waiting.popleft()
                self._busy = True
                self._lock.notify_all()
                failed = self._failed
            if not failed:
                try:
                    self._store(job)
                except Exception:
                    log.debug("storing a group failed; the worker redoes it", exc_info=True)
                    failed = True
            with self._lock:
                if failed:
                    self._failed = True
                    self._returned.append(job)
                self._busy = False
                self._lock.notify_all()
