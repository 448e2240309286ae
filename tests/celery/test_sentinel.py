"""Locks on a Sentinel group through a failover, from real ``celery worker`` processes.

A real group (1 master, 1 replica, 3 sentinels on loopback: tests/sentinel_topology.py) holds
the locks; broker, results and the bodies' records are on a plain Redis server of their own,
so only the lock server fails over. 2 prefork workers run a stream of locked
``short_ttl_retry`` calls (``on_duplicate="retry"``, ``lock_ttl=1``: renewed every third of a
second, so bodies of 0.4 s are renewed while they run) over a few keys, and ``SENTINEL FAILOVER`` is
asked mid-stream. The whole module runs twice, on a fresh group each time: once as is, once with
``lock_min_replicas=1`` (``short_ttl_retry_replicated``: a lock is held only once the replica
acknowledged it). Reduced size by default; ``--full`` runs longer streams with two failovers.

What Sentinel does (and this measures): the sentinels name the new master within about a
second, but the old master is demoted only some 10 s later (Sentinel waits before it
reconfigures it). Until then connections opened before the switch still write to the old
master, and everything written there is lost at its demotion: leases taken there are reported
lost at their next renewal, and the same key can be taken again on the new master while such a
body still runs (asynchronous replication). The overlaps are counted and reported, not
asserted away.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import pytest
import redis
from celery.result import AsyncResult

from celery_singleton_lock.testing import RedisServer
from tests.celery.streams import most_inside_at_once, ran, starts, wait_for
from tests.celery.tasks import expiry
from tests.celery.workers import LocksApart, client_app, close_client, unique, worker_group
from tests.chaos.conftest import chaos_figures  # noqa: F401 (fixture)
from tests.sentinel_topology import Failover, SentinelGroup

#: Seconds every call may take to have run, after the last one was sent.
DRAIN_BUDGET = 90.0


@dataclass
class SentinelServers(LocksApart):
    """Locks on ``group``."""

    group: Optional[SentinelGroup] = None

    def lock_env(self) -> dict[str, str]:
        assert self.group is not None
        return {
            "CSL_LOCK_URL": self.group.url,
            "CSL_LOCK_TRANSPORT_OPTIONS": json.dumps(self.group.transport_options),
        }


@dataclass
class Size:
    calls: int
    keys: int
    body: float  # seconds
    interval: float  # seconds between two sends
    failovers: int
    first_failover_after: float  # seconds into the stream


REDUCED = Size(calls=56, keys=4, body=0.4, interval=0.25, failovers=1, first_failover_after=2.0)
FULL = Size(calls=400, keys=8, body=0.4, interval=0.15, failovers=2, first_failover_after=5.0)


@dataclass
class Stream:
    size: Size
    sent: list[str]
    starts: list[tuple[float, str, str]]  # (time.time(), task id, key) of each body run
    overlaps: int
    states: dict[str, str]
    lock_keys_left: list[str]
    failovers: list[Failover]
    logs: str
    failover_error: Optional[Exception] = None
    figures: dict[str, Any] = field(default_factory=dict)
    #: bodies run of 4 calls of one key sent at once to a lock_limit=2 skip task, after
    limit_2_most_inside: int = 0

    def never_ran(self) -> list[str]:
        return sorted(set(self.sent) - {task_id for _, task_id, _ in self.starts})

    def not_succeeded(self) -> dict[str, str]:
        return {task_id: state for task_id, state in self.states.items() if state != "SUCCESS"}


#: The two streams: locks as they are (asynchronous replication), and locks held only once the
#: replica acknowledged them (``lock_min_replicas=1``, ``WAIT 1`` with the acquire).
TASKS = {
    "async": expiry.short_ttl_retry.name,
    "min_replicas_1": expiry.short_ttl_retry_replicated.name,
}


#: The asynchronous-replication stream runs with --full only (about 35 s): the suite keeps the
#: one with lock_min_replicas=1, and tests/engine/test_sentinel_failover.py shows what the
#: switch loses without it.
@pytest.fixture(
    scope="module",
    params=[pytest.param("async", marks=pytest.mark.full), "min_replicas_1"],
)
def stream(request: pytest.FixtureRequest) -> Iterator[Stream]:
    size = FULL if request.config.getoption("--full") else REDUCED
    with SentinelGroup.running() as group, RedisServer.running() as plain:
        servers = SentinelServers(
            broker_url=plain.url,
            lock=plain,
            group=group,
        )
        client = client_app(servers)
        records = servers.records()
        try:
            with worker_group(servers) as workers:
                yield run_stream(size, group, workers, client, records, TASKS[request.param])
        finally:
            records.close()
            close_client(client)


def run_stream(
    size: Size, group: SentinelGroup, workers: Any, client: Any, records: redis.Redis, task: str
) -> Stream:
    started = workers.start(2, pool="prefork", concurrency=2)
    queue = started[0].queue
    keys = [unique("s") for _ in range(size.keys)]
    failovers: list[Failover] = []
    errors: list[Exception] = []

    def fail_over() -> None:
        try:
            for index in range(size.failovers):
                if index:
                    time.sleep(3.0)  # leave the new master serving for a while
                failovers.append(group.failover())
        except (redis.RedisError, AssertionError, RuntimeError) as exc:  # reported by a test
            errors.append(exc)

    driver = threading.Thread(target=fail_over, name="failover", daemon=True)
    began = time.monotonic()
    sent: list[str] = []
    for index in range(size.calls):
        if index * size.interval >= size.first_failover_after and driver.ident is None:
            driver.start()
        key = keys[index % len(keys)]
        sent.append(client.send_task(task, args=(key, size.body), queue=queue).id)
        pause = began + (index + 1) * size.interval - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    driver.join(timeout=size.failovers * 60)
    wait_for(lambda: set(sent) <= ran(records, keys), DRAIN_BUDGET)
    states: dict[str, str] = {}
    for _ in range(100):
        states = {task_id: AsyncResult(task_id, app=client).state for task_id in sent}
        if all(state in ("SUCCESS", "FAILURE") for state in states.values()):
            break
        time.sleep(0.2)
    limit_2_most_inside = most_inside_at_once(client, queue, records)
    master = group.master()
    try:
        left = sorted(master.scan_iter(match="singleton-lock*", count=1000))
    finally:
        master.close()
    return Stream(
        size=size,
        sent=sent,
        starts=sorted(starts(records, keys)),
        overlaps=sum(int(records.get(f"overlaps:{key}") or 0) for key in keys),
        states=states,
        lock_keys_left=left,
        failovers=failovers,
        logs="\n".join(worker.log() for worker in started),
        failover_error=errors[0] if errors else None,
        limit_2_most_inside=limit_2_most_inside,
    )


def figures_of(stream: Stream) -> dict[str, Any]:
    """The failover figures: per failover, seconds from SENTINEL FAILOVER to the sentinels
    naming the new master, to the old master's demotion, to the next body start, and to the
    first body start after the demotion (an acquire certainly made on the new master); the
    longest pause between two body starts around it."""
    starts = [started for started, _, _ in stream.starts]
    per_failover = []
    for failover in stream.failovers:
        after_ask = [t for t in starts if t > failover.asked_at]
        after_demotion = [t for t in starts if t > failover.demoted_at]
        window = [t for t in starts if failover.asked_at - 1 <= t <= failover.demoted_at + 5]
        gaps = [b - a for a, b in zip(window, window[1:])]
        per_failover.append(
            {
                "switch_s": round(failover.switched_at - failover.asked_at, 2),
                "demotion_s": round(failover.demoted_at - failover.asked_at, 2),
                "next_acquire_s": round(after_ask[0] - failover.asked_at, 2) if after_ask else None,
                "first_acquire_after_demotion_s": round(after_demotion[0] - failover.demoted_at, 2)
                if after_demotion
                else None,
                "longest_pause_s": round(max(gaps), 2) if gaps else None,
                # acquires made while the two masters took writes (switch to demotion)
                "body_starts_between_switch_and_demotion": sum(
                    1 for t in starts if failover.switched_at < t < failover.demoted_at
                ),
            }
        )
    return {
        "calls": len(stream.sent),
        "keys": stream.size.keys,
        "body_runs": len(stream.starts),
        "ran_twice": sum(1 for n in Counter(t for _, t, _ in stream.starts).values() if n > 1),
        "overlapping_runs": stream.overlaps,
        "states": dict(Counter(stream.states.values())),
        "leases_lost": stream.logs.count(" lost: "),
        "acquires_retried_on_backend_error": stream.logs.count("; retrying later"),
        "renewals_failed": stream.logs.count("renewal of "),
        "failovers": per_failover,
    }


def test_the_failover_happened_mid_stream(stream: Stream) -> None:
    assert stream.failover_error is None
    assert len(stream.failovers) == stream.size.failovers


def test_every_call_ran_its_body(stream: Stream, chaos_figures: Any) -> None:  # noqa: F811
    chaos_figures(figures_of(stream))
    assert stream.never_ran() == []


def test_no_call_ended_in_failure(stream: Stream) -> None:
    assert stream.not_succeeded() == {}


def test_no_lock_key_is_left_at_the_end(stream: Stream) -> None:
    assert stream.lock_keys_left == []


def test_acquires_went_on_after_the_failover(stream: Stream) -> None:
    last = stream.failovers[-1]
    assert any(started > last.demoted_at for started, _, _ in stream.starts)


def test_workers_check_the_eviction_policy_of_the_master_they_found(stream: Stream) -> None:
    assert "singleton locks on sentinel://127.0.0.1:" in stream.logs
    assert "could not check the lock server's maxmemory-policy" not in stream.logs
    assert "the worker starts, and until it answers" not in stream.logs  # the start check


def test_limit_2_with_skip_keeps_4_calls_sent_at_once_to_2_bodies_inside(stream: Stream) -> None:
    assert stream.limit_2_most_inside == 2
