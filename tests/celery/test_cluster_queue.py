"""Policy ``queue`` on a Redis Cluster, from real prefork ``celery worker`` processes.

A real cluster of 3 primaries on loopback (tests/cluster_topology.py) holds the locks; broker,
results and the bodies' records are on a plain Redis server (tests/celery/test_cluster.py's
``ClusterServers``, here with the queue tasks on policy ``queue``). A call parked on a Cluster
marks its slot in the summary of due slots (``P:due-slots``, engine/slot_sweep.py), through
which a sweeper finds its lock at its next tick when its holder died or its pause ended.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Any, Iterator

import pytest
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

from celery_singleton_lock.testing import RedisServer
from tests.celery.tasks import limits, pausing, queueing
from tests.celery.test_cli import cli
from tests.celery.test_cluster import ClusterServers
from tests.celery.workers import (
    CeleryWorkerProcess,
    WorkerGroup,
    client_app,
    close_client,
    lock_key,
    unique,
    worker_group,
)
from tests.cluster_topology import ClusterGroup
from tests.support import wait_until

#: seconds a call may take to have run
RESULT_TIMEOUT = 60.0
#: the summary of due slots under the app's default prefix
SUMMARY = "singleton-lock:due-slots"


@dataclass
class Cluster:
    servers: ClusterServers
    client: Any  # the Celery app that sends and reads results
    records: redis.Redis
    locks: RedisCluster  # the cluster, read directly
    workers: list[CeleryWorkerProcess]

    @property
    def queue(self) -> str:
        return self.workers[0].queue

    def send(self, task: Any, *args: Any) -> Any:
        return self.client.send_task(task.name, args=args, queue=self.queue)

    def parked(self, task: Any, *args: Any) -> int:
        """How many calls are parked behind the lock of ``task(*args)``."""
        return int(self.locks.zcard(f"{lock_key(task, *args)}:parked"))

    def marked(self, task: Any, *args: Any) -> bool:
        """Whether the summary of due slots names the slot of the lock of ``task(*args)``."""
        slot = key_slot(lock_key(task, *args).encode())
        return self.locks.zscore(SUMMARY, str(slot)) is not None


@pytest.fixture(scope="module")
def group() -> Iterator[ClusterGroup]:
    with ClusterGroup.running() as group:
        yield group


@pytest.fixture(scope="module")
def plain() -> Iterator[RedisServer]:
    with RedisServer.running() as server:
        yield server


def cluster_of(group: ClusterGroup, plain: RedisServer, workers: WorkerGroup) -> Iterator[Cluster]:
    servers = workers.servers
    assert isinstance(servers, ClusterServers)
    client = client_app(servers)
    records = servers.records()
    locks = RedisCluster.from_url(group.url)
    try:
        # two workers on one queue: a call parked by one may be handed to the other
        started = workers.start(2, pool="prefork", concurrency=2, queue=unique("q"))
        yield Cluster(servers, client, records, locks, started)
    finally:
        locks.close()
        records.close()
        close_client(client)


@pytest.fixture(scope="module")
def cluster(group: ClusterGroup, plain: RedisServer, celery_app: Any) -> Iterator[Cluster]:
    servers = ClusterServers(broker_url=plain.url, lock=plain, group=group, queue_policy="queue")
    with worker_group(servers) as workers:
        yield from cluster_of(group, plain, workers)


@pytest.fixture
def own_cluster(group: ClusterGroup, plain: RedisServer, celery_app: Any) -> Iterator[Cluster]:
    """Workers of the test's own, for a test that kills one."""
    servers = ClusterServers(broker_url=plain.url, lock=plain, group=group, queue_policy="queue")
    with worker_group(servers) as workers:
        yield from cluster_of(group, plain, workers)


def test_parked_calls_of_a_queue_task_on_a_cluster_run_in_order_one_at_a_time(
    cluster: Cluster,
) -> None:
    key, task = unique("k"), queueing.gated_in_order
    results = []
    for index in range(4):  # one by one, each once the one before reached the lock
        results.append(cluster.send(task, key, index))
        if index == 0:  # it holds the lock at its gate until every other call is parked
            wait_until(lambda: cluster.records.llen(f"order:{key}") == 1, timeout=20)
        else:
            wait_until(lambda index=index: cluster.parked(task, key, 0) == index, timeout=20)
    cluster.records.rpush(f"gate:{key}", *["open"] * 4)
    assert [result.get(timeout=RESULT_TIMEOUT) for result in results] == list(range(4))
    assert cluster.records.lrange(f"order:{key}", 0, -1) == [str(i).encode() for i in range(4)]
    assert int(cluster.records.get(f"overlaps:{key}") or 0) == 0


def test_a_queue_task_with_a_limit_of_3_on_a_cluster_runs_3_at_once_and_each_call_once(
    cluster: Cluster,
) -> None:
    key, task = unique("k"), limits.limit3_queue
    # long enough for 3 bodies to overlap however late each worker process picks its call up;
    # 5 calls: 3 inside at once, 2 parked and handed on (2 rounds of bodies, not 3)
    results = [cluster.send(task, key, 4.0) for _ in range(5)]
    for result in results:
        result.get(timeout=RESULT_TIMEOUT)
    runs = [run.split(b"|")[0] for run in cluster.records.lrange(f"runs:{key}", 0, -1)]
    assert sorted(runs) == sorted(result.id.encode() for result in results)
    assert int(cluster.records.get(f"most:{key}") or 0) == 3


def test_a_timed_pause_on_a_cluster_wakes_its_parked_call_when_it_ends(cluster: Cluster) -> None:
    key, task = unique("k"), pausing.paused_queue_for
    assert cluster.servers.group is not None
    asked_at = time.time()
    done = cli("--url", cluster.servers.group.url, "pause", task.name, "--for", "3")
    assert done.returncode == 0, done.stderr
    result = cluster.send(task, key)
    result.get(timeout=RESULT_TIMEOUT)
    (run,) = cluster.records.lrange(f"runs:{key}", 0, -1)
    # after the pause's end (3 s after the command was sent at the latest; a parked call is
    # woken then, by the sweeper that the summary of due slots sends to its slot); 0.1 s for
    # the clocks' rounding to ms
    assert float(run.split(b"|")[2]) >= asked_at + 3.0 - 0.1


def test_a_parked_call_whose_holders_pool_child_was_killed_runs_on_a_cluster(
    cluster: Cluster,
) -> None:
    key, task = unique("k"), queueing.queued_in_order
    cluster.send(task, key, 0, 60.0)
    wait_until(lambda: cluster.records.llen(f"order:{key}") == 1, timeout=20)
    parked = cluster.send(task, key, 1)
    wait_until(lambda: cluster.parked(task, key, 0) == 1, timeout=20)
    (run,) = cluster.records.lrange(f"runs:{key}", 0, -1)
    os.kill(int(run.split(b"|")[1]), signal.SIGKILL)  # its worker's main process reclaims it
    assert parked.get(timeout=RESULT_TIMEOUT) == 1
    assert cluster.records.lrange(f"order:{key}", 0, -1) == [b"0", b"1"]


def test_a_parked_call_whose_holders_worker_was_killed_runs_after_the_ttl_on_a_cluster(
    own_cluster: Cluster,
) -> None:
    cluster, key, task = own_cluster, unique("k"), queueing.queued_in_order
    holding = cluster.send(task, key, 0, 60.0)  # lock_ttl=5: renewed while its worker lives
    wait_until(lambda: cluster.records.llen(f"order:{key}") == 1, timeout=20)
    parked = cluster.send(task, key, 1)
    wait_until(lambda: cluster.parked(task, key, 0) == 1, timeout=20)
    assert cluster.marked(task, key, 0)
    (run,) = cluster.records.lrange(f"runs:{key}", 0, -1)
    pid = int(run.split(b"|")[1])
    (holder,) = [worker for worker in cluster.workers if pid in worker.children()]
    holder.crash()  # kill -9 of the whole worker: its lock is left to its TTL
    killed_at = time.time()
    assert parked.get(timeout=RESULT_TIMEOUT) == 1  # handed on by the other worker's sweeper
    assert holding.state != "SUCCESS"
    started = float(cluster.records.lrange(f"runs:{key}", 0, -1)[1].split(b"|")[2])
    print(f"parked call started {started - killed_at:.2f}s after its holder's worker died")
