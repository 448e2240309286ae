"""The hand-off sweeper of policy ``queue``: a thread of the worker's main process that
hands on locks whose holder's TTL (or reservation) ran out with calls parked behind them, and
marks superseded the calls of policy ``replace`` displaced by a worker that died before it
marked them.

It is what makes a parked call survive the death of the worker that held the lock: any
worker's sweeper finds the lock due in the hand-off index and publishes the next call."""

from __future__ import annotations

import logging
from typing import Any, Optional

from celery_singleton_lock.celery.config.app_settings import SEND_WINDOW, handoff_settings
from celery_singleton_lock.celery.config.lockers import locker_for
from celery_singleton_lock.celery.duplicates import latest
from celery_singleton_lock.celery.duplicates.parking import SWEEP_BATCH, publish
from celery_singleton_lock.celery.worker.ticking import Ticking

log = logging.getLogger("celery_singleton_lock.handoff")


class HandOffSweeper(Ticking):
    """Hands on the locks whose holder died or whose reservation ran out (see module doc).

    Args:
        app: the Celery app whose lock server is swept.
        interval: seconds between ticks.
        reservation_ttl: seconds a reservation made by the sweeper lives.
    """

    thread_name = "celery-singleton-lock-handoff"
    job = "hand-off sweep"

    def __init__(self, app: Any, interval: float, reservation_ttl: float) -> None:
        super().__init__(interval)
        self.app = app
        self.reservation_ttl = reservation_ttl
        self.send_window = min(SEND_WINDOW, reservation_ttl)
        #: seconds until the next lock falls due in the hand-off index (None: none is)
        self.next_due_in: Optional[float] = None
        #: parked messages sent, for tests and logs
        self.sent = 0
        #: displaced calls marked superseded here (their worker died first), for tests and logs
        self.superseded = 0

    def pause(self) -> float:
        """Until the next lock falls due (a debounce's or a cooldown's end, a reservation that
        runs out), within the interval: a deadline is met when it comes, not at the next
        tick after it."""
        if self.next_due_in is None:
            return self.interval
        return min(self.interval, self.next_due_in)

    def tick(self) -> int:
        """Hand on every due lock that is free; how many parked messages were sent."""
        self.ticks += 1
        locker = locker_for(self.app)
        queue = locker.queue
        if queue is None:  # a backend that parks nothing: no sweeper is started for it
            return 0
        sent = 0
        due = queue.hand_off_due(SWEEP_BATCH)
        self.next_due_in = due.next_in
        for name in due.names:
            # one message for the mutex; one per free slot of a lock_limit, as the rate allows
            messages = queue.hand_on(name, reservation_ttl=self.send_window)
            if not messages:
                continue
            log.info(
                "lock %s is free with a call due behind it (its holder did not hand it on, "
                "its cooldown ended, its rate allows a start, or a debounced call's time "
                "came); handing it on",
                locker.keys(name).lock,
            )
            sent += sum(publish(self.app, message, name) for message in messages)
        self.sent += sent
        # calls displaced by a newer one whose worker died before marking them superseded
        self.superseded += latest.mark_left(self.app, locker, look_again_in=self.interval * 10)
        return sent


_sweepers: dict[int, HandOffSweeper] = {}


def start_sweeper(app: Any) -> Optional[HandOffSweeper]:
    """Start the sweeper of ``app`` in this process (the worker's main process), once."""
    if id(app) in _sweepers:
        return _sweepers[id(app)]
    interval, reservation_ttl = handoff_settings(app.conf)
    sweeper = _sweepers[id(app)] = HandOffSweeper(app, interval, reservation_ttl)
    sweeper.start()
    log.info("handing on locks left by dead holders: a sweep every %.2fs", interval)
    return sweeper


def stop_sweepers() -> None:
    while _sweepers:
        _, sweeper = _sweepers.popitem()
        sweeper.stop()
