"""Mutual exclusion under real contention: processes x threads on one key."""

from __future__ import annotations

import multiprocessing
import random
import threading
import time

from celery_singleton_lock.engine import Lease, RedisLocker, Renewer
from celery_singleton_lock.testing import RedisServer

PROCESSES = 4
THREADS = 4
ACQUISITIONS = 250


def _hammer(port: int, failures: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    import redis

    client = redis.Redis(host="127.0.0.1", port=port)
    locker = RedisLocker(client, prefix="mx", renewer=Renewer())

    def worker() -> None:
        done = 0
        deadline = time.monotonic() + 120
        while done < ACQUISITIONS and time.monotonic() < deadline:
            lease = locker.try_acquire("counter", ttl=10)
            if not isinstance(lease, Lease):
                time.sleep(random.uniform(0, 0.002))
                continue
            try:
                inside = client.incr("inside")
                if inside != 1:
                    failures.put(f"{inside} holders inside the lock")
                value = int(client.get("counter") or 0)
                client.set("counter", value + 1)
                client.decr("inside")
            finally:
                lease.release()
            done += 1

    threads = [threading.Thread(target=worker) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_read_modify_write_under_the_lock_is_exact(redis_server: RedisServer) -> None:
    context = multiprocessing.get_context("fork")
    failures: multiprocessing.Queue = context.Queue()  # type: ignore[type-arg]
    processes = [
        context.Process(target=_hammer, args=(redis_server.port, failures))
        for _ in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=180)
        assert process.exitcode == 0
    client = redis_server.client()
    assert failures.empty(), failures.get()
    assert int(client.get("counter")) == PROCESSES * THREADS * ACQUISITIONS
