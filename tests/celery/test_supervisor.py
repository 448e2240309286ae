"""What the main-process supervisor renews, tick by tick, against the real lock server.

Celery's requests are stood in for by objects with the attributes the supervisor reads from
``celery.worker.request.Request`` (``task``, ``id``, ``args``, ``kwargs``, ``worker_pid``,
``hostname``, ``time_limits``, ``time_start``); the locks, scripts and locker are real. The
whole path under real prefork workers is in test_gil_starvation.py.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from types import SimpleNamespace
from typing import Any

import redis

from celery_singleton_lock.celery.worker.child_renewal import DEATH_CHECK, ChildLockSupervisor
from celery_singleton_lock.celery.worker.reclaim import pid_is_gone
from celery_singleton_lock.engine import Lease, Owner, RedisLocker
from tests.celery import lockapp
from tests.celery.tasks import gil

NOW = 1_800_000_000.0
NODE = "node@h"
#: TTL the child's lock is left with before a tick (holds_the_gil's lock_ttl is 1 s).
SHORT_MS = 300


def running(key: str, *, pid: int = 4242, task: Any = gil.holds_the_gil, **extra: Any) -> Any:
    """A request accepted by child ``pid`` at NOW."""
    fields = {
        "task": task,
        "id": uuid.uuid4().hex,
        "args": (key,),
        "kwargs": {},
        "worker_pid": pid,
        "hostname": NODE,
        "time_limits": (None, None),
        "time_start": NOW,
        **extra,
    }
    return SimpleNamespace(**fields)


def held_by_child(locker: RedisLocker, request: Any) -> Lease:
    """The lock ``request``'s child took, as before_start takes it, left with SHORT_MS."""
    name = request.task.lock_options.keyer.name(request.args, request.kwargs)
    owner = Owner(task_id=request.id, host=request.hostname, pid=request.worker_pid)
    lease = locker.try_acquire(name, SHORT_MS / 1000, owner=owner, renew=False)
    assert isinstance(lease, Lease)
    return lease


def supervising(requests: list[Any], now: float = NOW) -> ChildLockSupervisor:
    return ChildLockSupervisor(1 / 3, requests=lambda: list(requests), clock=lambda: now)


def test_a_tick_gives_the_childs_lock_its_full_ttl_again(
    locker: RedisLocker, store: redis.Redis, unique_key: str
) -> None:
    request = running(unique_key)
    lease = held_by_child(locker, request)
    assert supervising([request]).tick() == 1
    assert store.pttl(lease.key) > SHORT_MS


def test_one_round_trip_renews_every_childs_lock(locker: RedisLocker, unique_key: str) -> None:
    requests = [running(f"{unique_key}-{pid}", pid=pid) for pid in range(100, 110)]
    for request in requests:
        held_by_child(locker, request)
    supervisor = supervising(requests)
    assert supervisor.tick() == len(requests)
    assert supervisor.round_trips == 1


def test_renewal_stops_at_the_tasks_hard_time_limit(
    locker: RedisLocker, store: redis.Redis, unique_key: str
) -> None:
    request = running(unique_key, time_limits=(10, None))
    lease = held_by_child(locker, request)
    supervisor = supervising([request], now=NOW + 10.5)
    assert supervisor.tick() == 0
    assert supervisor.round_trips == 0
    assert store.pttl(lease.key) <= SHORT_MS


def test_near_the_hard_time_limit_the_ttl_ends_with_it(
    locker: RedisLocker, store: redis.Redis, unique_key: str
) -> None:
    request = running(unique_key, time_limits=(10, None))
    lease = held_by_child(locker, request)
    assert supervising([request], now=NOW + 9.8).tick() == 1
    assert store.pttl(lease.key) <= 200


def test_a_request_that_left_the_active_set_is_not_renewed(
    locker: RedisLocker, store: redis.Redis, unique_key: str
) -> None:
    requests = [running(unique_key)]
    lease = held_by_child(locker, requests[0])
    supervisor = supervising(requests)
    supervisor.tick()
    store.pexpire(lease.key, SHORT_MS)
    requests.clear()  # the child returned: Celery's task_ready discarded it
    assert supervisor.tick() == 0
    assert supervisor.round_trips == 1
    assert store.pttl(lease.key) <= SHORT_MS


def test_a_request_no_child_accepted_yet_costs_nothing(unique_key: str) -> None:
    supervisor = supervising([running(unique_key, worker_pid=None)])
    assert supervisor.tick() == 0
    assert supervisor.round_trips == 0


def test_a_task_without_a_lock_costs_nothing(unique_key: str) -> None:
    plain = lockapp.app.tasks["celery.backend_cleanup"]
    supervisor = supervising([running(unique_key, task=plain)])
    assert supervisor.tick() == 0
    assert supervisor.round_trips == 0


def test_the_lock_of_a_duplicate_holder_is_not_renewed_for_the_waiting_request(
    locker: RedisLocker, store: redis.Redis, unique_key: str
) -> None:
    holder, duplicate = running(unique_key, pid=1), running(unique_key, pid=2)
    lease = held_by_child(locker, holder)
    assert supervising([duplicate]).tick() == 0
    assert store.pttl(lease.key) <= SHORT_MS


def dead_pid() -> int:
    """The pid of a process that ran and was reaped: gone, as a killed child is."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_a_dead_childs_lock_is_freed_at_once_and_published(
    locker: RedisLocker, store: redis.Redis, unique_key: str
) -> None:
    request = running(unique_key, pid=dead_pid())
    lease = held_by_child(locker, request)
    releases = store.pubsub(ignore_subscribe_messages=True)
    releases.subscribe(lease.keys.channel)
    supervisor = ChildLockSupervisor(
        1 / 3, requests=lambda: [request], clock=lambda: NOW, gone=pid_is_gone
    )
    assert supervisor.tick() == 0
    assert not store.exists(lease.key)
    assert supervisor.round_trips == 0  # not renewed first
    messages = (releases.get_message(timeout=0.5) for _ in range(10))
    assert any(m and m["type"] == "message" for m in messages)  # a waiting duplicate wakes
    releases.close()


def test_a_live_childs_lock_is_renewed_only_every_renewal_interval(
    locker: RedisLocker, store: redis.Redis, unique_key: str
) -> None:
    request = running(unique_key, pid=os.getpid())
    lease = held_by_child(locker, request)
    supervisor = ChildLockSupervisor(
        5 * DEATH_CHECK, requests=lambda: [request], clock=lambda: NOW, gone=pid_is_gone
    )
    assert supervisor.interval == DEATH_CHECK  # looks for dead children at every tick
    assert [supervisor.tick() for _ in range(6)] == [1, 0, 0, 0, 0, 1]
    assert supervisor.round_trips == 2
    assert store.exists(lease.key)
