"""``lockapp`` whose worker's main process, on its first send from a background thread, stops
inside that send with a kombu lock held until the test lets it go: the state a fork of a pool
child finds when it comes while the main process's reclaim (or hand-off sweep) thread sends a
parked call (issue 19).

Every ``cached_property`` of kombu (and of Celery, which uses kombu's) takes a lock at each
access, one lock per property shared by all instances; a send goes through some twenty of them,
``Celery.amqp`` five times. Here the first send from a thread other than the main process's main
thread stops in ``Celery.amqp`` with its lock held, records ``holding`` in ``hold:<queue>`` (on
the lock server) and waits until the test pushes to ``hold-go:<queue>`` (20 s at most).
Nothing else changes: children and the main thread get the property as usual.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from celery import Celery

from tests.celery.lockapp import app
from tests.celery.tasks.core import store

__all__ = ["HOLD_TIMEOUT", "app"]

#: seconds the lock is held at most if the test never lets it go
HOLD_TIMEOUT = 20

_main_pid = os.getpid()  # the worker's main process imports this module before it forks
_held = threading.Event()
_amqp: Any = Celery.__dict__["amqp"]
_get = type(_amqp).__get__


def _get_holding_once(self: Any, instance: Any, owner: Any = None) -> Any:
    if (
        self is _amqp
        and os.getpid() == _main_pid
        and threading.current_thread() is not threading.main_thread()
        and not _held.is_set()
    ):
        _held.set()
        queue = os.environ["CSL_QUEUE"]
        with self.lock:
            store().rpush(f"hold:{queue}", "holding")
            store().blpop([f"hold-go:{queue}"], timeout=HOLD_TIMEOUT)
            return _get(self, instance, owner)
    return _get(self, instance, owner)


type(_amqp).__get__ = _get_holding_once
