"""A RedisLocker on redis-py's Sentinel ``master_for`` client, through a real failover.

The client is the one the Celery layer makes (``lock_server.make_client``): redis-py's
``Sentinel(...).master_for(...)`` with the package's connection class, which asks the sentinels
where the master is at every reconnection (see ``SentinelMasterConnection``).

One failover of a real group (1 master, 1 replica, 3 sentinels on loopback; see
tests/sentinel_topology.py) for the whole module, observed once by :func:`failover`; each test
states one fact of what the locker did. The locker's connections are warm on the old master
when the failover starts: acquire and release on the connections it keeps checked out,
renewal on the client's pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import pytest

from celery_singleton_lock.celery.config.servers import close_client, make_client
from celery_singleton_lock.engine import Lease, RedisLocker, Renewer
from tests.engine.conftest import FakeClock
from tests.sentinel_topology import SentinelGroup

TTL = 60.0


@dataclass
class Observed:
    """What the locker did across the failover."""

    before: Lease
    during: Lease
    during_on_old_master: bool = False
    during_on_new_master: bool = True
    lost_callbacks: list[str] = field(default_factory=list)
    before_ttl_on_new_master: int = -2
    released: bool = False
    before_left_on_new_master: bool = True
    after: Any = None
    after_on_new_master: bool = False
    retaken: Any = None


@pytest.fixture(scope="module")
def failover() -> Iterator[Observed]:
    with SentinelGroup.running() as group:
        # redis-py's master_for client, as the Celery layer makes it
        client = make_client(group.url, {}, group.transport_options)
        clock = FakeClock()
        locker = RedisLocker(client, prefix="t", renewer=Renewer(clock=clock, autostart=False))
        before = locker.try_acquire("before", TTL)
        assert isinstance(before, Lease)
        clock.advance(TTL / 2)
        assert locker.renewer.run_once() is not None  # the pool's connection is warm too
        old = group.master()
        assert old.wait(1, 5000) == 1  # "before" is on the replica about to be promoted
        observed: dict[str, Any] = {}

        def on_the_old_master_only() -> None:
            # the kept connection still talks to the old master, which still takes writes
            during = locker.try_acquire("during", TTL)
            assert isinstance(during, Lease)
            during.on_lost(lambda lease: seen.lost_callbacks.append(lease.key))
            observed["during"] = during
            observed["on_old"] = bool(old.exists(during.key))

        switch = group.failover(during_switch=on_the_old_master_only)
        seen = Observed(before=before, during=observed["during"])
        seen.during_on_old_master = observed["on_old"]
        new = group.server(switch.new_port).client(socket_timeout=5)
        seen.during_on_new_master = bool(new.exists(seen.during.key))

        clock.advance(TTL / 2)
        locker.renewer.run_once()  # renews "before" and "during" in one round trip
        seen.before_ttl_on_new_master = int(new.pttl(before.key))
        seen.released = locker.release(before)
        seen.before_left_on_new_master = bool(new.exists(before.key))
        seen.after = locker.try_acquire("after", TTL)
        seen.after_on_new_master = bool(new.exists(locker.keys("after").lock))
        seen.retaken = locker.try_acquire("during", TTL)
        yield seen
        for plain in (old, new):
            plain.close()
        close_client(client)


def test_a_lease_written_on_the_old_master_during_the_switch_did_not_survive_it(
    failover: Observed,
) -> None:
    assert failover.during_on_old_master
    assert not failover.during_on_new_master


def test_a_lease_replicated_before_the_failover_is_renewed_on_the_new_master(
    failover: Observed,
) -> None:
    assert not failover.before.lost.is_set()
    assert failover.before_ttl_on_new_master > (TTL / 2) * 1000


def test_a_lease_replicated_before_the_failover_is_released_on_the_new_master(
    failover: Observed,
) -> None:
    assert failover.released
    assert not failover.before_left_on_new_master


def test_a_lease_whose_key_did_not_survive_is_reported_lost_at_the_next_renewal(
    failover: Observed,
) -> None:
    assert failover.during.lost.is_set()
    assert failover.lost_callbacks == [failover.during.key]


def test_a_kept_connection_to_the_demoted_master_follows_the_new_master(
    failover: Observed,
) -> None:
    # the acquire after the demotion ran on the connection that wrote "during" to the old
    # master: READONLY there made redis-py reconnect through the sentinels
    assert isinstance(failover.after, Lease)
    assert failover.after_on_new_master


def test_the_lock_of_a_lost_lease_can_be_taken_again_on_the_new_master(
    failover: Observed,
) -> None:
    # the hazard of asynchronous replication: two holders of "during", one on each master
    assert isinstance(failover.retaken, Lease)
