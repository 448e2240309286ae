"""A pool child forked while the worker's main process sends a parked call from a background
thread runs its calls to the end (issue 19, part 1).

After a ``kill -9`` of a pool child, the main process reclaims the dead child's lock and hands it
on from a thread (``worker.reclaim_dead_holder``), while its main thread forks the replacement
child. Seen in a soak: the replacement ran a body, then hung for ever handing its own lock on
(``py-spy dump``: ``cached_property.__get__`` of ``Celery.amqp``, ``kombu/utils/objects.py``), its
call never completed and the pool slot was gone. The lock was held by the main process's
reclaim thread at the fork, mid-send, and is held for ever in the child. ``forkraceapp`` widens
that window from microseconds to as long as the test needs.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Iterator

import pytest
import redis

from celery_singleton_lock.testing import RedisServer
from tests.celery.tasks import queueing
from tests.celery.workers import CeleryWorkerProcess, Servers, lock_key, unique, worker_group
from tests.support import wait_until

#: seconds the test gives the main process to fork the replacements while the send is held
#: (it does at once without the fix; with it, the fork waits for the send: not asserted)
FORK_WAIT = 3.0


@pytest.fixture
def worker(broker_server: RedisServer, lock_server: RedisServer) -> Iterator[CeleryWorkerProcess]:
    servers = Servers(
        broker_url=broker_server.url,
        lock=lock_server,
        app="tests.celery.forkraceapp",
    )
    with worker_group(servers) as group:
        (started,) = group.start(1, pool="prefork", concurrency=2)
        yield started


def _park_behind_a_holder(worker: CeleryWorkerProcess, store: redis.Redis, key: str) -> list[Any]:
    queueing.queued_in_order.apply_async((key, 0, 30), queue=worker.queue)
    wait_until(lambda: store.llen(f"order:{key}") == 1, timeout=20)
    parked = lock_key(queueing.queued_in_order, key, 0) + ":parked"
    duplicates = []
    for index in (1, 2, 3):  # one by one: their arrival order is their index order
        duplicates.append(queueing.queued_in_order.apply_async((key, index), queue=worker.queue))
        wait_until(lambda index=index: store.zcard(parked) == index, timeout=20)
    return duplicates


def test_a_child_forked_while_the_main_process_hands_a_lock_on_completes_its_calls(
    worker: CeleryWorkerProcess, store: redis.Redis, celery_app: Any
) -> None:
    key = unique("k")
    duplicates = _park_behind_a_holder(worker, store, key)
    holder_pid = int(store.lindex(f"runs:{key}", 0).split(b"|")[1])
    os.kill(holder_pid, signal.SIGKILL)  # the main process reclaims the lock, sends call 1
    store.delete(f"gauge:{key}")  # the killed body never left it
    wait_until(lambda: store.llen(f"hold:{worker.queue}") == 1, timeout=20)
    # mid-send: every pool child is replaced now, each replacement forked while it lasts
    before = set(worker.children())
    for pid in before:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + FORK_WAIT
    while time.monotonic() < deadline and not set(worker.children()) - before:
        time.sleep(0.05)
    store.rpush(f"hold-go:{worker.queue}", "go")
    # each parked call, run on a replacement, hands the lock to the next one as it ends
    assert [d.get(timeout=30) for d in duplicates] == [1, 2, 3]
    assert [int(i) for i in store.lrange(f"order:{key}", 0, -1)] == [0, 1, 2, 3]
    assert int(store.get(f"overlaps:{key}") or 0) == 0
