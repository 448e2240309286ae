"""A RedisLocker on redis-py's RedisCluster client, on a real 3-primary cluster on loopback.

One cluster (tests/cluster_topology.py) for the module; each test takes its own lock names.
The client is the one the Celery layer makes (``lock_server.make_client``), with a connection
class that counts round trips (one per packed send: a pipeline to one node counts once).
"""

from __future__ import annotations

import itertools
from typing import Iterator, Union

import pytest
import redis
from celery import Celery
from redis.cluster import RedisCluster
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from celery_singleton_lock.celery.config.lockers import forget_locker, locker_for
from celery_singleton_lock.celery.config.servers import close_client, make_client
from celery_singleton_lock.engine import Latest, Lease, LockHolder, Parked, RedisLocker, Renewer
from celery_singleton_lock.engine.acquire_request import AcquireRequest
from celery_singleton_lock.engine.kinds.cancels import cancel_channel
from celery_singleton_lock.engine.lease import Owner, as_text
from celery_singleton_lock.engine.slot_sweep import WINDOW
from celery_singleton_lock.engine.waiting import subscribe_releases, wait_for_release
from celery_singleton_lock.errors import (
    AlreadyFinished,
    LockBackendUnavailable,
    LockConfigurationError,
)
from celery_singleton_lock.testing import RedisServer, free_port
from tests.celery.test_cli import cli, run_cli
from tests.cluster_topology import ClusterGroup
from tests.engine.conftest import FakeClock
from tests.support import CountingConnection, wait_until

TTL = 60.0
_names = itertools.count()


def fresh(prefix: str) -> str:
    """A lock name no other test of the module uses."""
    return f"{prefix}-{next(_names)}"


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterGroup]:
    with ClusterGroup.running() as group:
        yield group


@pytest.fixture
def client(cluster: ClusterGroup) -> Iterator[RedisCluster]:
    made = make_client(cluster.url, {"connection_class": CountingConnection}, cluster=None)
    assert isinstance(made, RedisCluster)
    yield made
    close_client(made)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def locker(client: RedisCluster, clock: FakeClock) -> Iterator[RedisLocker]:
    made = RedisLocker(client, prefix="t", renewer=Renewer(clock=clock, autostart=False))
    yield made
    made.cancels.close()  # a listener of cancel channels ends (the client is closed apart)


def take(locker: RedisLocker, name: str, **kwargs: object) -> Lease:
    lease = locker.try_acquire(name, TTL, **kwargs)  # type: ignore[arg-type]
    assert isinstance(lease, Lease)
    return lease


def holding_node(cluster: ClusterGroup, key: str) -> int:
    """The port of the primary that holds ``key``."""
    for port in cluster.primary_ports():
        node = cluster.node(port)
        try:
            if node.exists(key):
                return port
        except redis.exceptions.ResponseError:  # MOVED: not this node's slot
            continue
        finally:
            node.close()
    raise AssertionError(f"no primary holds {key}")


def test_the_url_of_one_node_gives_a_cluster_client(cluster: ClusterGroup) -> None:
    client = make_client(cluster.url, {}, cluster=None)
    try:
        assert isinstance(client, RedisCluster)
    finally:
        close_client(client)


def test_the_url_of_a_single_server_gives_a_plain_client(redis_server: RedisServer) -> None:
    client = make_client(redis_server.url, {}, cluster=None)
    try:
        assert type(client) is redis.Redis
    finally:
        close_client(client)


def test_acquire_on_a_cluster_refuses_a_second_owner(locker: RedisLocker) -> None:
    name = fresh("a")
    take(locker, name)
    assert isinstance(locker.try_acquire(name, TTL), LockHolder)


def test_release_on_a_cluster_frees_the_lock(locker: RedisLocker) -> None:
    name = fresh("r")
    assert locker.release(take(locker, name)) is True
    assert locker.inspect.read(name) is None
    assert isinstance(locker.try_acquire(name, TTL), Lease)


def test_fencing_on_a_cluster_counts_up_per_lock(locker: RedisLocker) -> None:
    name = fresh("f")
    first = take(locker, name, fencing=True)
    locker.release(first)
    second = take(locker, name, fencing=True)
    assert (first.fence, second.fence) == (1, 2)
    assert locker.inspect.fence(name) == 2


def test_lock_keys_spread_over_every_primary(cluster: ClusterGroup, locker: RedisLocker) -> None:
    leases = [take(locker, fresh("spread")) for _ in range(30)]
    nodes = {holding_node(cluster, lease.key) for lease in leases}
    assert nodes == set(cluster.primary_ports())


def test_the_inspector_scans_the_locks_of_every_primary(locker: RedisLocker) -> None:
    leases = [take(locker, fresh("scan")) for _ in range(40)]
    found = {holder.key for holder in locker.inspect.scan(count=7)}
    assert {lease.key for lease in leases} <= found


def test_renewal_of_200_leases_takes_one_round_trip_per_primary(
    cluster: ClusterGroup, client: RedisCluster, locker: RedisLocker, clock: FakeClock
) -> None:
    leases = [take(locker, fresh("many")) for _ in range(200)]
    clock.advance(TTL / 2)
    locker.renewer.run_once()  # the first tick also loads the script on every primary
    for lease in leases:
        client.pexpire(lease.key, 5000)  # the counted tick must replace these TTLs
    clock.advance(TTL / 2)
    CountingConnection.reset()
    locker.renewer.run_once()
    assert len(CountingConnection.sent) <= len(cluster.primary_ports())
    assert min(client.pttl(lease.key) for lease in leases) > 5000


def test_renewal_on_a_cluster_reports_a_deleted_key_lost(
    client: RedisCluster, locker: RedisLocker, clock: FakeClock
) -> None:
    kept, gone = take(locker, fresh("kept")), take(locker, fresh("gone"))
    client.delete(gone.key)
    clock.advance(TTL / 2)
    locker.renewer.run_once()
    assert (kept.lost.is_set(), gone.lost.is_set()) == (False, True)


def test_renewal_on_a_cluster_loads_scripts_a_node_forgot(
    cluster: ClusterGroup, client: RedisCluster, locker: RedisLocker, clock: FakeClock
) -> None:
    leases = [take(locker, fresh("noscript")) for _ in range(12)]
    for port in cluster.primary_ports():  # as after a failover to a replica, or a restart
        node = cluster.node(port)
        node.script_flush()
        node.close()
    clock.advance(TTL / 2)
    locker.renewer.run_once()
    assert [lease.lost.is_set() for lease in leases] == [False] * len(leases)


def test_renew_by_owner_on_a_cluster_names_the_locks_not_renewed(
    client: RedisCluster, locker: RedisLocker
) -> None:
    owner = Owner(task_id="t1", host="h", pid=7)
    names = [fresh("owner") for _ in range(6)]
    for name in names:
        take(locker, name, owner=owner)
    client.delete(locker.keys(names[2]).lock)
    held = [(name, owner, TTL) for name in names] + [(names[0], Owner(task_id="x"), TTL)]
    assert locker.renew_by_owner(held) == [2, 6]


def test_the_celery_locks_command_lists_the_locks_of_every_primary(
    cluster: ClusterGroup, client: RedisCluster
) -> None:
    locker = RedisLocker(client, renewer=Renewer(autostart=False))  # the default prefix
    names = [fresh("app.job") for _ in range(9)]
    for name in names:
        locker.try_acquire(name, TTL, owner=Owner(task_id=name, host="w", pid=1))
    result = run_cli("--url", cluster.url, "list")
    assert result.returncode == 0, result.stderr
    assert all(f"singleton-lock:{{{name}}}  task={name}" in result.stdout for name in names)


def test_fences_on_a_cluster_increase_per_lock_with_one_counter_per_slot(
    locker: RedisLocker, client: RedisCluster
) -> None:
    names = [fresh("many") for _ in range(200)]
    firsts = {}
    for name in names:
        lease = take(locker, name, fencing=True)
        firsts[name] = lease.fence
        locker.release(lease)
    for name in names:
        lease = take(locker, name, fencing=True)
        assert lease.fence is not None and lease.fence > (firsts[name] or 0)
        locker.release(lease)
    counters = set(client.scan_iter(match="t:fence:*"))
    slots = {key_slot(locker.keys(name).lock.encode()) for name in names}
    assert len(counters) <= len(slots) + 20  # other tests' slots; never one per name
    assert not set(client.scan_iter(match="t:{many-*}:fence"))


def test_a_finish_record_on_a_cluster_drops_the_redelivered_copy(locker: RedisLocker) -> None:
    name, owner = fresh("done"), Owner(task_id="t-1")
    assert locker.release(take(locker, name, owner=owner), remember_for=60)
    with pytest.raises(AlreadyFinished):
        locker.try_acquire(name, TTL, owner=owner, unless_finished=True, finished_ttl=60)


def test_singleton_lock_cluster_false_gives_a_plain_client(cluster: ClusterGroup) -> None:
    app = Celery(set_as_current=False)
    app.conf.update(singleton_lock_url=cluster.url, singleton_lock_cluster=False)
    try:
        assert type(locker_for(app).client) is redis.Redis
    finally:
        forget_locker(app)


def test_singleton_lock_cluster_must_be_a_boolean_or_none() -> None:
    app = Celery(set_as_current=False)
    app.conf.update(singleton_lock_url="redis://127.0.0.1:1/0", singleton_lock_cluster="yes")
    with pytest.raises(LockConfigurationError, match="singleton_lock_cluster must be True"):
        locker_for(app)


def test_an_unreachable_server_is_asked_again_at_the_next_use() -> None:
    app = Celery(set_as_current=False)
    app.conf.update(singleton_lock_url=f"redis://127.0.0.1:{free_port()}/0")
    for _ in range(2):
        with pytest.raises(LockBackendUnavailable, match="unavailable when first contacted"):
            locker_for(app)


def test_a_release_on_a_cluster_wakes_a_waiter(locker: RedisLocker, client: RedisCluster) -> None:
    lease = take(locker, fresh("wait"))
    pubsub = subscribe_releases(client, lease.keys.channel)
    try:
        locker.release(lease)
        assert wait_for_release(pubsub, timeout=10) is True
    finally:
        pubsub.close()


def test_a_server_that_refuses_info_is_taken_for_a_single_server(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with RedisServer(extra_args=["--rename-command", "INFO", ""]) as server:
        client = make_client(server.url, {}, cluster=None)
        try:
            assert type(client) is redis.Redis
        finally:
            close_client(client)
    assert "set singleton_lock_cluster = True if it is a node" in caplog.text


def test_an_acquire_asking_for_what_a_cluster_lacks_is_refused_naming_it(
    locker: RedisLocker,
) -> None:
    with pytest.raises(LockConfigurationError, match=r"lock_min_replicas.*Redis Cluster"):
        locker.try_acquire(fresh("refused"), TTL, owner=Owner(task_id="t-1"), min_replicas=1)


def test_a_cluster_keeps_no_held_index_and_scan_still_lists_its_locks(
    locker: RedisLocker, client: RedisCluster
) -> None:
    lease = take(locker, fresh("held"), renew=False)
    listed = [holder.key for holder in locker.inspect.scan() if holder.key == lease.key]
    assert (listed, client.exists("t:held")) == ([lease.key], 0)


@pytest.mark.skipif(
    not hasattr(redis.cluster.ClusterPubSub, "ssubscribe"),
    reason="sharded pub/sub (SSUBSCRIBE) needs redis-py >= 5: the body reads the flag instead",
)
def test_a_stop_asked_on_a_cluster_reaches_the_running_call_on_its_shard_channel(
    locker: RedisLocker, cluster: ClusterGroup
) -> None:
    name = fresh("restart")
    take(locker, name, owner=Owner(task_id="v1"))
    cancels = locker.cancels
    assert cancels is not None  # the flag and its channel share the lock's slot
    signal = cancels.watch(name, "v1")
    channel = cancel_channel(locker.keys(name))
    node = cluster.node(holding_node(cluster, locker.keys(name).lock))

    def shard_subscribed() -> bool:
        counts = {as_text(name): count for name, count in node.pubsub_shardnumsub(channel)}
        return bool(counts.get(channel))

    watch = cancels.watching
    assert watch is not None
    wait_until(lambda: watch.confirmed == 1)
    assert shard_subscribed()  # SSUBSCRIBE, on the node of the lock's slot
    assert cancels.cancel_holder(name, by="v2") == "v1"
    wait_until(lambda: signal.asked)
    assert (watch.pushed, watch.read) == (1, 0)
    cancels.unwatch(signal)
    wait_until(lambda: not shard_subscribed())


def newest(
    locker: RedisLocker, name: str, task_id: str, **kwargs: object
) -> Union[Lease, LockHolder, Parked]:
    """An acquire of ``name`` by ``task_id`` whose newest call wins (``replace``)."""
    return locker.try_acquire(  # type: ignore[misc]
        name,
        TTL,
        owner=Owner(task_id=task_id),
        park=f"{task_id}\nmsg".encode(),
        reservation_ttl=30,
        latest=Latest(),
        **kwargs,  # type: ignore[arg-type]
    )


def test_the_newest_call_waits_alone_on_a_cluster_and_is_handed_the_lock(
    locker: RedisLocker,
) -> None:
    name = fresh("latest")
    v1 = newest(locker, name, "v1")
    assert isinstance(v1, Lease)
    assert isinstance(newest(locker, name, "v2"), Parked)
    v3 = newest(locker, name, "v3")
    assert isinstance(v3, Parked) and v3.displaced == (b"v2\nmsg",)
    assert locker.latest is not None
    assert locker.latest.release_latest(v1, reservation_ttl=30) == (True, b"v3\nmsg")


def test_a_finished_replace_call_on_a_cluster_is_refused_when_redelivered(
    locker: RedisLocker,
) -> None:
    name = fresh("latest-done")
    done = dict(unless_finished=True, finished_ttl=60)
    lease = newest(locker, name, "v1", **done)
    assert isinstance(lease, Lease)
    assert locker.latest is not None
    assert locker.latest.release_latest(lease, reservation_ttl=30, remember_for=60) == (True, None)
    with pytest.raises(AlreadyFinished):
        newest(locker, name, "v1", **done)


def test_a_replace_call_on_a_cluster_writes_no_lock_into_the_finish_record_set(
    locker: RedisLocker, client: RedisCluster
) -> None:
    name = fresh("latest-records")
    lock = locker.keys(name).lock
    assert isinstance(newest(locker, name, "v1", unless_finished=True, finished_ttl=60), Lease)
    assert client.zscore(locker.shared.of(lock, "v1")[1], lock) is None


def test_a_paused_replace_task_on_a_cluster_starts_nothing_until_resumed(
    locker: RedisLocker,
) -> None:
    family = fresh("latest-paused")
    cap = f"t:cap:{family}"
    locker.live_rules.pause(family, None)
    (name,) = in_slots(family, 1)
    waits = newest(locker, name, "v1", cap_key=cap)
    assert isinstance(waits, Parked) and waits.paused
    locker.live_rules.resume(family)
    queue = locker.queue
    assert queue is not None
    assert queue.hand_on(name, reservation_ttl=30) == [b"v1\nmsg"]
    assert isinstance(newest(locker, name, "v1", cap_key=cap), Lease)


def test_a_replace_acquire_on_a_cluster_names_the_rules_copy_in_its_own_slot(
    locker: RedisLocker,
) -> None:
    family = fresh("latest-slot")
    (name,) = in_slots(family, 1)
    assert locker.latest is not None
    keys, _ = locker.latest.acquire_call(
        AcquireRequest(name, TTL, cap_key=f"t:cap:{family}", latest=Latest(), park=b"m"),
        locker.keys(name),
        "v",
        Owner(task_id="v1"),
    )
    assert f"t:cap:{family}:{{" in " ".join(keys)
    assert len({key_slot(key.encode()) for key in keys}) == 1


def test_a_sweeper_finds_the_lock_of_a_dead_holder_on_a_cluster_within_a_pass_of_the_slots(
    locker: RedisLocker, client: RedisCluster
) -> None:
    name = fresh("latest")
    assert isinstance(newest(locker, name, "v1"), Lease)
    assert isinstance(newest(locker, name, "v2"), Parked)
    lock = locker.keys(name).lock
    client.delete(lock)  # its holder died, and its TTL ran out: due in its slot's index now
    client.zadd(locker.shared.handoff_index(lock), {name: 0})
    # as if the worker that parked v2 died before it marked the slot in the summary of due
    # slots (which a sweep reads at every tick): only the rotation finds the lock
    client.zrem("t:due-slots", str(key_slot(lock.encode())))
    queue = locker.queue
    assert queue is not None
    seen: list[str] = []
    for _ in range(REDIS_CLUSTER_HASH_SLOTS // WINDOW + 1):  # one pass over the slots
        seen += queue.hand_off_due().names
    assert seen.count(name) == 1
    assert queue.hand_on(name, reservation_ttl=30) == [b"v2\nmsg"]


def test_a_sweeper_finds_the_displaced_calls_left_to_mark_on_a_cluster(
    locker: RedisLocker, client: RedisCluster
) -> None:
    name = fresh("latest")
    assert isinstance(newest(locker, name, "v1"), Lease)
    newest(locker, name, "v2")
    newest(locker, name, "v3")  # displaces v2, left to mark by its worker
    index = locker.shared.superseded_index(locker.keys(name).lock)
    client.zadd(index, {name: 0})  # as if that worker died: the grace is over
    latest = locker.latest
    assert latest is not None
    left: list[tuple[str, list[bytes]]] = []
    for _ in range(REDIS_CLUSTER_HASH_SLOTS // WINDOW + 1):
        left += latest.superseded_left()
    # earlier tests' displaced calls, in the module's cluster, may be past their grace too
    assert [(found, calls) for found, calls in left if found == name] == [(name, [b"v2\nmsg"])]
    assert latest.clear_superseded(name, ["v2"]) == 0
    assert client.zscore(index, name) is None


def in_slots(family: str, count: int) -> list[str]:
    """``count`` lock names of ``family`` whose keys (prefix "t") lie in as many slots."""
    names: dict[int, str] = {}
    for index in itertools.count():
        name = f"{family}:{index}"
        names.setdefault(key_slot(f"t:{{{name}}}".encode()), name)
        if len(names) == count:
            return list(names.values())
    raise AssertionError("unreachable")


def rule_copies(cluster: ClusterGroup, family: str) -> int:
    """How many copies of ``family``'s live rule (prefix "t") the primaries hold."""
    found = 0
    for port in cluster.primary_ports():
        node = cluster.node(port)
        try:
            found += sum(1 for _ in node.scan_iter(match=f"t:cap:{family}:*", count=1000))
        finally:
            node.close()
    return found


def test_a_live_cap_on_a_cluster_is_honoured_by_the_locks_of_every_slot(
    locker: RedisLocker,
) -> None:
    family = fresh("capped")
    locker.live_rules.set_cap(family, 1)
    for name in in_slots(family, 4):
        cap = f"t:cap:{family}"
        assert isinstance(locker.try_acquire(name, TTL, renew=False, limit=3, cap_key=cap), Lease)
        refused = locker.try_acquire(name, TTL, renew=False, limit=3, cap_key=cap)
        assert isinstance(refused, LockHolder), name


def test_a_live_cap_on_a_cluster_is_a_copy_in_each_of_the_16384_slots(
    cluster: ClusterGroup, locker: RedisLocker
) -> None:
    family = fresh("copies")
    locker.live_rules.set_cap(family, 2)
    assert rule_copies(cluster, family) == REDIS_CLUSTER_HASH_SLOTS


def test_a_live_cap_reset_on_a_cluster_deletes_every_copy(
    cluster: ClusterGroup, locker: RedisLocker
) -> None:
    family = fresh("reset")
    locker.live_rules.set_cap(family, 2)
    locker.live_rules.set_cap(family, None)
    assert rule_copies(cluster, family) == 0


def test_a_live_cap_on_a_cluster_reads_back_and_is_listed(locker: RedisLocker) -> None:
    family = fresh("listed")
    locker.live_rules.set_cap(family, 2)
    assert locker.live_rules.read(family) == (2, None)
    assert locker.live_rules.every()[family] == (2, None)


def test_a_pause_on_a_cluster_refuses_the_mutex_and_the_slots_of_every_slot(
    locker: RedisLocker,
) -> None:
    family = fresh("paused")
    cap = f"t:cap:{family}"
    locker.live_rules.pause(family, None)
    for name in in_slots(family, 4):
        mutex = locker.try_acquire(name, TTL, renew=False, cap_key=cap)
        slots = locker.try_acquire(f"{name}s", TTL, renew=False, limit=3, cap_key=cap)
        fenced = locker.try_acquire(f"{name}f", TTL, renew=False, fencing=True, cap_key=cap)
        for refused in (mutex, slots, fenced):
            assert isinstance(refused, LockHolder) and refused.paused, name


def test_resume_on_a_cluster_lets_the_locks_of_every_slot_be_taken(locker: RedisLocker) -> None:
    family = fresh("resumed")
    cap = f"t:cap:{family}"
    locker.live_rules.pause(family, None)
    locker.live_rules.resume(family)
    for name in in_slots(family, 4):
        assert isinstance(locker.try_acquire(name, TTL, renew=False, cap_key=cap), Lease)
        assert isinstance(
            locker.try_acquire(f"{name}s", TTL, renew=False, limit=3, cap_key=cap), Lease
        )


def test_a_lengthening_pause_on_a_cluster_never_shortens_a_longer_one(
    locker: RedisLocker,
) -> None:
    family = fresh("lengthen")
    long_end = locker.live_rules.pause(family, 60)
    assert locker.live_rules.pause(family, 1, lengthen=True) == long_end
    paused_for = locker.live_rules.read(family).paused_for
    assert paused_for is not None and paused_for > 50


def test_a_mutex_acquire_on_a_cluster_names_the_rules_copy_in_its_own_slot(
    client: RedisCluster, locker: RedisLocker
) -> None:
    family = fresh("slot")
    (name,) = in_slots(family, 1)
    keys, _ = locker.mutex._acquire_call(
        AcquireRequest(name, TTL, cap_key=f"t:cap:{family}"),
        locker.keys(name),
        "v",
        Owner(),
    )
    assert keys[-1].startswith(f"t:cap:{family}:{{")
    assert len({key_slot(key.encode()) for key in keys}) == 1


def locks(cluster: ClusterGroup, *args: str) -> str:
    """``celery locks *args`` against the cluster (prefix "t"), run in this process (the
    ``celery`` entry point is run by the test of ``list`` above); its output (it must
    succeed)."""
    done = cli("--url", cluster.url, "--prefix", "t", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_locks_pause_on_a_cluster_from_the_command_line_pauses_every_slot(
    cluster: ClusterGroup, locker: RedisLocker
) -> None:
    family = fresh("cli-pause")
    locks(cluster, "pause", family)
    for name in in_slots(family, 3):
        refused = locker.try_acquire(name, TTL, renew=False, cap_key=f"t:cap:{family}")
        assert isinstance(refused, LockHolder) and refused.paused


def test_locks_resume_on_a_cluster_from_the_command_line_ends_the_pause(
    cluster: ClusterGroup, locker: RedisLocker
) -> None:
    family = fresh("cli-resume")
    locks(cluster, "pause", family)
    locks(cluster, "resume", family)
    for name in in_slots(family, 3):
        assert isinstance(
            locker.try_acquire(name, TTL, renew=False, cap_key=f"t:cap:{family}"), Lease
        )


def test_locks_limit_on_a_cluster_from_the_command_line_caps_every_slot(
    cluster: ClusterGroup, locker: RedisLocker
) -> None:
    family = fresh("cli-limit")
    locks(cluster, "limit", family, "1")
    assert locker.live_rules.read(family).cap == 1
    name = in_slots(family, 1)[0]
    cap = f"t:cap:{family}"
    assert isinstance(locker.try_acquire(name, TTL, renew=False, limit=3, cap_key=cap), Lease)
    assert isinstance(locker.try_acquire(name, TTL, renew=False, limit=3, cap_key=cap), LockHolder)
