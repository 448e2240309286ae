"""Locks on a Redis Cluster from real prefork ``celery worker`` processes, and a failover.

A real cluster (3 primaries, a replica each, on loopback: tests/cluster_topology.py) holds the
locks, named by the URL of one node only (the workers find out it is a cluster); broker,
results and the bodies' records are on a plain Redis server of their own. 2 prefork workers
run ``short_ttl_retry`` calls (``on_duplicate="retry"``, ``lock_ttl=1``) over tens of keys;
every tenth body sleeps past the TTL, so it holds its lock only by renewal.

Three streams: a steady one (never two bodies of one key at once, asserted), one during which
a replica is promoted with ``CLUSTER FAILOVER`` (a manual failover: the replica catches up with
its primary before it takes over), and one during which a primary is SIGKILLed and its replica
elected after ``cluster-node-timeout`` (2 s here). For the last two the overlaps and the time to
the next acquire are reported, not asserted away: replication is asynchronous. Reduced size
by default; ``--full`` runs longer streams.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import pytest
import redis
from celery.result import AsyncResult

from celery_singleton_lock.testing import RedisServer
from tests.celery.streams import most_inside_at_once, ran, starts, wait_for
from tests.celery.tasks import expiry
from tests.celery.workers import LocksApart, client_app, close_client, unique, worker_group
from tests.chaos.conftest import chaos_figures  # noqa: F401 (fixture)
from tests.cluster_topology import ClusterGroup, Failover

#: Seconds every call may take to have run, after the last one was sent.
DRAIN_BUDGET = 120.0
LONG_BODY = 1.5  # seconds, past short_ttl_retry's lock_ttl of 1 s


@dataclass
class ClusterServers(LocksApart):
    """Locks on ``group``."""

    group: Optional[ClusterGroup] = None
    #: the policy of the queue tasks (tests/celery/tasks/queueing.py's QUEUE): "retry" for the
    #: streams of this module, "queue" where the queue on a Cluster is what is tested
    queue_policy: str = "retry"

    def lock_env(self) -> dict[str, str]:
        assert self.group is not None
        return {
            "CSL_LOCK_URL": self.group.url,
            "CSL_QUEUE_POLICY": self.queue_policy,
            "CSL_MIN_REPLICAS": "0",  # a Cluster refuses lock_min_replicas at worker start
        }


@dataclass
class Size:
    calls: int
    keys: int
    interval: float  # seconds between two sends


REDUCED = Size(calls=120, keys=12, interval=0.04)
FULL = Size(calls=600, keys=40, interval=0.03)


@dataclass
class Stream:
    sent: list[str]
    starts: list[tuple[float, str, str]]  # (time.time(), task id, key) of each body run
    overlaps: int
    states: dict[str, str]
    failover: Optional[Failover] = None

    def never_ran(self) -> list[str]:
        return sorted(set(self.sent) - {task_id for _, task_id, _ in self.starts})

    def not_succeeded(self) -> dict[str, str]:
        return {task_id: state for task_id, state in self.states.items() if state != "SUCCESS"}


@dataclass
class Run:
    steady: Stream
    failing_over: Stream
    crashing: Stream
    lock_keys_left: list[str]
    logs: str
    failover_error: Optional[Exception]
    #: bodies run of 4 calls of one key sent at once to a lock_limit=2 skip task
    limit_2_most_inside: int


@pytest.fixture(scope="module")
def run(request: pytest.FixtureRequest) -> Iterator[Run]:
    size = FULL if request.config.getoption("--full") else REDUCED
    with ClusterGroup.running(replicas=1) as group, RedisServer.running() as plain:
        servers = ClusterServers(
            broker_url=plain.url,
            lock=plain,
            group=group,
        )
        client = client_app(servers)
        records = servers.records()
        errors: list[Exception] = []
        try:
            with worker_group(servers) as workers:
                started = workers.start(2, pool="prefork", concurrency=2)
                queue = started[0].queue
                steady = send_stream(size, queue, client, records)
                failovers: list[Failover] = []
                crashes: list[Failover] = []

                def fail_over(
                    how: Callable[[], Failover], into: list[Failover]
                ) -> Callable[[], None]:
                    def run() -> None:
                        try:
                            into.append(how())
                        except (redis.RedisError, AssertionError, RuntimeError) as exc:
                            errors.append(exc)

                    return run

                failing_over = send_stream(
                    size,
                    queue,
                    client,
                    records,
                    during=fail_over(group.failover, failovers),
                    failovers=failovers,
                )
                crashing = send_stream(
                    size,
                    queue,
                    client,
                    records,
                    during=fail_over(group.crash_primary, crashes),
                    failovers=crashes,
                )
                limit_2_most_inside = most_inside_at_once(client, queue, records)
                cluster_client = group.client()
                try:
                    left = sorted(cluster_client.scan_iter(match="singleton-lock*", count=1000))
                finally:
                    cluster_client.close()
                yield Run(
                    steady=steady,
                    failing_over=failing_over,
                    crashing=crashing,
                    lock_keys_left=[key.decode() for key in left],
                    logs="\n".join(worker.log() for worker in started),
                    failover_error=errors[0] if errors else None,
                    limit_2_most_inside=limit_2_most_inside,
                )
        finally:
            records.close()
            close_client(client)


def send_stream(
    size: Size,
    queue: str,
    client: Any,
    records: redis.Redis,
    during: Any = None,
    failovers: Optional[list[Failover]] = None,
) -> Stream:
    keys = [unique("c") for _ in range(size.keys)]
    driver = threading.Thread(target=during or (lambda: None), name="failover", daemon=True)
    began = time.monotonic()
    sent: list[str] = []
    for index in range(size.calls):
        if index == size.calls // 3:
            driver.start()
        seconds = LONG_BODY if index % 10 == 0 else 0.05
        key = keys[index % len(keys)]
        sent.append(
            client.send_task(expiry.short_ttl_retry.name, args=(key, seconds), queue=queue).id
        )
        pause = began + (index + 1) * size.interval - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    driver.join(timeout=60)
    wait_for(lambda: set(sent) <= ran(records, keys), DRAIN_BUDGET)
    states: dict[str, str] = {}
    for _ in range(100):
        states = {task_id: AsyncResult(task_id, app=client).state for task_id in sent}
        if all(state in ("SUCCESS", "FAILURE") for state in states.values()):
            break
        time.sleep(0.2)
    return Stream(
        sent=sent,
        starts=sorted(starts(records, keys)),
        overlaps=sum(int(records.get(f"overlaps:{key}") or 0) for key in keys),
        states=states,
        failover=(failovers or [None])[0],
    )


def failover_figures(stream: Stream) -> dict[str, Any]:
    """Seconds from the failover's start to the replica saying it is a primary, to the next
    body start; the longest pause between two body starts around it; overlapping runs."""
    failover = stream.failover
    figures: dict[str, Any] = {"overlapping_runs": stream.overlaps}
    if failover is not None:
        starts = [started for started, _, _ in stream.starts]
        after = [t for t in starts if t > failover.asked_at]
        window = [t for t in starts if failover.asked_at - 1 <= t <= failover.promoted_at + 5]
        gaps = [b - a for a, b in zip(window, window[1:])]
        figures.update(
            promotion_s=round(failover.promoted_at - failover.asked_at, 2),
            next_acquire_s=round(after[0] - failover.asked_at, 2) if after else None,
            longest_pause_s=round(max(gaps), 2) if gaps else None,
        )
    return figures


def figures_of(run: Run) -> dict[str, Any]:
    streams = (run.steady, run.failing_over, run.crashing)
    return {
        "calls_per_stream": len(run.steady.sent),
        "keys_per_stream": len({key for _, _, key in run.steady.starts}),
        "steady_overlapping_runs": run.steady.overlaps,
        "manual_failover": failover_figures(run.failing_over),
        "primary_killed": failover_figures(run.crashing),
        "states": dict(Counter(state for s in streams for state in s.states.values())),
        "leases_lost": run.logs.count(" lost: "),
        "acquires_retried_on_backend_error": run.logs.count("; retrying later"),
        "renewals_failed": run.logs.count("renewal of "),
    }


def test_no_two_bodies_of_one_key_ever_overlapped(run: Run, chaos_figures: Any) -> None:  # noqa: F811
    """Every tenth body sleeps past the TTL: a renewal missed there would let another
    worker take the key while it runs, counted as an overlap."""
    chaos_figures(figures_of(run))
    assert run.steady.overlaps == 0


def test_every_call_ran_its_body(run: Run) -> None:
    assert run.steady.never_ran() == []


def test_no_call_ended_in_failure(run: Run) -> None:
    assert run.steady.not_succeeded() == {}


def test_the_workers_found_the_cluster_from_one_node_url(run: Run) -> None:
    assert "unavailable when first contacted" not in run.logs
    assert "could not check the lock server's maxmemory-policy" not in run.logs
    assert "the worker starts, and until it answers" not in run.logs  # the start check


def test_no_lock_key_is_left_at_the_end(run: Run) -> None:
    assert run.lock_keys_left == []


def test_the_failover_happened_mid_stream(run: Run) -> None:
    assert run.failover_error is None
    assert run.failing_over.failover is not None


def test_every_call_ran_its_body_across_the_failover(run: Run) -> None:
    assert run.failing_over.never_ran() == []


def test_no_call_ended_in_failure_across_the_failover(run: Run) -> None:
    assert run.failing_over.not_succeeded() == {}


def test_acquires_went_on_after_the_failover(run: Run) -> None:
    failover = run.failing_over.failover
    assert failover is not None
    assert any(started > failover.promoted_at for started, _, _ in run.failing_over.starts)


def test_the_primary_was_killed_mid_stream(run: Run) -> None:
    assert run.failover_error is None
    assert run.crashing.failover is not None


def test_every_call_ran_its_body_across_a_primary_crash(run: Run) -> None:
    assert run.crashing.never_ran() == []


def test_no_call_ended_in_failure_across_a_primary_crash(run: Run) -> None:
    assert run.crashing.not_succeeded() == {}


def test_acquires_went_on_after_the_primary_crash(run: Run) -> None:
    failover = run.crashing.failover
    assert failover is not None
    assert any(started > failover.promoted_at for started, _, _ in run.crashing.starts)


def test_limit_2_with_skip_keeps_4_calls_sent_at_once_to_2_bodies_inside(run: Run) -> None:
    assert run.limit_2_most_inside == 2
