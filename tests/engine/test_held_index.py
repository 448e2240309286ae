"""The held index (``P:held``, lua/includes/held_index.lua): the scripts that take, renew, cool
down and release a lock keep it, and reading the held locks (``locks list``, ``locks doctor``,
the parked gauge of a metrics scrape) costs O(held locks), not a SCAN of the whole database.
On real Redis servers; SCAN calls counted with ``INFO commandstats``."""

from __future__ import annotations

import time
import types
from typing import Any, Iterator

import pytest
import redis
from celery import Celery
from click.testing import CliRunner

from celery_singleton_lock.celery.cli.app_target import open_target
from celery_singleton_lock.celery.cli.lock_listing import LockStream
from celery_singleton_lock.celery.observe.metrics import parked_by_task
from celery_singleton_lock.command_line import locks
from celery_singleton_lock.engine import Lease, Owner, RedisLocker, Renewer
from celery_singleton_lock.testing import RedisServer

PREFIX = "singleton-lock"
HELD = f"{PREFIX}:held"
#: unrelated keys in the database of the SCAN-count tests
UNRELATED = 200_000


def calls(client: redis.Redis, command: str) -> int:
    """How many ``command`` calls the server counted since its last CONFIG RESETSTAT."""
    stats = client.info("commandstats").get(f"cmdstat_{command}")
    return int(stats["calls"]) if stats else 0


def take(locker: RedisLocker, name: str, ttl: float = 30.0, **options: Any) -> Lease:
    lease = locker.try_acquire(name, ttl, owner=Owner(task_id=f"id-{name}"), **options)
    assert isinstance(lease, Lease)
    return lease


@pytest.fixture
def locker(redis_client: redis.Redis) -> Iterator[RedisLocker]:
    yield RedisLocker(redis_client, prefix=PREFIX, renewer=Renewer(autostart=False))


# -- what the scripts write ---------------------------------------------------------------------


def test_an_acquire_indexes_the_lock_until_its_lease_ends(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    now_ms = int(redis_client.time()[0]) * 1000
    lease = take(locker, "a", ttl=30, renew=False)
    score = redis_client.zscore(HELD, lease.key)
    assert score is not None and now_ms + 29_000 <= score <= now_ms + 32_000


def test_a_fenced_acquire_indexes_the_lock(locker: RedisLocker, redis_client: redis.Redis) -> None:
    lease = take(locker, "a", fencing=True, renew=False)
    assert redis_client.zscore(HELD, lease.key) is not None


def test_a_release_takes_the_lock_out_of_the_index(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    lease = take(locker, "a", renew=False)
    lease.release()
    assert redis_client.zcard(HELD) == 0


def test_a_release_with_a_finish_record_takes_the_lock_out_of_the_index(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    lease = take(locker, "a", renew=False)
    locker.release(lease, remember_for=60)
    assert (redis_client.zcard(HELD), redis_client.exists(lease.key)) == (0, 0)


def test_a_deferred_release_takes_the_lock_out_of_the_index(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    lease = take(locker, "a", renew=False)
    assert locker.releases.release_later(lease, lambda released, error: None)
    locker.releases.server.connections.settle_idle()  # type: ignore[union-attr]
    assert redis_client.zcard(HELD) == 0


def test_a_renewal_moves_the_index_entry_to_the_lease_new_end(
    redis_client: redis.Redis,
) -> None:
    renewer = Renewer(autostart=False)
    locker = RedisLocker(redis_client, prefix=PREFIX, renewer=renewer)
    lease = take(locker, "a", ttl=5)
    redis_client.zadd(HELD, {lease.key: 1})  # as if its entry were stale
    locker.renew_batch([lease], now=renewer.clock())
    now_ms = int(redis_client.time()[0]) * 1000
    assert (redis_client.zscore(HELD, lease.key) or 0) >= now_ms + 4_000
    renewer.discard(lease)


def test_a_release_into_a_cooldown_keeps_the_lock_indexed_for_the_cooldown(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    lease = take(locker, "a", ttl=30, renew=False)
    now_ms = int(redis_client.time()[0]) * 1000
    assert locker.cooldown.release_cooling(lease, 5.0)
    score = redis_client.zscore(HELD, lease.key) or 0
    assert now_ms + 4_000 <= score <= now_ms + 7_000


def test_releasing_a_dead_holder_takes_its_lock_out_of_the_index(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    owner = Owner(task_id="t-dead", host="h", pid=123)
    lease = locker.try_acquire("a", 30, owner=owner, renew=False)
    assert isinstance(lease, Lease)
    assert locker.releases.release_abandoned("a", task_id="t-dead", host="h", pid=123)
    assert redis_client.zcard(HELD) == 0


def test_a_slot_acquire_indexes_its_slot_table_until_the_lease_ends(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    now_ms = int(redis_client.time()[0]) * 1000
    lease = take(locker, "a", ttl=30, limit=3, renew=False)
    score = redis_client.zscore(HELD, lease.keys.slot_table[0])
    assert score is not None and now_ms + 29_000 <= score <= now_ms + 32_000


def test_a_slot_renewal_moves_its_slot_tables_entry_to_the_lease_new_end(
    redis_client: redis.Redis,
) -> None:
    renewer = Renewer(autostart=False)
    locker = RedisLocker(redis_client, prefix=PREFIX, renewer=renewer)
    lease = take(locker, "a", ttl=5, limit=3)
    table = lease.keys.slot_table[0]
    redis_client.zadd(HELD, {table: 1})  # as if its entry were stale
    assert locker.renew_batch([lease], now=renewer.clock()) == []
    now_ms = int(redis_client.time()[0]) * 1000
    assert (redis_client.zscore(HELD, table) or 0) >= now_ms + 4_000
    renewer.discard(lease)


def test_releasing_the_last_slot_takes_its_slot_table_out_of_the_index(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    first, second = take(locker, "a", limit=3, renew=False), take(locker, "b", limit=3, renew=False)
    first.release()
    assert redis_client.zscore(HELD, second.keys.slot_table[0]) is not None
    second.release()
    assert redis_client.zcard(HELD) == 0


def test_releasing_a_dead_slot_holder_takes_its_slot_table_out_of_the_index(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    owner = Owner(task_id="t-dead", host="h", pid=123)
    assert isinstance(locker.try_acquire("a", 30, owner=owner, limit=2, renew=False), Lease)
    assert locker.releases.release_abandoned("a", task_id="t-dead", host="h", pid=123)
    assert redis_client.zcard(HELD) == 0


# -- what the readers read ----------------------------------------------------------------------


def test_a_crashed_holders_entry_is_dropped_once_its_lease_expired(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    lease = take(locker, "crashed", ttl=0.2, renew=False)  # never released: its holder died
    for _ in range(100):  # its key expires within its TTL (bounded: 10 s)
        if not redis_client.exists(lease.key):
            break
        time.sleep(0.1)
    assert (list(locker.inspect.scan()), redis_client.zcard(HELD)) == ([], 0)


def test_a_gone_keys_entry_is_kept_when_the_lock_was_taken_again(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    lease = take(locker, "a", renew=False)
    locker.inspect._drop_gone(HELD, [lease.key])  # a reader that saw it gone before
    assert redis_client.zscore(HELD, lease.key) is not None


def test_scan_lists_each_slot_of_an_indexed_slot_table_without_a_scan(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    leases = [
        locker.try_acquire("s", 30, owner=Owner(task_id=f"t{i}"), limit=3, renew=False)
        for i in range(3)
    ]
    redis_client.config_resetstat()
    keys = sorted(holder.key for holder in locker.inspect.scan())
    assert (keys, calls(redis_client, "scan")) == (
        sorted(lease.key for lease in leases if isinstance(lease, Lease)),
        0,
    )


def test_a_slot_tables_entry_is_dropped_once_the_table_is_gone(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    lease = take(locker, "a", limit=2, renew=False)
    redis_client.delete(*lease.keys.slot_table)  # as if it expired
    assert (list(locker.inspect.scan()), redis_client.zcard(HELD)) == ([], 0)


def test_a_slot_tables_entry_is_kept_while_the_table_is_there(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    lease = take(locker, "a", limit=2, renew=False)
    locker.inspect._drop_gone(HELD, [lease.keys.slot_table[0]])
    assert redis_client.zscore(HELD, lease.keys.slot_table[0]) is not None


def test_scan_reads_the_index_as_a_generator_one_page_at_a_time(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    for index in range(300):
        take(locker, f"many-{index}", renew=False)
    redis_client.config_resetstat()
    holders = locker.inspect.scan(100)
    next(holders)
    first = calls(redis_client, "zscan")
    rest = sum(1 for _ in holders)
    assert (first, rest, calls(redis_client, "zscan") > 1) == (1, 299, True)


def test_list_streams_its_first_page_before_the_rest_is_read(
    redis_server: RedisServer, locker: RedisLocker, redis_client: redis.Redis
) -> None:
    for index in range(300):
        take(locker, f"many-{index}", renew=False)
    target = open_target(url=redis_server.url, app=None, app_label="", prefix=PREFIX)
    try:
        stream = LockStream(target, limit=1000, page=100)
        pages = stream.pages()
        first = next(pages)
        seen_after_first = stream.count
        total = seen_after_first + sum(len(page.holders) for page in pages)
    finally:
        target.close()
    assert (len(first.holders), seen_after_first, total) == (100, 100, 300)


def test_list_limit_stops_reading_the_index(
    redis_server: RedisServer, locker: RedisLocker, redis_client: redis.Redis
) -> None:
    for index in range(300):
        take(locker, f"many-{index}", renew=False)
    target = open_target(url=redis_server.url, app=None, app_label="", prefix=PREFIX)
    try:
        stream = LockStream(target, limit=100, page=100)
        redis_client.config_resetstat()
        count = sum(len(page.holders) for page in stream.pages())
    finally:
        target.close()
    assert (count, stream.truncated, calls(redis_client, "zscan") < 3) == (100, True, True)


# -- 200,000 unrelated keys ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def crowded() -> Iterator[RedisServer]:
    """A server holding UNRELATED keys of other applications and three held locks."""
    with RedisServer.running() as server:
        client = server.client()
        for start in range(0, UNRELATED, 10_000):  # bounded: 20 pipelines
            pipe = client.pipeline(transaction=False)
            for index in range(start, start + 10_000):
                pipe.set(f"app:{index}", "x")
            pipe.execute()
        locker = RedisLocker(client, prefix=PREFIX, renewer=Renewer(autostart=False))
        for name in ("proj.job:a", "proj.job:b", "proj.job:c"):
            take(locker, name, ttl=600, renew=False)
        yield server


def command(server: RedisServer, *args: str) -> Any:
    context = types.SimpleNamespace(app=Celery(set_as_current=False))
    return CliRunner().invoke(
        locks, ["--url", server.url, *args], obj=context, prog_name="celery locks"
    )


def test_list_among_200000_keys_makes_at_most_10_scan_calls(crowded: RedisServer) -> None:
    client = crowded.client()
    client.config_resetstat()
    result = command(crowded, "list")
    listed = sorted(line.split()[0] for line in result.stdout.splitlines() if "task=" in line)
    assert (listed, calls(client, "scan") <= 10) == (
        [f"{PREFIX}:{{proj.job:{name}}}" for name in "abc"],
        True,
    )


def test_doctor_among_200000_keys_makes_at_most_10_scan_calls(crowded: RedisServer) -> None:
    client = crowded.client()
    client.config_resetstat()
    result = command(crowded, "doctor")
    assert (result.exit_code, calls(client, "scan") <= 10) == (0, True)


def test_the_parked_gauge_among_200000_keys_makes_no_scan_call(crowded: RedisServer) -> None:
    client = crowded.client()
    locker = RedisLocker(client, prefix=PREFIX, renewer=Renewer(autostart=False))
    client.config_resetstat()
    counts = parked_by_task(locker)
    assert (counts, calls(client, "scan")) == ({}, 0)


def test_list_scan_finds_a_lock_an_older_version_took_without_indexing_it(
    redis_server: RedisServer, locker: RedisLocker, redis_client: redis.Redis
) -> None:
    take(locker, "indexed", renew=False)
    redis_client.delete(HELD)  # as if an older worker had taken it: no index entry
    result = command(redis_server, "list", "--scan")
    listed = [line.split()[0] for line in result.stdout.splitlines() if "task=" in line]
    assert listed == [f"{PREFIX}:{{indexed}}"]
