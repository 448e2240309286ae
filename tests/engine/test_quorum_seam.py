"""The backend seam on a Redlock quorum of 3 real redis-server processes: every operation the
Celery layer calls (engine/backend.py's LockBackend) frees or renews a held lease on a majority,
and what a quorum does not support is refused or answered "none" from its capabilities."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from celery_singleton_lock.engine import QUORUM, AcquireRequest, Owner, PartsReader, Renewer
from celery_singleton_lock.engine.redlock import QuorumLease, QuorumLocker
from celery_singleton_lock.errors import LockConfigurationError
from celery_singleton_lock.testing import RedisServer
from tests.engine.test_quorum import fast_client, holders_on, servers, settled

__all__ = ["servers"]  # the fixture, imported for pytest


@pytest.fixture
def renewer() -> Renewer:
    """A renewer that never ticks by itself: the leases stay registered, as in a worker."""
    return Renewer(autostart=False)


@pytest.fixture
def quorum(servers: list[RedisServer], renewer: Renewer) -> Iterator[QuorumLocker]:
    locker = QuorumLocker([fast_client(s) for s in servers], prefix="q", renewer=renewer)
    yield locker
    locker.close()


def held(quorum: QuorumLocker, name: str, **options: Any) -> QuorumLease:
    return settled(quorum.try_acquire(name, 30, owner=Owner(task_id=f"t-{name}"), **options))


def test_release_all_frees_every_held_lease_on_every_server(
    quorum: QuorumLocker, servers: list[RedisServer]
) -> None:
    leases = [held(quorum, "a"), held(quorum, "b")]
    assert quorum.release_all() == 2
    assert [holders_on(servers, lease.key) for lease in leases] == [[b""] * 3] * 2


def test_release_all_frees_the_leases_on_a_majority_with_one_server_stopped(
    quorum: QuorumLocker, servers: list[RedisServer]
) -> None:
    lease = held(quorum, "a")
    servers[0].stop()
    assert quorum.release_all() == 1
    assert holders_on(servers[1:], lease.key) == [b""] * 2


def test_release_all_leaves_leases_of_another_locker_alone(
    quorum: QuorumLocker, servers: list[RedisServer], renewer: Renewer
) -> None:
    other = QuorumLocker([fast_client(s) for s in servers], prefix="q", renewer=renewer)
    try:
        lease = settled(other.try_acquire("theirs", 30))
        assert quorum.release_all() == 0
        assert holders_on(servers, lease.key) == [lease.token.encode()] * 3
    finally:
        other.close()


def test_renew_by_owner_renews_a_held_lock_on_every_server(
    quorum: QuorumLocker, servers: list[RedisServer]
) -> None:
    lease = held(quorum, "a", renew=False)
    assert quorum.renew_by_owner([("a", lease.owner, 300)]) == []
    assert all(server.client().pttl(lease.key) > 60_000 for server in servers)


def test_a_renewer_tick_renews_a_held_lease_on_every_server(
    quorum: QuorumLocker, servers: list[RedisServer], renewer: Renewer
) -> None:
    lease = held(quorum, "a")
    for server in servers:
        server.client().pexpire(lease.key, 1000)
    lease.renew_due = renewer.clock()  # due now
    renewer.run_once()
    assert lease.held
    assert all(server.client().pttl(lease.key) > 10_000 for server in servers)


def test_a_quorum_declares_no_queue_latest_wins_markers_or_cooldown(quorum: QuorumLocker) -> None:
    assert (quorum.queue, quorum.latest, quorum.markers, quorum.cooldown) == (None,) * 4


def test_a_quorums_reader_declares_no_reads_of_parked_calls_rates_or_markers(
    quorum: QuorumLocker,
) -> None:
    assert not isinstance(quorum.inspect, PartsReader)


@pytest.mark.parametrize(
    "option, value, said",
    [
        ("park", b"message", "on_duplicate='queue'"),
        ("min_replicas", 1, "lock_min_replicas"),
        ("take_queued", True, "dedupe_on_enqueue"),
        ("fencing", True, "lock_fencing"),
    ],
)
def test_an_acquire_asking_for_what_a_quorum_lacks_is_refused_naming_it(
    quorum: QuorumLocker, option: str, value: Any, said: str
) -> None:
    with pytest.raises(LockConfigurationError, match=f"{said}.*Redlock quorum"):
        quorum.try_acquire("a", 5, owner=Owner(task_id="t-1"), **{option: value})


def test_the_quorum_says_what_it_lacks_in_its_capabilities(quorum: QuorumLocker) -> None:
    lacks = QUORUM.fencing, QUORUM.replica_acks, QUORUM.parking, QUORUM.enqueue_markers
    assert quorum.capabilities is QUORUM and lacks == (False, False, False, False)


# -- an acquire returns on a majority: the last server's write is still on its way -----------


def acquired_while_paused(quorum: QuorumLocker, server: RedisServer, seconds: float) -> QuorumLease:
    """A lease taken while every write sent to ``server`` is held for ``seconds`` (reads still
    answer): the acquire returns on the other two, that server's write still on its way."""
    client = server.client()
    client.client_pause(int(seconds * 1000), all=False)
    client.close()
    lease = quorum.try_acquire("a", 30)
    assert isinstance(lease, QuorumLease)
    return lease


def test_an_acquire_returns_before_the_paused_server_has_the_lock(
    quorum: QuorumLocker, servers: list[RedisServer]
) -> None:
    lease = acquired_while_paused(quorum, servers[0], 1.5)
    assert holders_on(servers, lease.key) == [b"", lease.token.encode(), lease.token.encode()]


def test_settle_waits_for_the_paused_servers_write(
    quorum: QuorumLocker, servers: list[RedisServer]
) -> None:
    lease = acquired_while_paused(quorum, servers[0], 1.0)
    assert lease.settle(timeout=10)
    assert holders_on(servers, lease.key) == [lease.token.encode()] * 3


def test_a_release_right_after_the_acquire_leaves_no_late_write_behind(
    quorum: QuorumLocker, servers: list[RedisServer]
) -> None:
    lease = acquired_while_paused(quorum, servers[0], 0.5)
    assert lease.release() is True  # waits for the acquire held on server 0, then deletes
    assert holders_on(servers, lease.key) == [b""] * 3


def test_an_acquire_outcome_says_whether_it_was_acquired_or_held(quorum: QuorumLocker) -> None:
    first = quorum.try_acquire("a", 30, owner=Owner(task_id="t-1"))
    second = quorum.try_acquire("a", 30, owner=Owner(task_id="t-2"))
    assert (first.state, second.state) == ("acquired", "held")


def test_a_prepared_acquire_takes_the_lock_on_a_majority(
    quorum: QuorumLocker, servers: list[RedisServer]
) -> None:
    prepared = quorum.prepare(AcquireRequest("", 30))
    lease = settled(prepared.acquire("a", Owner(task_id="t-a")))
    assert holders_on(servers, quorum.keys("a").lock) == [lease.token.encode()] * 3
    assert lease.release()
