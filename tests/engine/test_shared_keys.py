"""Shared fence counter and finish-record sets: bounded keys and bytes, promises kept, every
key a script touches declared in its KEYS."""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from typing import Any, Callable, Iterator
from zlib import crc32

import pytest
import redis
from redis.client import Monitor
from redis.crc import key_slot
from redis.exceptions import ResponseError

from celery_singleton_lock.engine import Latest, Lease, Owner, RedisLocker
from celery_singleton_lock.engine.keys import SHARDS, slot_tag
from celery_singleton_lock.errors import AlreadyFinished

#: finish records a set holds at 1,000 finished tasks/s kept 1 h (3.6M over SHARDS sets)
RECORDS_PER_SET_AT_TARGET = 3_600_000 // SHARDS + 1


def finish(locker: RedisLocker, name: str, task_id: str, remember_for: float = 3600) -> None:
    """One acks_late task ran to the end under lock ``name``: acquired and released with its
    finish record."""
    lease = locker.try_acquire(name, ttl=30, owner=Owner(task_id=task_id), renew=False)
    assert isinstance(lease, Lease)
    assert lease.release(remember_for=remember_for)


def redelivered(locker: RedisLocker, task_id: str) -> Any:
    """The acquire of a redelivered copy of ``task_id``: a lease, or AlreadyFinished raised."""
    return locker.try_acquire(
        "job", ttl=30, owner=Owner(task_id=task_id), renew=False, unless_finished=True
    )


def uuid_sized(i: int) -> str:
    return f"{i:08d}-0000-4000-8000-000000000000"


def test_a_thousand_fenced_lock_names_leave_one_counter_key(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    fences = []
    for i in range(1000):
        lease = locker.try_acquire(f"account-{i}", ttl=30, fencing=True, renew=False)
        assert isinstance(lease, Lease)
        fences.append(lease.fence)
        assert lease.release()
    assert fences == list(range(1, 1001))
    assert redis_client.keys("*") == [locker.shared.counter.encode()]


def test_finish_records_are_spread_by_task_id_over_a_bounded_number_of_sets(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    ids = [uuid_sized(i) for i in range(500)]
    for i, task_id in enumerate(ids):
        finish(locker, f"doc-{i}", task_id)
    expected = {f"t:finished:{crc32(task_id.encode()) % SHARDS}".encode() for task_id in ids}
    assert set(redis_client.keys("*")) == expected
    assert all(int(key.rsplit(b":", 1)[1]) < SHARDS for key in expected)


def test_a_finish_record_set_at_the_target_load_is_compact_under_100_bytes_a_record(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    """At 1,000 finished tasks/s kept 1 h a set holds ~110 records: Redis keeps it in its
    compact encoding, ~50 bytes a record (MEMORY USAGE of the whole key)."""
    locker.shared.shards = 1  # every record in one set, as many as one holds at that load
    for i in range(RECORDS_PER_SET_AT_TARGET):
        finish(locker, f"doc-{i}", uuid_sized(i))
    (key,) = redis_client.keys("*")
    assert redis_client.zcard(key) == RECORDS_PER_SET_AT_TARGET
    assert redis_client.object("encoding", key) == b"listpack"
    used = int(redis_client.memory_usage(key, samples=0) or 0)
    assert used / RECORDS_PER_SET_AT_TARGET <= 100


def test_a_redelivered_copy_is_dropped_while_its_record_lives_and_not_after(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    locker.shared.shards = 1  # the short record shares its set with a long one
    finish(locker, "a", "short", remember_for=0.3)
    finish(locker, "b", "long", remember_for=60)
    with pytest.raises(AlreadyFinished):
        redelivered(locker, "short")
    time.sleep(0.4)
    assert redis_client.zscore("t:finished:0", "short") is not None  # not trimmed yet...
    assert isinstance(redelivered(locker, "short"), Lease)  # ...but no longer alive
    with pytest.raises(AlreadyFinished):
        redelivered(locker, "long")


def test_a_write_trims_the_expired_records_and_the_set_expires_with_its_newest(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    locker.shared.shards = 1
    finish(locker, "a", "expired", remember_for=0.1)
    finish(locker, "b", "long", remember_for=60)
    time.sleep(0.2)
    finish(locker, "c", "short", remember_for=5)
    assert redis_client.zrange("t:finished:0", 0, -1) == [b"short", b"long"]
    assert 59_000 < redis_client.pttl("t:finished:0") <= 60_000  # the newest expiry, not the last
    finish(locker, "d", "alone", remember_for=0.2)
    time.sleep(0.3)
    assert redis_client.zscore("t:finished:0", "alone") is not None
    redis_client.zrem("t:finished:0", "short", "long")
    finish(locker, "e", "last", remember_for=0.2)
    assert redis_client.zrange("t:finished:0", 0, -1) == [b"last"]
    time.sleep(0.3)
    assert not redis_client.exists("t:finished:0")  # an idle set vanishes


def test_every_cluster_slot_has_a_tag_hashing_to_it() -> None:
    assert all(key_slot(slot_tag(slot).encode()) == slot for slot in range(16384))
    assert max(len(slot_tag(slot)) for slot in range(16384)) <= 4


# -- every key a script touches is in its KEYS ------------------------------------------------


#: A MONITOR line: '<time> [<db> <client address, or lua>] "<arg>" "<arg>" ...' (parsed here:
#: redis-py's own Monitor patterns differ between its releases)
_MONITOR_LINE = re.compile(r"^[\d.]+ \[\d+ (\S+)\] (.*)$")
_MONITOR_ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _monitored(monitor: Monitor) -> Iterator[tuple[str, list[str]]]:
    """``(source, args)`` of each command the server runs (source ``lua``: run by a script)."""
    while True:
        line = monitor.connection.read_response()
        text = line.decode("utf-8", "replace") if isinstance(line, bytes) else str(line)
        match = _MONITOR_LINE.match(text)
        assert match is not None, text
        source, command = match.groups()
        yield source, [arg.replace('\\"', '"') for arg in _MONITOR_ARG.findall(command)]


@contextlib.contextmanager
def keys_declared(client: redis.Redis) -> Iterator[list[str]]:
    """Fails if a script run inside touches a key not among its KEYS (as Redis Cluster proxies
    and Dragonfly require): every command the scripts run, seen with MONITOR, its keys told by
    the server (COMMAND GETKEYS). Yields the list of scripts seen (their first key)."""
    seen: list[str] = []
    with client.monitor() as monitor:
        yield seen
        marker = f"end-{uuid.uuid4()}"
        client.echo(marker)
        declared: set[str] = set()
        undeclared = []
        for source, args in _monitored(monitor):
            name = args[0].upper()
            if source != "lua":
                if name == "ECHO" and args[1] == marker:
                    break
                if name in ("EVALSHA", "EVAL"):
                    declared = set(args[3 : 3 + int(args[2])])
                    seen.append(args[3])
                continue
            try:
                keys = client.command_getkeys(*args)
            except ResponseError:  # TIME, PUBLISH: no key
                keys = []
            undeclared += [(args, key) for key in map(str, keys) if key not in declared]
    assert not undeclared


def test_every_key_the_finish_record_scripts_touch_is_in_their_keys(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    def owner(task_id: str) -> Owner:
        return Owner(task_id=task_id)

    steps: list[Callable[[], object]] = []

    def mutex() -> None:
        lease = locker.try_acquire(
            "m", 30, owner=owner("m1"), fencing=True, unless_finished=True, renew=False
        )
        assert isinstance(lease, Lease) and lease.release(remember_for=3600)
        with pytest.raises(AlreadyFinished):
            locker.try_acquire("m", 30, owner=owner("m1"), unless_finished=True, renew=False)

    def slots() -> None:
        lease = locker.try_acquire("s", 30, owner=owner("s1"), limit=3, unless_finished=True)
        assert isinstance(lease, Lease) and lease.release(remember_for=3600)
        cooled = locker.try_acquire("c", 30, owner=owner("c1"), unless_finished=True)
        assert isinstance(cooled, Lease)
        assert locker.cooldown.release_cooling(cooled, 1.0, remember_for=3600)

    def parked(**options: Any) -> Callable[[], None]:
        def step() -> None:
            name = f"p{len(options)}-{sorted(options)}"
            first = locker.try_acquire(
                name,
                30,
                owner=owner(f"{name}-1"),
                park=b"m1",
                reservation_ttl=30,
                unless_finished=True,
                renew=False,
                **options,
            )
            assert isinstance(first, Lease)
            if "latest" in options:
                locker.latest.release_latest(first, reservation_ttl=30, remember_for=3600)
            else:
                locker.queue.release_handing_on(
                    first, limit=options.get("limit", 1), reservation_ttl=30, remember_for=3600
                )

        return step

    steps += [mutex, slots, parked(), parked(limit=2), parked(latest=Latest())]
    with keys_declared(redis_client) as seen:
        for step in steps:
            step()
    assert len(seen) >= 10  # the scripts did run (and were watched)
    assert redis_client.keys("t:finished:*")
