"""Acquire and release: one round trip each, owner metadata, compare-and-delete."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from celery_singleton_lock import AlreadyFinished
from celery_singleton_lock.engine import Lease, LockHolder, Owner, RedisLocker, Renewer
from celery_singleton_lock.engine.lua_scripts import source
from celery_singleton_lock.engine.waiting import subscribe_releases, wait_for_release
from celery_singleton_lock.testing import RedisServer
from tests.engine.conftest import finish_record, stored_fields, stored_token
from tests.support import CountingConnection, wait_until


def test_acquire_returns_a_lease_with_a_128_bit_token(locker: RedisLocker) -> None:
    lease = locker.try_acquire("job", ttl=5)
    assert isinstance(lease, Lease)
    assert len(bytes.fromhex(lease.token)) == 16


def test_tokens_differ_between_acquisitions(locker: RedisLocker) -> None:
    tokens = set()
    for _ in range(200):
        lease = locker.try_acquire("job", ttl=5, renew=False)
        assert isinstance(lease, Lease)
        tokens.add(lease.token)
        assert lease.release()
    assert len(tokens) == 200


def test_owner_metadata_is_stored_in_the_lock_itself(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    before = time.time()
    lease = locker.try_acquire("job", ttl=5, owner=Owner(task_id="t-1", host="w1", pid=42))
    assert isinstance(lease, Lease)
    fields = stored_fields(redis_client, locker.keys("job").lock)
    assert fields["token"] == lease.token.encode()
    assert fields["task_id"] == b"t-1"
    assert fields["host"] == b"w1"
    assert fields["pid"] == b"42"
    assert fields["fence"] == b""
    assert before * 1000 - 1 <= int(fields["acquired_at"]) <= time.time() * 1000 + 1


def test_second_acquire_reports_the_holder_and_its_remaining_ttl(locker: RedisLocker) -> None:
    locker.try_acquire("job", ttl=5, owner=Owner(task_id="first", host="w1", pid=7))
    holder = locker.try_acquire("job", ttl=5, owner=Owner(task_id="second"))
    assert isinstance(holder, LockHolder)
    assert (holder.task_id, holder.host, holder.pid) == ("first", "w1", 7)
    assert holder.ttl is not None and 4.0 < holder.ttl <= 5.0


def test_acquire_costs_one_round_trip(counting_client: redis.Redis) -> None:
    locker = RedisLocker(counting_client, prefix="t", renewer=Renewer(autostart=False))
    locker.try_acquire("warm-up", ttl=5)  # loads the script (NOSCRIPT fallback) once
    CountingConnection.reset()
    locker.try_acquire("job", ttl=5)
    assert CountingConnection.sent == ["EVALSHA"]


def test_release_costs_one_round_trip(counting_client: redis.Redis) -> None:
    locker = RedisLocker(counting_client, prefix="t", renewer=Renewer(autostart=False))
    locker.try_acquire("warm-up", ttl=5).release()  # type: ignore[union-attr]
    lease = locker.try_acquire("job", ttl=5)
    CountingConnection.reset()
    assert lease.release()  # type: ignore[union-attr]
    assert CountingConnection.sent == ["EVALSHA"]


def test_release_frees_the_lock(locker: RedisLocker, redis_client: redis.Redis) -> None:
    lease = locker.try_acquire("job", ttl=5)
    assert isinstance(lease, Lease)
    assert lease.release() is True
    assert not redis_client.exists(lease.key)


def test_release_twice_reports_not_owned_the_second_time(locker: RedisLocker) -> None:
    lease = locker.try_acquire("job", ttl=5)
    assert isinstance(lease, Lease)
    assert lease.release() is True
    assert lease.release() is False


def test_a_foreign_token_cannot_release(locker: RedisLocker, redis_client: redis.Redis) -> None:
    lease = locker.try_acquire("job", ttl=5)
    assert isinstance(lease, Lease)
    impostor = Lease(
        locker=locker,
        keys=lease.keys,
        token="0" * 32,
        ttl=5,
        owner=Owner(),
        fence=None,
        confirmed_at=0.0,
        deadline=None,
    )
    assert impostor.release() is False
    assert stored_token(redis_client, lease.key) == lease.token.encode()


def test_release_after_expiry_leaves_the_new_owners_lock_intact(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    first = locker.try_acquire("job", ttl=0.1, renew=False)
    assert isinstance(first, Lease)
    time.sleep(0.2)
    second = locker.try_acquire("job", ttl=5, owner=Owner(task_id="second"))
    assert isinstance(second, Lease)
    assert first.release() is False
    assert stored_token(redis_client, second.key) == second.token.encode()


def test_release_publishes_a_notification(locker: RedisLocker) -> None:
    lease = locker.try_acquire("job", ttl=5)
    assert isinstance(lease, Lease)
    pubsub = subscribe_releases(locker.client, locker.keys("job").channel)
    try:
        lease.release()
        assert wait_for_release(pubsub, timeout=2.0)
    finally:
        pubsub.close()


def publishes(client: redis.Redis) -> int:
    """PUBLISH calls the server has run (its own counter), scripts' included."""
    return int(client.info("commandstats").get("cmdstat_publish", {}).get("calls", 0))


def test_a_release_nobody_waits_for_publishes_nothing(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    lease = locker.try_acquire("job", ttl=5)
    assert isinstance(lease, Lease)
    assert lease.release() is True
    assert publishes(redis_client) == 0


def test_a_release_someone_waits_for_is_published_once(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    lease = locker.try_acquire("job", ttl=5)
    assert isinstance(lease, Lease)
    pubsub = subscribe_releases(locker.client, locker.keys("job").channel)
    try:
        wait_until(lambda: redis_client.pubsub_numsub(locker.keys("job").channel)[0][1] == 1, 5)
        lease.release()
        assert publishes(redis_client) == 1
    finally:
        pubsub.close()


def test_waiting_for_release_times_out_while_the_lock_is_held(locker: RedisLocker) -> None:
    locker.try_acquire("job", ttl=5)
    pubsub = subscribe_releases(locker.client, locker.keys("job").channel)
    try:
        assert wait_for_release(pubsub, timeout=0.2) is False
    finally:
        pubsub.close()


def test_ttl_is_set_on_acquire(locker: RedisLocker, redis_client: redis.Redis) -> None:
    lease = locker.try_acquire("job", ttl=2.5, renew=False)
    assert isinstance(lease, Lease)
    assert 2000 < redis_client.pttl(lease.key) <= 2500


def test_lock_frees_itself_after_its_ttl_without_renewal(locker: RedisLocker) -> None:
    locker.try_acquire("job", ttl=0.2, renew=False)
    time.sleep(0.3)
    assert isinstance(locker.try_acquire("job", ttl=5), Lease)


def test_keys_share_one_hash_tag(locker: RedisLocker) -> None:
    keys = locker.keys("task.name:abc")
    assert keys.lock == "t:{task.name:abc}"
    assert keys.channel.startswith(keys.lock) and keys.queued.startswith(keys.lock)


def test_a_resent_acquire_with_the_same_token_is_idempotent(redis_client: redis.Redis) -> None:
    """The script contract: a resend after a lost reply acquires again, with the same fence."""
    acquire = redis_client.register_script(source("acquire"))
    token = "a" * 32
    value = f"{token}||1700000000000|42|w1|t-1"
    assert acquire(keys=["t:{plain}"], args=[5000, value]) == 0
    assert acquire(keys=["t:{plain}"], args=[5000, value]) == 0
    fenced_keys = ["t:{fenced}", "t:fence", "t:finished", "t:{fenced}:queued"]
    fenced_args = ["1", "t-1", "", "0"]
    assert acquire(keys=fenced_keys, args=[5000, value, *fenced_args]) == 1
    stored = redis_client.get("t:{fenced}")
    assert acquire(keys=fenced_keys, args=[5000, value, *fenced_args]) == 1
    assert redis_client.get("t:{fenced}") == stored == f"{token}|1|1700000000000|42|w1|t-1".encode()
    assert redis_client.get("t:fence") == b"1"  # no fence burnt by the resend
    other = acquire(keys=fenced_keys, args=[5000, f"{'b' * 32}||1|2|w2|t-2", *fenced_args])
    pttl, holder = other.split(b"|", 1)  # someone else's token: the holder, without its token
    assert 0 < int(pttl) <= 5000 and holder == b"1|1700000000000|42|w1|t-1"


def test_separators_in_host_and_task_id_survive_the_round_trip(locker: RedisLocker) -> None:
    owner = Owner(task_id="a|b|%7C", host="node|1%25x", pid=5)
    lease = locker.try_acquire("job", ttl=5, owner=owner)
    assert isinstance(lease, Lease)
    holder = locker.try_acquire("job", ttl=5)
    assert isinstance(holder, LockHolder)
    assert (holder.task_id, holder.host, holder.pid) == ("a|b|%7C", "node|1%25x", 5)
    read = locker.inspect.read("job")
    assert read is not None and (read.task_id, read.host, read.pid) == ("a|b|%7C", "node|1%25x", 5)
    assert not locker.release_abandoned("job", task_id="a|b|%7C", host="node|1%x", pid=5)
    assert not locker.release_abandoned("job", task_id="a|b|", host="node|1%25x", pid=5)
    assert locker.release_abandoned("job", task_id="a|b|%7C", host="node|1%25x", pid=5)
    assert locker.inspect.read("job") is None


def test_a_lease_token_must_have_the_fixed_width(locker: RedisLocker) -> None:
    lease = locker.try_acquire("job", ttl=5, renew=False)
    assert isinstance(lease, Lease)
    with pytest.raises(ValueError, match="32 characters"):
        Lease(
            locker=locker,
            keys=lease.keys,
            token="abc",
            ttl=5,
            owner=Owner(),
            fence=None,
            confirmed_at=0.0,
            deadline=None,
        )


def test_lost_flag_reads_and_waits_like_an_event(locker: RedisLocker) -> None:
    lease = locker.try_acquire("job", ttl=5, renew=False)
    assert isinstance(lease, Lease)
    assert not lease.lost.is_set()
    assert lease.lost.wait(0.05) is False
    threading.Timer(0.1, lease.mark_lost, args=("test",)).start()
    assert lease.lost.wait(5.0) is True
    assert lease.lost.is_set() and not lease.held
    assert lease.lost.wait(0) is True


def test_scripts_are_loaded_again_after_a_script_flush(counting_client: redis.Redis) -> None:
    renewer = Renewer(autostart=False)
    locker = RedisLocker(counting_client, prefix="t", renewer=renewer)
    locker.try_acquire("warm-up", ttl=5).release()  # type: ignore[union-attr]
    counting_client.script_flush()  # e.g. a failover to a replica that never saw them
    CountingConnection.reset()
    lease = locker.try_acquire("job", ttl=5, fencing=True)
    assert isinstance(lease, Lease) and lease.fence == 1
    # NOSCRIPT, then redis-py's Script loads it (SCRIPT LOAD) and sends it again
    assert CountingConnection.sent == ["EVALSHA", "SCRIPT", "EVALSHA"]
    assert locker.renew_batch([lease], now=renewer.clock()) == []
    assert lease.release()
    CountingConnection.reset()
    assert isinstance(locker.try_acquire("job", ttl=5), Lease)
    assert CountingConnection.sent == ["EVALSHA"]


def test_a_release_that_remembers_records_the_task_id_for_at_least_that_long(
    locker: RedisLocker,
) -> None:
    lease = locker.try_acquire("job", ttl=5, owner=Owner(task_id="t-1", host="w1", pid=42))
    assert isinstance(lease, Lease)
    assert lease.release(remember_for=60)
    ttl = finish_record(locker, "t-1")
    assert ttl is not None and 59 < ttl <= 60


def test_a_plain_release_remembers_nothing(locker: RedisLocker) -> None:
    lease = locker.try_acquire("job", ttl=30, owner=Owner(task_id="t-1"))
    assert isinstance(lease, Lease) and lease.release()
    assert finish_record(locker, "t-1") is None


def test_a_release_of_a_lock_no_longer_ours_remembers_nothing(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    first = locker.try_acquire("job", ttl=30, owner=Owner(task_id="first"))
    assert isinstance(first, Lease)
    redis_client.delete(first.key)  # it expired, say
    second = locker.try_acquire("job", ttl=30, owner=Owner(task_id="second"))
    assert isinstance(second, Lease)
    assert first.release(remember_for=60) is False
    assert finish_record(locker, "first") is None
    assert redis_client.exists(second.key)


def test_an_owner_that_finished_takes_nothing_when_acquiring_unless_finished(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    owner = Owner(task_id="t-1")
    lease = locker.try_acquire("job", ttl=30, owner=owner)
    assert isinstance(lease, Lease) and lease.release(remember_for=60)
    with pytest.raises(AlreadyFinished) as info:
        locker.try_acquire("job", ttl=30, owner=owner, unless_finished=True, finished_ttl=60)
    assert "t-1" in str(info.value) and info.value.key == lease.key
    assert not redis_client.exists(lease.key)


def test_another_owner_acquires_unless_finished_as_usual(locker: RedisLocker) -> None:
    first = locker.try_acquire("job", ttl=30, owner=Owner(task_id="t-1"))
    assert isinstance(first, Lease) and first.release(remember_for=60)
    second = locker.try_acquire(
        "job", ttl=30, owner=Owner(task_id="t-2"), unless_finished=True, finished_ttl=60
    )
    assert isinstance(second, Lease) and second.fence is None


def test_unless_finished_still_reports_the_holder(locker: RedisLocker) -> None:
    holder = locker.try_acquire("job", ttl=30, owner=Owner(task_id="holder"))
    assert isinstance(holder, Lease)
    found = locker.try_acquire(
        "job", ttl=30, owner=Owner(task_id="t-2"), unless_finished=True, finished_ttl=60
    )
    assert isinstance(found, LockHolder) and found.task_id == "holder"


def test_unless_finished_with_fencing_hands_out_the_next_fence(locker: RedisLocker) -> None:
    first = locker.try_acquire("job", ttl=30, owner=Owner(task_id="t-1"), fencing=True)
    assert isinstance(first, Lease) and first.release()
    second = locker.try_acquire(
        "job",
        ttl=30,
        owner=Owner(task_id="t-2"),
        fencing=True,
        unless_finished=True,
        finished_ttl=60,
    )
    assert isinstance(second, Lease) and second.fence == (first.fence or 0) + 1


def test_the_finish_record_expires_after_its_time(locker: RedisLocker) -> None:
    owner = Owner(task_id="t-1")
    lease = locker.try_acquire("job", ttl=30, owner=owner)
    assert isinstance(lease, Lease) and lease.release(remember_for=0.2)
    wait_until(lambda: finish_record(locker, "t-1") is None, timeout=5)
    again = locker.try_acquire("job", ttl=30, owner=owner, unless_finished=True, finished_ttl=0.2)
    assert isinstance(again, Lease)


def test_a_release_after_a_script_flush_loads_the_script_and_releases(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    lease = locker.try_acquire("job", 30)
    assert isinstance(lease, Lease)
    redis_client.script_flush()  # e.g. a failover to a replica that never saw the scripts
    assert lease.release() is True
    assert not redis_client.exists(lease.key)


def test_a_release_after_the_server_lost_its_keys_reports_not_ours(
    redis_server: RedisServer,
) -> None:
    client = redis_server.client(socket_timeout=5, socket_connect_timeout=2)
    locker = RedisLocker(client, prefix="t", renewer=Renewer(autostart=False))
    lease = locker.try_acquire("job", 30, renew=False)
    assert isinstance(lease, Lease)
    redis_server.restart()  # keeps nothing: the lock is gone, the kept connection is dead
    assert lease.release() is False  # Redis answered: not ours (not "could not release")
