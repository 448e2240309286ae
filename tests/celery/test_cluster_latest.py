"""The newest call wins on a Redis Cluster, from a real prefork ``celery worker``: ``replace``
keeps only the newest waiting call (with ``lock_debounce``, the newest of a burst runs once
at its due time, found by the sweeper from the summary of due slots), ``restart`` stops the
running call for it (cooperatively, and past ``lock_cancel_grace`` by terminating its pool
child), never two bodies of a key at once; nor when a ``kill -9`` comes while a restart is
under way (of the old call's pool child, of the whole worker that received the new call): the
newest call still runs exactly once.

A real cluster of 3 primaries on loopback (tests/cluster_topology.py) holds the locks; broker,
results and the bodies' records are on a plain Redis server (as in tests/celery/test_cluster.py).
The worker's bodies read their cancel flag themselves only once an hour (the fallback): a stop
reaches a cooperative body on the lock's shard channel (``SSUBSCRIBE``), or not before its end.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from typing import Any, Iterator

import pytest
import redis
from celery.exceptions import TaskRevokedError
from celery.result import AsyncResult

from celery_singleton_lock.testing import RedisServer
from tests.celery.tasks import restart
from tests.celery.test_cli import cli
from tests.celery.test_cluster import ClusterServers
from tests.celery.workers import CeleryWorkerProcess, client_app, close_client, unique, worker_group
from tests.cluster_topology import ClusterGroup
from tests.support import wait_until


@dataclasses.dataclass
class Cluster:
    worker: CeleryWorkerProcess
    client: Any  # the Celery app that sends and reads results
    records: redis.Redis
    locks: Any  # a RedisCluster client of the locks' cluster
    servers: ClusterServers

    def send(self, task: Any, *args: Any) -> AsyncResult:
        return self.client.send_task(task.name, args=args, queue=self.worker.queue)

    def listed(self, what: str, key: str) -> list[str]:
        entries = self.records.lrange(f"{what}:{key}", 0, -1)
        return [entry.decode().split("|")[0] for entry in entries]

    def overlaps(self, key: str) -> int:
        return int(self.records.get(f"overlaps:{key}") or 0)

    def waiting(self, lock: str) -> list[str]:
        return [entry.decode() for entry in self.locks.zrange(f"{lock}:parked", 0, -1)]


@pytest.fixture(scope="module")
def cluster(celery_app: Any) -> Iterator[Cluster]:
    with ClusterGroup.running() as group, RedisServer.running() as plain:
        servers = ClusterServers(broker_url=plain.url, lock=plain, group=group)
        hourly = HourlyReads(servers.broker_url, servers.lock, group=group)
        client = client_app(hourly)
        records = servers.records()
        locks = group.client()
        try:
            with worker_group(hourly) as workers:
                (worker,) = workers.start(1, pool="prefork", concurrency=2)
                yield Cluster(worker, client, records, locks, hourly)
        finally:
            locks.close()
            records.close()
            close_client(client)


@dataclasses.dataclass
class HourlyReads(ClusterServers):
    """The cluster's servers, with bodies that read their cancel flag once an hour."""

    def env(self, queue: str, **extra: str) -> dict[str, str]:
        return super().env(queue, CSL_CANCEL_POLL="3600", **extra)


def lock_of(task: Any, key: str) -> str:
    options = task.lock_options
    return f"{options.prefix}:{{{options.keyer.name((key,), {})}}}"


def restart_after_a_second(cluster: Cluster, task: Any, key: str, seconds: float) -> tuple:
    """v1, then v2 (a body of ``seconds``) sent 1 s after v1's body started; v2 ran."""
    v1 = cluster.send(task, key)
    wait_until(lambda: cluster.listed("started", key) == [v1.id], timeout=60)
    time.sleep(1)
    sent = time.monotonic()
    v2 = cluster.send(task, key, seconds)
    assert v2.get(timeout=60) == v2.id
    took = time.monotonic() - sent
    print(f"\n{task.name} on a Cluster: v2 ran to its end {took:.2f}s after it was sent")
    return v1, v2, took


def assert_superseded_then_alone(cluster: Cluster, key: str, v1: Any, v2: Any) -> None:
    with pytest.raises(TaskRevokedError, match="superseded"):
        v1.get(timeout=30)
    assert cluster.listed("started", key) == [v1.id, v2.id]
    assert cluster.listed("ended", key) == [v2.id]
    assert cluster.overlaps(key) == 0


def test_replace_on_a_cluster_keeps_only_the_newest_waiting_call(cluster: Cluster) -> None:
    key = unique("r")
    lock = lock_of(restart.newest_waits, key)
    v1 = cluster.send(restart.newest_waits, key, 3.0)
    wait_until(lambda: cluster.listed("started", key) == [v1.id], timeout=60)
    waiting = []
    for _ in range(3):  # each sent once the one before waits behind the lock
        call = cluster.send(restart.newest_waits, key)
        wait_until(lambda c=call: cluster.waiting(lock) == [c.id], timeout=30)
        waiting.append(call)
    assert waiting[-1].get(timeout=60) == waiting[-1].id
    assert v1.get(timeout=30) == v1.id  # the running call ran to its end
    for displaced in waiting[:-1]:
        with pytest.raises(TaskRevokedError, match="superseded"):
            displaced.get(timeout=30)
    assert cluster.listed("started", key) == [v1.id, waiting[-1].id]
    assert cluster.overlaps(key) == 0


@dataclasses.dataclass
class Burst:
    """Three calls of ``restart.debounced`` on ``key``, each sent once the one before waits
    (its debounce starts again): the newest came between ``sent`` and ``waits``."""

    key: str
    calls: list[AsyncResult]
    sent: float
    waits: float

    @classmethod
    def send(cls, cluster: Cluster) -> Burst:
        key = unique("d")
        lock = lock_of(restart.debounced, key)
        calls, sent = [], 0.0
        for _ in range(3):
            sent = time.time()
            call = cluster.send(restart.debounced, key)
            wait_until(lambda c=call: cluster.waiting(lock) == [c.id], timeout=30)
            calls.append(call)
        return cls(key, calls, sent, time.time())


def test_debounced_bursts_on_a_cluster_run_their_newest_call_once_at_its_due_time(
    cluster: Cluster,
) -> None:
    # three keys (three slots): the rotation alone would read a slot 0 to 16 ticks after its
    # call is due, all three within 4 s of it about once in 60 runs; from the summary of due
    # slots each is read at the sweeper's next tick (1 s)
    bursts = [Burst.send(cluster) for _ in range(3)]
    late = []
    for burst in bursts:
        *displaced, newest = burst.calls
        assert newest.get(timeout=60) == newest.id
        for call in displaced:
            with pytest.raises(TaskRevokedError, match="superseded"):
                call.get(timeout=30)
        assert cluster.listed("started", burst.key) == [newest.id]
        (ran_at,) = (float(at) for at in cluster.records.lrange(f"ran-at:{burst.key}", 0, -1))
        assert ran_at >= burst.sent + 2  # not before its due time
        late.append(ran_at - (burst.waits + 2))
    print(f"\ndebounced on a Cluster: ran at most {max(late):.2f}s after its due time")
    assert max(late) < 4


def test_a_cooperative_call_on_a_cluster_is_stopped_by_the_push_for_the_newest(
    cluster: Cluster,
) -> None:
    key = unique("c")
    v1, v2, took = restart_after_a_second(cluster, restart.cooperative, key, 1.0)
    assert_superseded_then_alone(cluster, key, v1, v2)
    assert cluster.listed("stopped", key) == [v1.id]  # it saw lock.cancelled: pushed
    assert took < 15  # v1 ran on to its 20 s end otherwise


def test_a_call_that_ignores_the_stop_on_a_cluster_has_its_child_terminated_after_the_grace(
    cluster: Cluster,
) -> None:
    key = unique("s")
    v1, v2, took = restart_after_a_second(cluster, restart.stubborn, key, 0.5)
    assert took < 20  # v1's 30 s body ended otherwise
    assert_superseded_then_alone(cluster, key, v1, v2)


@pytest.fixture
def pair(cluster: Cluster) -> Iterator[list[CeleryWorkerProcess]]:
    """Two prefork workers on one queue of their own; a killed worker's reserved messages come
    back within 2 s (a short visibility timeout)."""
    servers = dataclasses.replace(cluster.servers, visibility_timeout=2)
    with worker_group(servers) as group:
        yield group.start(2, queue=unique("q"), pool="prefork", concurrency=2)


def new_call_waits(cluster: Cluster, task: Any, key: str, queue: str) -> tuple[Any, Any]:
    """v1 running, then v2 sent, parked behind it, and v1 asked to stop (the restart under
    way)."""
    lock = lock_of(task, key)
    v1 = cluster.client.send_task(task.name, args=(key,), queue=queue)
    wait_until(lambda: cluster.listed("started", key) == [v1.id], timeout=60)
    v2 = cluster.client.send_task(task.name, args=(key, 0.5), queue=queue)
    wait_until(lambda: cluster.waiting(lock) == [v2.id], timeout=30)
    wait_until(lambda: cluster.locks.get(f"{lock}:cancel") == v1.id.encode(), timeout=30)
    return v1, v2


def test_the_old_calls_child_killed_on_a_cluster_during_the_grace_lets_the_new_call_run_once(
    cluster: Cluster, pair: list[CeleryWorkerProcess]
) -> None:
    key = unique("k")
    v1, v2 = new_call_waits(cluster, restart.stubborn, key, pair[0].queue)
    v1_pid = int(cluster.records.lindex(f"started:{key}", 0).decode().rsplit("|", 1)[1])
    os.kill(v1_pid, signal.SIGKILL)  # before its 1 s grace ends
    assert v2.get(timeout=60) == v2.id
    assert cluster.listed("started", key) == [v1.id, v2.id]
    assert cluster.listed("ended", key) == [v2.id]
    assert cluster.overlaps(key) == 0


def test_the_new_calls_worker_killed_on_a_cluster_after_it_parked_the_call_lets_it_run_once(
    cluster: Cluster, pair: list[CeleryWorkerProcess]
) -> None:
    key = unique("k")
    v1, v2 = new_call_waits(cluster, restart.short_ttl, key, pair[0].queue)
    (receiver,) = [worker for worker in pair if v2.id in worker.log()]
    receiver.crash()  # kill -9 of its whole process group (v1 too, if it ran there)
    # v1's lock, if it died with it, expires (3 s) and a sweeper finds it within a pass of
    # the slots (16 ticks of 1 s)
    assert v2.get(timeout=90) == v2.id
    assert cluster.listed("started", key) == [v1.id, v2.id]  # v2 ran once
    assert cluster.overlaps(key) == 0


def test_a_finished_replace_call_sent_again_on_a_cluster_is_not_run_again(
    cluster: Cluster,
) -> None:
    key = unique("f")
    v1 = cluster.send(restart.newest_waits, key)
    assert v1.get(timeout=60) == v1.id
    # the same message again, unmarked (no redelivery flag, no copy header): only the finish
    # record the release wrote under the lock tells the worker it ran to the end
    cluster.client.send_task(
        restart.newest_waits.name, args=(key,), queue=cluster.worker.queue, task_id=v1.id
    )
    ran = f"[{v1.id}]: not run: this task id already ran"
    wait_until(lambda: ran in cluster.worker.log(), timeout=30)
    assert cluster.listed("started", key) == [v1.id]


@pytest.fixture
def paused(cluster: Cluster) -> Iterator[Any]:
    """``restart.newest_waits`` paused on the cluster (``celery locks pause``, run in this
    process); resumed after."""
    task = restart.newest_waits
    url = cluster.servers.group.url  # type: ignore[union-attr]
    assert cli("--url", url, "pause", task.name).returncode == 0
    yield lambda: cli("--url", url, "resume", task.name)
    cli("--url", url, "resume", task.name)


def test_a_paused_replace_task_on_a_cluster_starts_nothing_until_resumed(
    cluster: Cluster, paused: Any
) -> None:
    key = unique("p")
    v1 = cluster.send(restart.newest_waits, key)
    wait_until(lambda: cluster.waiting(lock_of(restart.newest_waits, key)) == [v1.id], timeout=30)
    assert cluster.listed("started", key) == []
    assert paused().returncode == 0
    assert v1.get(timeout=60) == v1.id  # handed the lock by a sweeper once resumed
