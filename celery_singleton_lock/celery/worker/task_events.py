"""The worker's task events, followed by its main process for our own events.

Our events (:mod:`..observe.events`) are sent only while the worker sends its task events.
The setting read at start (``worker_send_task_events``, ``-E``) can change while the worker
runs: ``celery control enable_events`` / ``disable_events``, which Flower sends every few
seconds while it watches. Those reach the main process's consumer only, so a daemon thread
there reads the consumer's event dispatcher each second and writes what it finds into the
shared switch the pool children read.
"""

from __future__ import annotations

from typing import Any, Optional

from celery_singleton_lock.celery import celery_api
from celery_singleton_lock.celery.observe.events import TASK_EVENTS
from celery_singleton_lock.celery.worker.ticking import Ticking

#: seconds between two reads of the dispatcher: how long a change of the setting takes to
#: reach our events
INTERVAL = 1.0


class TaskEventsFollower(Ticking):
    """Copies the consumer's task-events setting into :data:`TASK_EVENTS` every tick."""

    thread_name = "celery-singleton-lock-events"
    job = "following the worker's task events"

    def __init__(self, consumer: Any, interval: float = INTERVAL) -> None:
        super().__init__(interval)
        self.consumer = consumer

    def tick(self) -> None:
        TASK_EVENTS.set(celery_api.sends_task_events(self.consumer))
        self.ticks += 1


_follower: Optional[TaskEventsFollower] = None


def start_following(worker_init_sender: Any) -> None:
    """At ``worker_init`` (main process, before the pool forks): the switch, set to the
    worker's setting at start."""
    TASK_EVENTS.start(celery_api.task_events_at_start(worker_init_sender))


def follow(consumer: Any) -> None:
    """At ``worker_ready`` (main process): follow the consumer's setting from now on."""
    global _follower
    if _follower is None:
        _follower = TaskEventsFollower(consumer)
        _follower.start()


def stop_following() -> None:
    global _follower
    if _follower is not None:
        _follower.stop()
        _follower = None
