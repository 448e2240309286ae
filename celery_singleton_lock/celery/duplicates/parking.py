"""Policy ``queue``: duplicates parked in Redis, handed the lock one by one in arrival order.

A duplicate that finds its lock held parks its own message behind the lock, in the same round
trip as its acquire (the engine's ``ACQUIRE_SLOT_OR_PARK``), and ends at once: it holds no worker
slot and polls nothing, and its state stays what it was (PENDING). The holder's release
reserves the lock for the oldest parked task id and returns that message, which the releasing
worker sends again under the same task id (:func:`publish`); its acquire takes the reservation
over. So the next duplicate starts as soon as the broker delivers it, and no newer call can
overtake an older one.

Nothing depends on that one send. If the holder dies (``kill -9``, a lost node) its lock
expires; if the releasing worker dies before sending, the reservation expires
(a reservation lives only a short send window until its message is published, then
``singleton_lock_handoff_timeout``). Either way the hand-off sweeper, a thread in every
worker's main process (:mod:`~celery_singleton_lock.celery.worker.handoff_sweeper`), finds the
lock due (one round trip per tick, ``HANDOFF_DUE``), reserves it for the oldest parked task id
again and sends its message. A message sent twice that way
runs once: a copy finding its own task id holding the lock ends without running, and a copy
arriving after it finished finds its finish record (``lock_finished_ttl``).

A parked call that will never take its lock is dropped and the lock handed on at once: one
the worker discards when it is handed the lock (revoked, or its ``expires`` passed while it
was parked: the worker's ``task_revoked`` calls :func:`drop`), and one whose parked message
cannot be read (:func:`publish` logs an ERROR naming its task id). Otherwise the lock would
stay reserved for it, and be reserved for it again by the sweeper, for ever.

The parked message is the one a lock retry would send (``Task.signature_from_request``);
chord, group, chain and link options travel with it. Its ``eta``/``countdown`` does not (a
handed-off call runs now); its ``expires`` does. It is stored as JSON (kombu's, which also
keeps datetimes, decimals, UUIDs and bytes) whatever the task's serializer: nothing this
package reads from Redis is ever unpickled. A call whose arguments JSON cannot hold is not
parked: it takes a lock retry instead, with a WARNING naming the task.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from kombu.exceptions import KombuError
from kombu.utils import json

from celery_singleton_lock.celery import celery_api
from celery_singleton_lock.celery.config.app_settings import SEND_WINDOW, handoff_settings
from celery_singleton_lock.celery.config.lockers import locker_for
from celery_singleton_lock.engine import no_fork, required
from celery_singleton_lock.errors import LockError

log = logging.getLogger("celery_singleton_lock.handoff")

#: Lock names a sweeper looks at per round trip.
SWEEP_BATCH = 100


#: Parked calls one hand-off may drop in a row because their message cannot be read, before
#: it leaves the rest to the sweeper (a bound, not an expected number).
MAX_DROPS = 100

#: What reading or sending a parked message raises when it never will succeed (a damaged
#: body, arguments the task's own serializer refuses): the call is dropped, not re-sent.
UNREADABLE = (ValueError, TypeError, UnicodeDecodeError)


def parked_message(task: Any, request: Any) -> Optional[bytes]:
    """The message of ``request`` to park: what a hand-off sends again, under its task id;
    None (logged) when its arguments cannot be stored as JSON.

    Stored as ``<task id>\n<JSON>``: the task id is readable even when the rest is not, so
    that an unreadable call can be named and dropped.
    """
    headers = dict(getattr(request, "headers", None) or {})
    message = celery_api.message_of(task, request, headers=headers)
    try:
        body = json.dumps(message)  # type: ignore[no-untyped-call]
    except (TypeError, ValueError) as exc:
        log.warning(
            "task %s[%s]: cannot park this call (on_duplicate='queue' stores its message as "
            "JSON: %s); it takes a lock retry instead if the lock is held",
            task.name,
            request.id,
            exc,
        )
        return None
    return f"{request.id}\n{body}".encode()


def _task_id_of(message: bytes) -> str:
    return message.split(b"\n", 1)[0].decode("utf-8", "replace")


def _decoded(message: bytes) -> Any:
    return json.loads(message.split(b"\n", 1)[1].decode("utf-8"))  # type: ignore[no-untyped-call]


def publish(app: Any, message: bytes, name: str) -> bool:
    """Send a parked ``message`` the lock ``name`` was just reserved for; False if nothing
    could be sent.

    A message that cannot be read (or encoded again) never will be: its call is dropped
    from the parked ones with an ERROR naming its task id, and the lock is handed to the
    next parked call at once (:func:`drop`). A broker that cannot be reached is logged: the
    reservation runs out and a sweeper sends the same message again.
    """
    locker = locker_for(app)
    key = locker.keys(name).lock
    for _ in range(MAX_DROPS):
        task_id = _task_id_of(message)
        try:
            # The worker's main process sends from its reclaim and sweeper threads while its
            # main thread forks pool children: a child forked mid-send would keep the locks
            # kombu and Celery take on the way (one per cached property) held for ever.
            with no_fork:
                celery_api.send_message(app, _decoded(message))
        except UNREADABLE as exc:
            log.error(
                "task %s parked behind lock %s DROPPED: its parked message cannot be read or "
                "sent (%s: %s); the lock goes to the next parked call",
                task_id,
                key,
                type(exc).__name__,
                exc,
            )
            following = _drop_quietly(app, name, task_id)
            if following is None:
                return False
            message = following
            continue
        except (KombuError, OSError) as exc:
            log.error(
                "could not send the message of task %s parked behind lock %s (%s: %s); it is "
                "sent again when its reservation runs out",
                task_id,
                key,
                type(exc).__name__,
                exc,
            )
            return False
        log.debug("lock %s handed off to task %s: parked message sent", key, task_id)
        _sent(app, name, task_id)
        return True
    return False


def _sent(app: Any, name: str, task_id: str) -> None:
    """The message of ``task_id`` is on its way: its reservation of lock ``name`` lives the
    whole ``singleton_lock_handoff_timeout`` now. Never raises: a reservation left short runs
    out after the send window and a sweeper sends the message again (a copy its finish
    record drops)."""
    _, handoff_timeout = handoff_settings(app.conf)
    locker = locker_for(app)
    try:
        required(locker.queue, locker, "on_duplicate='queue'", "parking").handed(
            name, task_id, reservation_ttl=handoff_timeout
        )
    except LockError as exc:
        log.warning(
            "lock %s: the message of task %s was sent, but its reservation could not be "
            "made to last (%s); a sweeper sends it again within %.0fs",
            locker.keys(name).lock,
            task_id,
            exc,
            SEND_WINDOW,
        )


def _drop_quietly(app: Any, name: str, task_id: str) -> Optional[bytes]:
    """Drop ``task_id`` from the calls parked behind ``name``; the next call's message if the
    lock was reserved for it and is now reserved for that one. Never raises."""
    reservation_ttl = min(SEND_WINDOW, handoff_settings(app.conf)[1])
    try:
        locker = locker_for(app)
        queue = required(locker.queue, locker, "on_duplicate='queue'", "parking")
        following = queue.drop_parked(name, task_id, reservation_ttl=reservation_ttl)
    except LockError as exc:
        log.error(
            "task %s: could not take it out of the calls parked behind lock %s (%s); its "
            "reservation runs out by itself",
            task_id,
            name,
            exc,
        )
        return None
    return following if isinstance(following, bytes) else None


def drop(app: Any, name: str, task_id: str) -> bool:
    """A parked call the worker discarded without running it (revoked, expired): take it
    out of the parked ones and, if the lock was reserved for it, hand the lock to the next
    parked call now rather than when the reservation runs out. True if a message was sent.
    Never raises."""
    following = _drop_quietly(app, name, task_id)
    return following is not None and publish(app, following, name)
