"""Prometheus metrics from a real prefork worker (-c 4): counts of every pool child add up in
the main process's ``/metrics``, and a child's death loses none of them.

One scenario per module (a worker start is the slow part): 7 calls of a key held from here
(skipped), then 20 calls of 20 keys (acquired), spread over the pool children; ``/metrics`` is
scraped, every child is killed with SIGKILL, and it is scraped again.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import urllib.request
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import pytest
import redis

from celery_singleton_lock.celery.observe import metrics
from celery_singleton_lock.celery.signals import lock_acquired, lock_duplicate, lock_released
from celery_singleton_lock.engine import Lease, Owner, RedisLocker
from celery_singleton_lock.errors import LockConfigurationError
from celery_singleton_lock.testing import RedisServer
from tests.celery.tasks import policies, runtime
from tests.celery.workers import (
    MetricsServers,
    children_of,
    client_app,
    close_client,
    unique,
    worker_group,
)
from tests.support import wait_until

prometheus_parser = pytest.importorskip("prometheus_client.parser")

SKIP_TASK = policies.hold_skip.name
SKIPS, ACQUIRES = 7, 20


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics``: (sample name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in prometheus_parser.text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(samples: dict[Any, float], metric: str, **labels: str) -> float:
    return sum(
        value
        for (sample, sample_labels), value in samples.items()
        if sample == metric and all((k, v) in sample_labels for k, v in labels.items())
    )


def scrape_once_released(
    port: int, timeout: float = 10.0, acquires: int = ACQUIRES
) -> dict[Any, float]:
    """A scrape taken once every acquire's release is timed (``acquires`` of them), or after
    ``timeout``.

    A worker sends the release without waiting and reads its reply (and only then observes
    ``celery_lock_held_seconds``) with the child's next command or its renewer's next look,
    after the result is stored: a scrape taken right after the last ``result.get()`` can miss
    the last release of a child (seen on Celery 5.3).
    """
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(port)
        timed = total(samples, "celery_lock_held_seconds_count", name=SKIP_TASK)
        if timed >= acquires or time.monotonic() > deadline:
            return samples
        time.sleep(0.1)


@dataclass
class Outcome:
    before_kill: dict[Any, float]
    after_kill: dict[Any, float]
    #: pool processes that ran one of the 20 bodies
    body_pids: set[int]
    #: pool processes killed
    killed: list[int]
    #: the queue the worker consumes, which the client sends to
    queue: str


@contextlib.contextmanager
def metrics_worker(
    broker: RedisServer,
    lock: RedisServer,
    metrics_dir: str,
    concurrency: int,
    extra_args: Sequence[str] = (),
) -> Iterator[tuple[Any, Any, int]]:
    """A real worker of ``metricsapp`` (the metrics on, served on a free port): the worker, a
    client app sending to its queue, and the port."""
    servers = MetricsServers.of(broker, lock, metrics_dir)
    with worker_group(servers) as group:
        (worker,) = group.start(concurrency=concurrency, extra_args=extra_args)
        client = client_app(servers, worker.queue)
        try:
            yield worker, client, servers.metrics_port
        finally:
            close_client(client)


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outcome]:
    directory = str(tmp_path_factory.mktemp("metrics"))
    with (
        RedisServer.running() as server,
        metrics_worker(server, server, directory, 4) as (
            worker,
            client,
            port,
        ),
    ):
        yield run_scenario(server, worker, client, port)


def run_scenario(server: RedisServer, worker: Any, client: Any, port: int) -> Outcome:
    held_key = unique("held")
    name = policies.hold_skip.lock_options.keyer.name((held_key,), {})
    locker = RedisLocker(redis.Redis.from_url(server.url))
    lease = locker.try_acquire(name, 60, owner=Owner(task_id="the-holder"), renew=False)
    assert isinstance(lease, Lease)
    skipped = [client.send_task(SKIP_TASK, args=[held_key]) for _ in range(SKIPS)]
    for result in skipped:
        result.get(timeout=30, propagate=False)
    lease.release()
    ran = [
        client.send_task(SKIP_TASK, args=[unique("free")], kwargs={"seconds": 0.2})
        for _ in range(ACQUIRES)
    ]
    pids = {result.get(timeout=60)["pid"] for result in ran}
    # a body that deletes its own lock key and waits until it is told the lock is lost
    lost = client.send_task(runtime.watches_its_lock.name, args=[unique("lost")])
    assert lost.get(timeout=30)["lost"]
    # two calls parked behind a lock of hold_skip that no worker hands on (no queue policy)
    name = f"{policies.hold_skip.name}:{unique('parked')}"
    lock_server = server.client()
    lock_server.zadd(f"singleton-lock:{{{name}}}:parked", {"t-1": 1, "t-2": 2})
    lock_server.zadd("singleton-lock:handoff-due", {name: 1})  # as a parking script indexes it
    before = scrape_once_released(port)
    killed = children_of(worker.pid)
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not set(children_of(worker.pid)) & set(killed), timeout=20)
    return Outcome(before, scrape(port), pids, killed, worker.queue)


def test_the_twenty_acquires_ran_in_more_than_one_pool_child(outcome: Outcome) -> None:
    assert len(outcome.body_pids) > 1


def test_acquired_total_sums_to_the_acquires_of_every_pool_child(outcome: Outcome) -> None:
    assert total(outcome.before_kill, "celery_lock_acquired_total", name=SKIP_TASK) == ACQUIRES


def test_duplicates_total_of_action_skip_sums_to_the_skips(outcome: Outcome) -> None:
    skips = total(
        outcome.before_kill, "celery_lock_duplicates_total", name=SKIP_TASK, action="skip"
    )
    assert skips == SKIPS


def test_a_duplicate_is_labelled_with_reason_held(outcome: Outcome) -> None:
    held = total(outcome.before_kill, "celery_lock_duplicates_total", name=SKIP_TASK, reason="held")
    assert held == SKIPS


def test_every_acquire_is_timed_in_the_acquire_histogram(outcome: Outcome) -> None:
    timed = total(outcome.before_kill, "celery_lock_acquire_seconds_count", name=SKIP_TASK)
    assert timed == ACQUIRES


def test_every_release_is_timed_in_the_held_histogram(outcome: Outcome) -> None:
    timed = total(outcome.before_kill, "celery_lock_held_seconds_count", name=SKIP_TASK)
    assert timed == ACQUIRES


def test_a_lock_lost_in_a_pool_child_is_counted(outcome: Outcome) -> None:
    lost = total(outcome.before_kill, "celery_lock_lost_total", name=runtime.watches_its_lock.name)
    assert lost == 1


def test_the_parked_gauge_counts_the_calls_parked_behind_locks_of_the_task(
    outcome: Outcome,
) -> None:
    assert total(outcome.before_kill, "celery_lock_parked", name=SKIP_TASK) == 2


PER_CALL_SERIES = (
    "celery_lock_acquired_total",
    "celery_lock_duplicates_total",
    "celery_lock_lost_total",
    "celery_lock_acquire_seconds_count",
    "celery_lock_held_seconds_count",
)


@pytest.mark.parametrize("series", PER_CALL_SERIES)
def test_every_per_call_series_is_labelled_with_the_queue_the_calls_came_in_on(
    outcome: Outcome, series: str
) -> None:
    queues = {
        dict(labels).get("queue_name")
        for (sample, labels), value in outcome.before_kill.items()
        if sample == series and value
    }
    assert queues == {outcome.queue}


def test_killing_every_pool_child_loses_no_acquire_already_counted(outcome: Outcome) -> None:
    assert total(outcome.after_kill, "celery_lock_acquired_total", name=SKIP_TASK) == ACQUIRES


def test_killing_every_pool_child_loses_no_skip_already_counted(outcome: Outcome) -> None:
    skips = total(outcome.after_kill, "celery_lock_duplicates_total", name=SKIP_TASK, action="skip")
    assert skips == SKIPS


def test_with_the_setting_off_no_receiver_is_connected_to_the_lock_signals(
    own_app: Any,
) -> None:
    before = [len(s.receivers) for s in (lock_acquired, lock_duplicate, lock_released)]
    metrics.set_up(own_app, "celery@here")
    assert [len(s.receivers) for s in (lock_acquired, lock_duplicate, lock_released)] == before


def test_a_metrics_port_that_is_not_a_port_is_refused_naming_the_setting() -> None:
    with pytest.raises(LockConfigurationError, match="singleton_lock_metrics_port"):
        metrics.check_settings({"singleton_lock_metrics_port": "9808"})


def test_the_parked_gauge_reads_zero_for_a_task_that_can_park_and_has_nothing_parked(
    redis_server: RedisServer,
) -> None:
    from celery import Celery

    from celery_singleton_lock import LockedTask

    app = Celery("parked-zero", set_as_current=False)
    app.conf.singleton_lock_url = redis_server.url

    @app.task(name="parked_zero.queued", base=LockedTask, on_duplicate="queue", shared=False)
    def queued(n: int) -> None: ...

    @app.task(name="parked_zero.skipped", base=LockedTask, shared=False)
    def skipped(n: int) -> None: ...

    (family,) = metrics.ParkedCollector(app).collect()
    # (tasks other modules share with every app may be listed too)
    parked = {sample.labels["name"]: sample.value for sample in family.samples}
    assert parked["parked_zero.queued"] == 0
    assert "parked_zero.skipped" not in parked
