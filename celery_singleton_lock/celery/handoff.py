"""Policy ``queue``: duplicates parked in Redis, handed the lock one by one in arrival order.

A duplicate that finds its lock held parks its own message behind the lock, in the same round
trip as its acquire (the engine's ``ACQUIRE_OR_PARK``), and ends at once: it holds no worker
slot and polls nothing, and its state stays what it was (PENDING). The holder's release
reserves the lock for the oldest parked task id and returns that message, which the releasing
worker sends again under the same task id (:func:`publish`); its acquire takes the reservation
over. So the next duplicate starts as soon as the broker delivers it, and no newer call can
overtake an older one.

Nothing depends on that one send. If the holder dies (``kill -9``, a lost node) its lock
expires; if the releasing worker dies before sending, the reservation expires
(``singleton_lock_handoff_timeout``). Either way a :class:`HandOffSweeper`, a thread in every
worker's main process, finds the lock due (one round trip per tick, ``HANDOFF_DUE``), reserves
it for the oldest parked task id again and sends its message. A message sent twice that way
runs once: a copy finding its own task id holding the lock ends without running, and a copy
arriving after it finished finds its finish record (``lock_finished_ttl``).

The parked message is the one a lock retry would send (``Task.signature_from_request``),
serialized with the task's serializer; chord, group, chain and link options travel with it.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Optional

from kombu.exceptions import KombuError
from kombu.serialization import dumps, loads, prepare_accept_content

from ..errors import LockError
from . import celery_api
from .lock_server import locker_for
from .options import handoff_settings

log = logging.getLogger("celery_singleton_lock.handoff")

#: Lock names a sweeper looks at per round trip.
SWEEP_BATCH = 100


def parked_message(task: Any, request: Any) -> bytes:
    """The message of ``request`` to park: what a hand-off sends again, under its task id."""
    headers = dict(getattr(request, "headers", None) or {})
    message = celery_api.message_of(task, request, headers=headers)
    content_type, encoding, payload = dumps(message, serializer=task.serializer)  # type: ignore[no-untyped-call]
    body: bytes = payload.encode(encoding) if isinstance(payload, str) else payload
    return f"{content_type}\n{encoding}\n".encode() + body


def publish(app: Any, message: bytes, key: str) -> bool:
    """Send a parked ``message`` the lock ``key`` was just reserved for; False if it could
    not be sent (logged: the reservation runs out and a sweeper sends it again)."""
    try:
        content_type, encoding, body = message.split(b"\n", 2)
        signature = loads(  # type: ignore[no-untyped-call]
            body,
            content_type.decode(),
            encoding.decode(),
            # what the workers accept from the broker, no more
            accept=prepare_accept_content(app.conf.accept_content),  # type: ignore[no-untyped-call]
        )
        celery_api.send_message(app, signature)
    except (KombuError, OSError, ValueError) as exc:
        log.error(
            "could not send the message parked behind lock %s (%s: %s); it is sent again when "
            "its reservation runs out",
            key,
            type(exc).__name__,
            exc,
        )
        return False
    log.debug("lock %s handed off: parked message sent", key)
    return True


class HandOffSweeper:
    """Hands on the locks whose holder died or whose reservation ran out (see module doc).

    Args:
        app: the Celery app whose lock server is swept.
        interval: seconds between ticks.
        reservation_ttl: seconds a reservation made by the sweeper lives.
    """

    def __init__(self, app: Any, interval: float, reservation_ttl: float) -> None:
        self.app = app
        self.interval = interval
        self.reservation_ttl = reservation_ttl
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        #: ticks run and messages sent, for tests and logs
        self.ticks = 0
        self.sent = 0

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name="celery-singleton-lock-handoff", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.tick()
            except LockError as exc:
                log.warning("hand-off sweep failed (%s); trying again", exc)
            except Exception:  # a dead thread would leave parked messages to other workers
                log.exception("hand-off sweep failed; trying again")

    def tick(self) -> int:
        """Hand on every due lock that is free; how many parked messages were sent."""
        self.ticks += 1
        locker = locker_for(self.app)
        sent = 0
        for name in locker.hand_off_due(SWEEP_BATCH):
            message = locker.hand_off_if_free(name, reservation_ttl=self.reservation_ttl)
            if message is None:
                continue
            key = locker.keys(name).lock
            log.info("lock %s was left by a holder that did not hand it on; handing it on", key)
            sent += publish(self.app, message, key)
        self.sent += sent
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
