"""The live rule on a Redis Cluster, from a real prefork ``celery worker``: ``celery locks
pause`` / ``resume`` / ``limit`` against the cluster, and a body's
``self.request.lock.pause_for``, reach the calls of every key, whichever slot its lock lies in
(a copy of the rule per slot, engine live_rules.py).

A real cluster of 3 primaries on loopback (tests/cluster_topology.py) holds the locks; broker,
results and the bodies' records are on a plain Redis server (as in tests/celery/test_cluster.py,
whose workers run the queue tasks with policy ``retry``).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Iterator

import pytest
import redis
from celery.result import AsyncResult
from redis.crc import key_slot

from celery_singleton_lock.testing import RedisServer
from tests.celery.tasks import limits, pausing
from tests.celery.test_cli import cli, run_cli
from tests.celery.test_cluster import ClusterServers
from tests.celery.workers import (
    CeleryWorkerProcess,
    client_app,
    close_client,
    lock_key,
    unique,
    worker_group,
)
from tests.cluster_topology import ClusterGroup

#: seconds a call may take to have run (a retried one included)
RESULT_TIMEOUT = 60.0


@dataclasses.dataclass
class Cluster:
    worker: CeleryWorkerProcess
    client: Any  # the Celery app that sends and reads results
    records: redis.Redis
    group: ClusterGroup

    def send(self, task: Any, *args: Any) -> AsyncResult:
        return self.client.send_task(task.name, args=args, queue=self.worker.queue)

    def locks(self, *args: str) -> str:
        """``celery locks *args`` against the cluster, the real ``celery`` entry point; its
        output (it must succeed)."""
        done = run_cli("--url", self.group.url, *args)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def locks_here(self, *args: str) -> str:
        """:meth:`locks` run in this process (click's CliRunner): the same command, without
        the seconds a ``celery`` process takes to start on a loaded machine."""
        done = cli("--url", self.group.url, *args)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def starts(self, key: str) -> list[float]:
        """When each body of ``key`` started (the worker's clock, this machine's)."""
        return [float(run.split(b"|")[2]) for run in self.records.lrange(f"runs:{key}", 0, -1)]


@pytest.fixture(scope="module")
def cluster(celery_app: Any) -> Iterator[Cluster]:
    with ClusterGroup.running() as group, RedisServer.running() as plain:
        servers = ClusterServers(broker_url=plain.url, lock=plain, group=group)
        client = client_app(servers)
        records = servers.records()
        try:
            with worker_group(servers) as workers:
                (worker,) = workers.start(1, pool="prefork", concurrency=3)
                yield Cluster(worker, client, records, group)
        finally:
            records.close()
            close_client(client)


def undone_after(*command: str) -> Any:
    """A fixture that runs ``celery locks *command`` (in this process) after its test: the
    one rule the test set taken back (each write or delete of a rule is 16,384 copies)."""

    @pytest.fixture
    def undone(cluster: Cluster) -> Iterator[None]:
        yield
        cluster.locks_here(*command)

    return undone


skip_resumed = undone_after("resume", pausing.paused_skip.name)
api_resumed = undone_after("resume", pausing.rate_limited_api.name)
cap_reset = undone_after("limit", limits.limit3_skip.name, "--reset")


def keys_in_two_slots(task: Any) -> tuple[str, str]:
    """Two keys whose locks of ``task`` lie in different hash slots."""
    first = unique("k")
    for _ in itertools.repeat(None, 100):  # a collision is 1 in 16,384: bounded all the same
        second = unique("k")
        if key_slot(lock_key(task, first).encode()) != key_slot(lock_key(task, second).encode()):
            return first, second
    raise AssertionError("100 keys in the slot of the first")


def test_a_task_paused_on_a_cluster_has_its_call_skipped_with_reason_paused(
    cluster: Cluster, skip_resumed: None
) -> None:
    key = unique("k")
    cluster.locks("pause", pausing.paused_skip.name)
    result = cluster.send(pausing.paused_skip, key)
    with pytest.raises(Exception, match="paused until resumed") as raised:
        result.get(timeout=RESULT_TIMEOUT)
    assert raised.type.__name__ == "DuplicateTaskSkipped"
    assert cluster.starts(key) == []


def test_a_task_resumed_on_a_cluster_runs_its_next_call(
    cluster: Cluster, skip_resumed: None
) -> None:
    key = unique("k")
    cluster.locks_here("pause", pausing.paused_skip.name)
    cluster.locks_here("resume", pausing.paused_skip.name)
    cluster.send(pausing.paused_skip, key).get(timeout=RESULT_TIMEOUT)
    assert len(cluster.starts(key)) == 1


def test_pause_for_in_a_body_on_a_cluster_delays_the_start_of_a_key_in_another_slot(
    cluster: Cluster, api_resumed: None
) -> None:
    task = pausing.rate_limited_api  # policy retry on a cluster (ClusterServers)
    told, other = keys_in_two_slots(task)
    cluster.send(task, told, 5.0).get(timeout=RESULT_TIMEOUT)
    cluster.send(task, other).get(timeout=RESULT_TIMEOUT)
    (told_at,), (started,) = cluster.starts(told), cluster.starts(other)
    # the body records its start once pause_for has written every slot's copy (about 0.6 s
    # on loopback, docs/explanation/benchmarks.md): 2 s of margin for a loaded machine
    assert started - told_at >= 3.0


def test_a_live_cap_of_1_on_a_cluster_keeps_a_limit_3_task_to_one_body_at_once(
    cluster: Cluster, cap_reset: None
) -> None:
    key, task = unique("k"), limits.limit3_skip
    cluster.locks_here("limit", task.name, "1")
    results = [cluster.send(task, key, 2.0) for _ in range(3)]
    outcomes = [result.get(timeout=RESULT_TIMEOUT, propagate=False) for result in results]
    skipped = [o for o in outcomes if type(o).__name__ == "DuplicateTaskSkipped"]
    assert int(cluster.records.get(f"most:{key}") or 0) == 1
    assert skipped, outcomes  # the cap refused a call a limit of 3 would have let in
