"""A body that holds the GIL cannot renew its own lock: the worker's main process does.

Real prefork workers (tests/celery/workers.py). ``holds_the_gil`` (lock_ttl=1, skip) holds the
GIL in one regex match sized to last about three TTLs; its child's renewer thread cannot run
meanwhile. The main process renews the lock by owner
(celery_singleton_lock.celery.worker.child_renewal).
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from dataclasses import dataclass
from typing import Any, Iterator

import pytest
import redis
from celery import Celery
from celery.result import AsyncResult

from celery_singleton_lock import DuplicateTaskSkipped
from celery_singleton_lock.engine.lua_scripts import source
from celery_singleton_lock.testing import RedisServer
from tests.celery.tasks import gil, policies
from tests.celery.workers import (
    CeleryWorkerProcess,
    Servers,
    client_app,
    close_client,
    unique,
    worker_group,
)
from tests.support import sleep_for, wait_until

#: How long the holder keeps the GIL, in TTLs of holds_the_gil (lock_ttl=1).
GIL_HELD_S = 3.0
#: When the duplicate is sent, counted from the holder's body start: past the 1 s TTL.
DUPLICATE_AFTER_S = 1.2
#: Growth of the match time per character of holds_the_gil's input (the golden ratio).
GROWTH = (1 + 5**0.5) / 2


@dataclass
class Scene:
    servers: Servers
    client: Celery
    store: redis.Redis  # the lock server, where bodies record their runs


@pytest.fixture(scope="module")
def scene() -> Iterator[Scene]:
    """Broker and lock servers of this module only (results: broker db 1), and clients."""
    with RedisServer.running() as broker, RedisServer.running() as lock:
        servers = Servers(broker.url, lock)
        client, store = client_app(servers), lock.client(socket_timeout=5)
        try:
            yield Scene(servers, client, store)
        finally:
            close_client(client)
            store.close()


#: Pool children of the module's worker: one per body of the renewal test.
CHILDREN = 3


@pytest.fixture(scope="module")
def worker(scene: Scene) -> Iterator[CeleryWorkerProcess]:
    """One prefork worker shared by the tests (each with keys of its own; none is killed)."""
    with worker_group(scene.servers) as group:
        (started,) = group.start(1, pool="prefork", concurrency=CHILDREN)
        yield started


def size_holding_the_gil_for(seconds: float) -> int:
    """The input size for which holds_the_gil's match takes about ``seconds`` here."""
    pattern, size = re.compile(gil.GIL_PATTERN), 24

    def match_time() -> float:
        started = time.perf_counter()
        pattern.match("a" * size + "b")
        return time.perf_counter() - started

    took = 0.0
    for _ in range(12):  # at most 24..35: about a second in all
        # the fastest of three: a time stretched by a loaded machine's stall sized the match
        # several times too short (a stall of 0.25 s, five times), and the holder left early
        took = min(match_time() for _ in range(3))
        if took > 0.05:
            break
        size += 1
    return size + max(0, math.ceil(math.log(seconds / max(took, 1e-6), GROWTH)))


def send(client: Celery, queue: str, *args: Any) -> AsyncResult:
    return client.send_task(gil.holds_the_gil.name, args=args, queue=queue)


def test_duplicate_never_runs_beside_a_body_that_holds_the_gil_past_the_ttl(
    scene: Scene, worker: CeleryWorkerProcess
) -> None:
    client, lock_store = scene.client, scene.store
    key = unique("gil")
    size = size_holding_the_gil_for(GIL_HELD_S)
    holder = send(client, worker.queue, key, size)
    wait_until(lambda: lock_store.llen(f"runs:{key}"), timeout=20)
    sleep_for(DUPLICATE_AFTER_S)
    duplicate = send(client, worker.queue, key, 0)
    outcome: Any = None
    try:
        outcome = duplicate.get(timeout=20)
    except DuplicateTaskSkipped as exc:
        outcome = exc
    holder_inside = int(lock_store.get(f"gauge:{key}") or 0)
    holder.get(timeout=30)
    assert holder_inside == 1, "premise: the holder was still inside when the duplicate ended"
    assert int(lock_store.get(f"overlaps:{key}") or 0) == 0
    assert lock_store.llen(f"runs:{key}") == 1
    assert isinstance(outcome, DuplicateTaskSkipped) and holder.id in str(outcome), outcome


def test_main_process_renews_every_childs_lock_in_one_round_trip_per_tick(
    scene: Scene, worker: CeleryWorkerProcess
) -> None:
    client, lock_store = scene.client, scene.store
    children = CHILDREN
    sha = hashlib.sha1(source("renew_by_owner").encode()).hexdigest()
    keys = [unique("batch") for _ in range(children)]
    for key in keys:
        client.send_task(policies.hold_skip.name, args=(key, 4.0), queue=worker.queue)
    for key in keys:
        wait_until(lambda key=key: lock_store.llen(f"runs:{key}"), timeout=20)
    lock_store.config_set("slowlog-max-len", 10000)
    lock_store.config_set("slowlog-log-slower-than", 0)  # log every command
    lock_store.slowlog_reset()
    sleep_for(1.0)
    all_inside = sum(int(lock_store.get(f"gauge:{key}") or 0) for key in keys)
    entries = lock_store.slowlog_get(10000)
    lock_store.config_set("slowlog-log-slower-than", 10000)
    assert all_inside == children, "premise: every body ran throughout the window"
    calls = [
        entry["command"].split()
        for entry in entries
        if entry["command"].startswith(b"EVALSHA " + sha.encode())
    ]
    print(f"RENEW_BY_OWNER calls in 1 s with {children} children: {len(calls)}")
    assert calls, "the main process renewed nothing"
    # every child's lock in each call: 3 keys a lock, its key and its slot table's two
    # (lua/renew_by_owner.lua's contract)
    assert all(int(call[2]) == 3 * children for call in calls)
