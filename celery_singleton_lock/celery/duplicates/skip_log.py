"""The log line of a skipped duplicate: one WARNING per burst of skips of one key, not one per
call.

A hot key (a beat job sent faster than it runs, a webhook retried by its sender) can skip
thousands of calls a minute; a WARNING for each is most of a skip's cost and buries the rest
of the log. So a key's first skip is logged in full (the call, the key, the holder); the skips
of that key in the next :data:`BURST_SECONDS` are counted, not logged; the first skip after
that is logged again, saying how many were left out since the previous line. Counts are per
process (each pool child keeps its own). A key that stops skipping leaves its last count
unlogged (the metric ``celery_lock_duplicates_total`` counts every skip); keys whose burst has
ended are forgotten once :data:`MAX_KEYS` are tracked, so the table stays bounded.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

#: seconds during which the skips of one key after a logged one are counted, not logged
BURST_SECONDS = 10.0
#: keys tracked at most before the ones whose burst has ended are dropped
MAX_KEYS = 1024


class _Burst:
    __slots__ = ("left_out", "logged_at")

    def __init__(self, logged_at: float) -> None:
        self.logged_at = logged_at
        self.left_out = 0


class SkipLog:
    """Logs a skip with :meth:`skipped`, once per burst of its key (see the module)."""

    def __init__(
        self,
        logger: logging.Logger,
        burst_seconds: float = BURST_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.burst_seconds = burst_seconds
        self.clock = clock
        self._bursts: dict[str, _Burst] = {}
        self._lock = threading.Lock()  # a threads pool skips from several threads

    def skipped(self, key: str, message: str) -> None:
        """One skip of lock ``key``; ``message``: its full line."""
        now = self.clock()
        with self._lock:
            burst = self._bursts.get(key)
            if burst is not None and now - burst.logged_at < self.burst_seconds:
                burst.left_out += 1
                return
            left_out = 0 if burst is None else burst.left_out
            if burst is None and len(self._bursts) >= MAX_KEYS:
                self._forget_ended(now)
            self._bursts[key] = _Burst(now)
        if left_out:
            self.logger.warning(
                "%s (and %d more skips of this key not logged since its previous line)",
                message,
                left_out,
            )
        else:
            self.logger.warning("%s", message)

    def _forget_ended(self, now: float) -> None:
        ended = [k for k, b in self._bursts.items() if now - b.logged_at >= self.burst_seconds]
        for key in ended:
            del self._bursts[key]
        if len(self._bursts) >= MAX_KEYS:  # all in a burst: keep the table bounded anyway
            self._bursts.clear()
