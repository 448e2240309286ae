"""Tasks of ``on_duplicate="queue"``: duplicates parked behind the holder, run in order
(tests/celery/test_queue_policy.py, test_queue_processes.py, test_queue_hardening.py)."""

from __future__ import annotations

import enum
import os

from celery_singleton_lock import LockedTask
from tests.celery.tasks.core import GATE_TIMEOUT, app, body, gated_body, inside, keyed_task, store

#: The policy of the queue tasks below: "retry" for the streams of tests/celery/test_cluster.py
#: and test_cluster_pause.py (ClusterServers' default), "queue" everywhere else, a Redis
#: Cluster's tests/celery/test_cluster_queue.py included.
QUEUE = os.environ.get("CSL_QUEUE_POLICY", "queue")

hold_queue = keyed_task(__name__, "hold_queue", on_duplicate=QUEUE, lock_ttl=5)


@app.task(bind=True, base=LockedTask, lock_on=("key",), on_duplicate=QUEUE, lock_ttl=5)
def gated_queue(self: LockedTask, key: str) -> str:
    """Policy queue; the body waits at ``gate:<key>`` (see ``core.gated_body``)."""
    return gated_body(key, self.request.id)


@app.task(bind=True, base=LockedTask, lock_on=("key",), on_duplicate=QUEUE, lock_ttl=5)
def queued_in_order(self: LockedTask, key: str, index: int, seconds: float = 0.0) -> int:
    """Records ``index`` in ``order:<key>`` as its body starts (policy queue)."""
    store().rpush(f"order:{key}", index)
    body(key, seconds, self.request.id)
    return index


@app.task(bind=True, base=LockedTask, lock_on=("key",), on_duplicate=QUEUE, lock_ttl=5)
def gated_in_order(self: LockedTask, key: str, index: int) -> int:
    """``queued_in_order`` whose body waits at ``gate:<key>`` (as ``core.gated_body``): the
    test decides how long each call holds the lock, not a sleep that must outlast the rest."""
    store().rpush(f"order:{key}", index)
    with inside(key, self.request.id):
        # waits of 1 s each: one of GATE_TIMEOUT would outlast the client's socket timeout
        for _ in range(GATE_TIMEOUT):
            if store().blpop([f"gate:{key}"], timeout=1):
                break
    return index


@app.task(
    bind=True, base=LockedTask, lock_on=("key",), on_duplicate=QUEUE, lock_ttl=5, acks_late=True
)
def queued_acks_late(self: LockedTask, key: str, index: int, seconds: float = 0.0) -> int:
    """``queued_in_order``, acknowledged after the run (a redelivery repeats the message)."""
    store().rpush(f"order:{key}", index)
    body(key, seconds, self.request.id)
    return index


@app.task(bind=True, base=LockedTask, lock_on=("key",), on_duplicate=QUEUE, lock_ttl=5)
def queued_retries_once(self: LockedTask, key: str, index: int, seconds: float = 0.0) -> int:
    """``queued_in_order`` whose first attempt ends with ``self.retry(countdown=0.2)``."""
    store().rpush(f"order:{key}", index)
    body(key, seconds, self.request.id)
    if not self.request.retries:
        raise self.retry(countdown=0.2, max_retries=1)
    return index


class Colour(enum.Enum):
    """An argument JSON cannot hold (the lock name's key builder accepts it)."""

    RED = "red"


@app.task(bind=True, base=LockedTask, lock_on=("key",), on_duplicate=QUEUE, lock_ttl=5)
def queued_colour(self: LockedTask, key: str, colour: Colour) -> str:
    """Policy queue, with an argument only pickle can carry; returns the colour's name."""
    store().rpush(f"order:{key}", colour.name)
    return colour.name
