"""Renewal: one round trip per tick for every lease, TTL replaced never extended, loss detection."""

from __future__ import annotations

import threading
import time

import redis

from celery_singleton_lock.engine import Lease, RedisLocker, Renewer
from celery_singleton_lock.engine.server_renewal import CHUNK
from celery_singleton_lock.testing import RedisServer
from tests.engine.conftest import FakeClock, stored_token
from tests.support import CountingConnection, wait_until


def hand_driven(client: redis.Redis, clock: FakeClock) -> tuple[Renewer, RedisLocker]:
    """A renewer that ticks only when the test calls ``run_once()``, and a locker using it."""
    renewer = Renewer(clock=clock, autostart=False)
    return renewer, RedisLocker(client, prefix="t", renewer=renewer)


def test_renewal_keeps_a_one_second_lease_alive_for_five_seconds(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    lease = locker.try_acquire("job", ttl=1.0)
    assert isinstance(lease, Lease)
    deadline = time.monotonic() + 5.0
    max_pttl = 0
    while time.monotonic() < deadline:
        assert stored_token(redis_client, lease.key) == lease.token.encode()
        max_pttl = max(max_pttl, redis_client.pttl(lease.key))
        time.sleep(0.05)
    assert not lease.lost.is_set()
    assert 0 < max_pttl <= 1000  # replaced, never added to


def test_renewing_a_thousand_leases_costs_one_round_trip_per_tick(
    counting_client: redis.Redis, clock: FakeClock
) -> None:
    renewer, locker = hand_driven(counting_client, clock)
    # 30 s: the server's clock is real, and taking 1000 locks one by one on a loaded machine
    # outlasted 3 s (the first expired, reported lost)
    leases = [locker.try_acquire(f"job-{i}", ttl=30.0) for i in range(1000)]
    assert all(isinstance(lease, Lease) for lease in leases)
    clock.advance(10.0)
    renewer.run_once()  # first tick: NOSCRIPT, scripts loaded, EVALSHA; then cached
    for _tick in range(3):
        clock.advance(10.0)
        CountingConnection.reset()
        renewer.run_once()
        assert CountingConnection.sent == ["PIPELINE"]  # the chunks' calls, sent together
    assert not any(lease.lost.is_set() for lease in leases)  # type: ignore[union-attr]


def test_no_round_trip_before_a_lease_is_due(
    counting_client: redis.Redis, clock: FakeClock
) -> None:
    renewer, locker = hand_driven(counting_client, clock)
    locker.try_acquire("job", ttl=3.0)
    CountingConnection.reset()
    clock.advance(0.4)  # well before ttl/3
    renewer.run_once()
    assert CountingConnection.sent == []


def test_renewal_replaces_the_ttl(redis_client: redis.Redis, clock: FakeClock) -> None:
    renewer, locker = hand_driven(redis_client, clock)
    lease = locker.try_acquire("job", ttl=2.0)
    assert isinstance(lease, Lease)
    redis_client.pexpire(lease.key, 50_000)  # pretend something stretched it
    clock.advance(1.0)
    renewer.run_once()
    assert 1500 < redis_client.pttl(lease.key) <= 2000


def test_deleted_key_marks_the_lease_lost_within_one_tick(
    redis_client: redis.Redis, clock: FakeClock
) -> None:
    renewer, locker = hand_driven(redis_client, clock)
    lost: list[Lease] = []
    lease = locker.try_acquire("job", ttl=3.0, on_lost=lost.append)
    assert isinstance(lease, Lease)
    redis_client.delete(lease.key)
    clock.advance(1.0)
    renewer.run_once()
    assert lease.lost.is_set()
    assert lost == [lease]
    assert lease not in renewer.leases()


def test_overwritten_key_marks_the_lease_lost_and_is_left_alone(
    redis_client: redis.Redis, clock: FakeClock
) -> None:
    renewer, locker = hand_driven(redis_client, clock)
    lease = locker.try_acquire("job", ttl=3.0)
    assert isinstance(lease, Lease)
    redis_client.set(lease.key, "e" * 32 + "||1|2|other-host|other-task", px=700)
    clock.advance(1.0)
    renewer.run_once()
    assert lease.lost.is_set()
    assert redis_client.pttl(lease.key) <= 700  # the new owner's TTL was not touched


def test_loss_is_detected_by_the_renewer_thread(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    fired = threading.Event()
    lease = locker.try_acquire("job", ttl=0.6, on_lost=lambda _lease: fired.set())
    assert isinstance(lease, Lease)
    redis_client.delete(lease.key)
    # the next tick (ttl/3 = 0.2 s) finds it; undetected, nothing else would set it. The wait
    # is long: a thread on a loaded 2-core machine has woken 0.7 s late.
    assert fired.wait(timeout=10)


def test_a_foreign_token_cannot_renew(redis_client: redis.Redis, clock: FakeClock) -> None:
    _, locker = hand_driven(redis_client, clock)
    lease = locker.try_acquire("job", ttl=3.0, renew=False)
    assert isinstance(lease, Lease)
    impostor = Lease(
        locker=locker,
        keys=lease.keys,
        token="f" * 32,
        ttl=60,
        owner=lease.owner,
        fence=None,
        confirmed_at=clock(),
        deadline=None,
    )
    assert locker.renew_batch([impostor], now=clock()) == [0]
    assert redis_client.pttl(lease.key) <= 3000


def test_renewal_stops_at_the_maximum_lifetime(redis_client: redis.Redis, clock: FakeClock) -> None:
    renewer, locker = hand_driven(redis_client, clock)
    lease = locker.try_acquire("job", ttl=3.0, max_lifetime=2.5)
    assert isinstance(lease, Lease)
    clock.advance(1.0)
    renewer.run_once()
    clock.advance(1.0)
    renewer.run_once()  # 0.5 s of lifetime left: the TTL is capped to it
    assert redis_client.pttl(lease.key) <= 500
    clock.advance(1.0)
    renewer.run_once()
    assert renewer.leases() == []


def test_released_lease_is_no_longer_renewed(redis_client: redis.Redis, clock: FakeClock) -> None:
    renewer, locker = hand_driven(redis_client, clock)
    lease = locker.try_acquire("job", ttl=3.0)
    assert isinstance(lease, Lease)
    lease.release()
    assert renewer.leases() == []


def test_unreachable_server_marks_lost_only_after_the_ttl_has_passed(clock: FakeClock) -> None:
    with RedisServer.running() as server:
        client = server.client(socket_timeout=0.5, socket_connect_timeout=0.5)
        renewer, locker = hand_driven(client, clock)
        lease = locker.try_acquire("job", ttl=3.0)
        assert isinstance(lease, Lease)
        server.stop()
        clock.advance(1.5)
        renewer.run_once()
        assert not lease.lost.is_set()  # 1.5 s since confirmed: may still be ours
        clock.advance(1.6)
        renewer.run_once()
        assert lease.lost.is_set()  # 3.1 s: the TTL has certainly run out


def test_renewer_thread_survives_an_outage_and_resumes() -> None:
    with RedisServer.running() as server:
        # a stopped server refuses at once: the timeouts only bound a reply a loaded machine
        # is slow to send
        client = server.client(socket_timeout=2, socket_connect_timeout=2)
        renewer = Renewer()
        locker = RedisLocker(client, prefix="t", renewer=renewer)
        long_lived = locker.try_acquire("long", ttl=3.0)
        assert isinstance(long_lived, Lease)
        server.stop()
        time.sleep(0.5)
        server.start()  # the data is gone: the long lease is lost, and reported as such
        wait_until(long_lived.lost.is_set, timeout=15)
        # renewed every 0.67 s, it outlives a renewer kept off the CPU 1.3 s; held past its TTL
        fresh = locker.try_acquire("fresh", ttl=2.0)
        assert isinstance(fresh, Lease)
        time.sleep(3.0)
        assert stored_token(client, fresh.key) == fresh.token.encode()
        assert not fresh.lost.is_set()


def test_leases_with_different_ttls_in_one_tick_each_get_their_own(
    counting_client: redis.Redis, clock: FakeClock
) -> None:
    renewer, locker = hand_driven(counting_client, clock)
    ttls = [3.0, 3.0, 9.0, 3.0, 6.0, 3.0]
    leases = [locker.try_acquire(f"job-{i}", ttl=ttl) for i, ttl in enumerate(ttls)]
    assert all(isinstance(lease, Lease) for lease in leases)
    for lease in leases:
        counting_client.pexpire(lease.key, 100_000)  # pretend something stretched them
    clock.advance(3.0)  # every lease is due
    renewer.run_once()  # loads the script
    clock.advance(3.0)
    CountingConnection.reset()
    renewer.run_once()
    assert CountingConnection.sent == ["EVALSHA"]
    for lease, ttl in zip(leases, ttls):
        assert ttl * 1000 - 500 < counting_client.pttl(lease.key) <= ttl * 1000  # type: ignore[union-attr]


def test_a_foreign_key_in_a_renewal_batch_loses_only_that_lease(
    redis_client: redis.Redis, clock: FakeClock
) -> None:
    renewer, locker = hand_driven(redis_client, clock)
    leases = [locker.try_acquire(f"job-{i}", ttl=3.0) for i in range(5)]
    assert all(isinstance(lease, Lease) for lease in leases)
    taken = leases[2]
    assert isinstance(taken, Lease)
    redis_client.delete(taken.key)
    redis_client.hset(taken.key, "token", taken.token)  # not a string: WRONGTYPE for GETRANGE
    clock.advance(1.0)
    renewer.run_once()
    assert [lease.lost.is_set() for lease in leases] == [False, False, True, False, False]  # type: ignore[union-attr]
    assert redis_client.type(taken.key) == b"hash"  # left alone


def test_a_lease_added_while_the_renewer_sleeps_long_is_renewed_on_time(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    long_lived = locker.try_acquire("long", ttl=60.0)  # the thread now sleeps ~20 s
    assert isinstance(long_lived, Lease)
    time.sleep(0.2)
    # renewed every 0.67 s, it outlives a renewer kept off the CPU 1.3 s; held past its TTL
    short = locker.try_acquire("short", ttl=2.0)
    assert isinstance(short, Lease)
    time.sleep(3.0)
    assert stored_token(redis_client, short.key) == short.token.encode()
    assert not short.lost.is_set()


def test_a_lease_taken_after_an_idle_tick_does_not_wake_the_renewer(
    redis_client: redis.Redis, clock: FakeClock
) -> None:
    # A worker takes short locks one after another: between two tasks the renewer often ticks
    # with nothing held. Waking its thread again for each next lock would cost every task.
    renewer, locker = hand_driven(redis_client, clock)
    first = locker.try_acquire("job-1", 30)
    assert isinstance(first, Lease) and renewer.wakeups == 1
    first.release()
    clock.advance(10)
    assert renewer.run_once() is None  # nothing held
    second = locker.try_acquire("job-2", 30)
    assert isinstance(second, Lease)
    assert renewer.wakeups == 1
    clock.advance(10)
    renewer.run_once()  # the tick planned at the idle one renews it
    assert second.confirmed_at == clock.now


def test_a_lease_due_before_the_planned_tick_still_wakes_the_renewer(
    redis_client: redis.Redis, clock: FakeClock
) -> None:
    renewer, locker = hand_driven(redis_client, clock)
    locker.try_acquire("slow", 30).release()  # type: ignore[union-attr]
    renewer.run_once()  # idle: the next look is 10 s away
    assert isinstance(locker.try_acquire("fast", 0.3), Lease)  # due in 0.1 s
    assert renewer.wakeups == 2


def test_a_lease_past_its_maximum_lifetime_is_marked_lost(
    redis_client: redis.Redis, clock: FakeClock
) -> None:
    renewer, locker = hand_driven(redis_client, clock)
    lost: list[Lease] = []
    lease = locker.try_acquire("job", ttl=3.0, max_lifetime=2.0, on_lost=lost.append)
    assert isinstance(lease, Lease)
    clock.advance(2.5)
    renewer.run_once()
    assert lost == [lease]
    assert lease.lost.is_set()
    assert not lease.held


def chunked_leases(locker: RedisLocker) -> list[Lease]:
    """More leases than two renewal chunks hold (three script calls per tick)."""
    leases = [
        locker.try_acquire(f"job-{i}", ttl=30, renew=False) for i in range(2 * CHUNK + CHUNK // 2)
    ]
    assert all(isinstance(lease, Lease) for lease in leases)
    return leases  # type: ignore[return-value]


def test_renewing_more_leases_than_a_chunk_is_one_round_trip_of_one_call_per_chunk(
    counting_client: redis.Redis, clock: FakeClock
) -> None:
    locker = RedisLocker(counting_client, prefix="t", renewer=Renewer(clock=clock, autostart=False))
    leases = chunked_leases(locker)
    assert locker.renew_batch(leases, now=clock()) == []  # loads the script
    counting_client.config_resetstat()
    CountingConnection.reset()
    assert locker.renew_batch(leases, now=clock()) == []
    assert CountingConnection.sent == ["PIPELINE"]  # one round trip...
    assert counting_client.info("commandstats")["cmdstat_evalsha"]["calls"] == 3  # ...3 calls
    counting_client.script_flush()  # a server that lost its scripts: loaded, all sent again
    CountingConnection.reset()
    assert locker.renew_batch(leases, now=clock()) == []
    assert CountingConnection.sent == ["PIPELINE", "SCRIPT LOAD", "PIPELINE"]


def test_a_chunked_renewal_reports_the_lost_leases_by_their_index_across_chunks(
    redis_client: redis.Redis, clock: FakeClock
) -> None:
    _, locker = hand_driven(redis_client, clock)
    leases = chunked_leases(locker)
    lost = [0, 5, CHUNK - 1, CHUNK, 2 * CHUNK + 1, len(leases) - 1]
    redis_client.delete(*(leases[index].key for index in lost))
    assert locker.renew_batch(leases, now=clock()) == lost
