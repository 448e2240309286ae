"""A daemon thread of the worker's main process that does one job every few seconds.

The main process renews its pool children's locks (:mod:`.child_renewal`) and hands on locks left
by dead holders (:mod:`.handoff_sweeper`) this way. A tick that fails is logged and the next one
comes: a dead thread would leave that job undone for the worker's whole life.
"""

from __future__ import annotations

import logging
import threading
from typing import Optional

from celery_singleton_lock.errors import LockError

log = logging.getLogger("celery_singleton_lock.worker")


class Ticking:
    """Calls :meth:`tick` at once, then every ``interval`` seconds, from a daemon thread,
    until :meth:`stop`.

    Args:
        interval: seconds between ticks.
    """

    #: name of the thread
    thread_name = "celery-singleton-lock"
    #: what a tick does, for the log line of one that failed
    job = "a periodic job"

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        #: ticks run, for tests and logs
        self.ticks = 0

    def tick(self) -> object:
        raise NotImplementedError

    def pause(self) -> float:
        """Seconds to wait after a tick before the next (the interval)."""
        return self.interval

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except LockError as exc:
                log.warning("%s failed (%s); trying again", self.job, exc)
            except Exception:
                log.exception("%s failed; trying again", self.job)
            self._stop.wait(self.pause())
