"""Our Celery events: what a lock decision tells ``celery events``, Flower and other monitors.

Sent only where the worker sends its own task events (``worker_send_task_events``, ``-E``, or
turned on at run time by ``celery control enable_events``, which Flower sends): each costs a
broker publish, which a worker with events off must not pay for every skip.

Our own events are not ``task-...`` events: ``celery.events.state.State`` (Flower's state)
turns an unknown ``task-<x>`` event into a custom task state ``<X>`` that sticks, so a parked
call showed ``LOCK-DUPLICATE`` while its body later ran. As ``lock-...`` events they are
counted and shown by ``celery events --dump``, and leave a task's state to Celery's own
events. A call that ends without running (a skipped or superseded call, stored REVOKED) also
gets the ``task-revoked`` the worker sends for a revoked request, so monitors show it REVOKED
rather than STARTED for ever.
"""

from __future__ import annotations

import ctypes
import logging
from multiprocessing.sharedctypes import RawValue
from typing import Any, Optional

from kombu.exceptions import KombuError
from redis.exceptions import RedisError

log = logging.getLogger("celery_singleton_lock.worker")

#: a call found its lock held (fields ``key``, ``holder``, ``action``, ``reason``)
DUPLICATE = "lock-duplicate"
#: a waiting call was displaced by a newer one (``replace``): ``key``, ``by``
SUPERSEDED = "lock-superseded"
#: a running call lost its lock: ``key``
LOST = "lock-lost"
#: a release found the lock expired or taken over: ``key``
RELEASED_LATE = "lock-released-late"

#: Events are best effort: a monitor's feed must never fail or stall a task.
EVENT_ERRORS: tuple[type[BaseException], ...] = (OSError, KombuError, RedisError)


class TaskEventsSwitch:
    """Whether this worker sends task events now, shared by its main process and its pool
    children: one byte of shared memory made in the main process before the pool forks
    (:meth:`start`), written there as the worker's setting changes (:meth:`set`), read by
    every process. Outside a worker (never started) events are sent."""

    def __init__(self) -> None:
        self._on: Optional[Any] = None

    def start(self, on: bool) -> None:
        """In the worker's main process, before the pool forks: the worker's setting."""
        if self._on is None:
            self._on = RawValue(ctypes.c_bool, on)
        else:
            self._on.value = on

    def set(self, on: bool) -> None:
        """The setting now (events turned on or off at run time)."""
        if self._on is not None and bool(self._on.value) != on:
            log.info("lock events %s, as the worker's task events", "on" if on else "off")
            self._on.value = on

    @property
    def on(self) -> bool:
        return True if self._on is None else bool(self._on.value)


#: the switch of this process (and of the pool children it forks)
TASK_EVENTS = TaskEventsSwitch()


def send_event(task: Any, type_: str, *, task_id: str, hostname: str, **fields: Any) -> None:
    """Send a Celery event as ``Task.send_event`` does, from any thread, when this worker
    sends task events: ``celery events`` and Flower show it. Not sent in eager mode.

    Every event carries ``name`` (the task name) besides the dispatcher's ``hostname``: a
    monitor that never saw the task's ``task-received`` (Flower's ``flower_events_total``,
    celery-exporter) can still label it."""
    if not TASK_EVENTS.on or task.app.conf.task_always_eager or task.request.is_eager:
        return
    try:
        with task.app.events.default_dispatcher(hostname=hostname) as dispatcher:
            dispatcher.send(type_, uuid=task_id, retry=False, name=task.name, **fields)
    except EVENT_ERRORS as exc:
        log.debug("event %s of task %s not sent: %s", type_, task_id, exc)


def announce_revoked(task: Any, *, task_id: str, hostname: str, reason: str) -> None:
    """Send ``task-revoked`` for a call that ends without running and is stored REVOKED (a
    skipped or superseded call), as the worker sends it for a revoked request
    (celery/worker/request.py, ``_announce_revoked``): monitors then show the call REVOKED
    instead of leaving it STARTED. ``reason`` is an extra field."""
    send_event(
        task,
        "task-revoked",
        task_id=task_id,
        hostname=hostname,
        terminated=False,
        signum=None,
        expired=False,
        reason=reason,
    )
