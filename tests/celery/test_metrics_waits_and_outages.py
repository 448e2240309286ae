"""Prometheus metrics from a real prefork worker with one pool process (-c 1): the acquire
histogram counts the time a call waited in the worker for a free pool process, and a lock
server that cannot be reached is counted in ``celery_lock_backend_errors_total``.

One scenario per module (a worker start is the slow part): a gated call holds the only pool
process while a second call waits behind it in the worker for a known time; then the lock
server is stopped, a call of ``lock_on_backend_error="run"`` and one of ``"retry"`` (the
default) are sent, and the server is started again on the same port.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Iterator

import pytest

from celery_singleton_lock.testing import RedisServer
from tests.celery.tasks import policies, runtime
from tests.celery.test_metrics import metrics_worker, scrape, total
from tests.celery.workers import unique
from tests.support import wait_until

pytest.importorskip("prometheus_client")

QUEUED_TASK = policies.hold_skip.name
#: Seconds the second call is kept waiting in the worker, at least (a lower bound of its
#: acquire time, not a measurement of speed).
QUEUED_FOR = 1.5
#: The histogram bucket below that lower bound (``metrics.ACQUIRE_BUCKETS``).
BELOW_THE_WAIT = "1.0"


@dataclass
class Outcome:
    after_wait: dict[Any, float]
    #: what the call of lock_on_backend_error="run" returned (its lock's ``locked``)
    unlocked_result: Any
    #: the samples once the "retry" call had met the stopped server
    during_outage: dict[Any, float]
    #: what the call of lock_on_backend_error="retry" returned once the server was back
    retried_result: Any
    after_outage: dict[Any, float]


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outcome]:
    directory = str(tmp_path_factory.mktemp("metrics"))
    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(RedisServer.running())
        lock = stack.enter_context(RedisServer.running())
        worker, client, port = stack.enter_context(metrics_worker(broker, lock, directory, 1))
        after_wait = wait_behind_a_busy_pool(lock, worker, client, port)
        yield Outcome(after_wait, *outage(lock, client, port))


def reserved_by(client: Any, worker: Any, task_id: str) -> bool:
    """True once ``worker`` answers that it holds ``task_id`` received and not yet started."""
    replies = client.control.inspect(destination=[worker.name], timeout=1).reserved() or {}
    return any(request["id"] == task_id for request in replies.get(worker.name, []))


def wait_behind_a_busy_pool(lock: RedisServer, worker: Any, client: Any, port: int) -> Any:
    gate = unique("gate")
    busy = client.send_task(runtime.gated.name, args=[gate])
    wait_until(lambda: lock.client().llen(f"runs:{gate}") == 1, timeout=30)
    queued = client.send_task(QUEUED_TASK, args=[unique("queued")])
    # the worker has received it (its answer comes after): from here it waits for the only
    # pool process, which runs the gated body until the gate opens
    wait_until(lambda: reserved_by(client, worker, queued.id), timeout=30, interval=0.2)
    time.sleep(QUEUED_FOR)
    lock.client().rpush(f"gate:{gate}", "open")
    busy.get(timeout=30)
    queued.get(timeout=30)
    return scrape(port)


def outage(lock: RedisServer, client: Any, port: int) -> tuple[Any, ...]:
    lock.stop()
    unlocked = client.send_task(runtime.runs_unlocked.name, args=[unique("unlocked")])
    unlocked_result = unlocked.get(timeout=30)
    retried = client.send_task(runtime.retries_on_outage.name, args=[unique("retried")])

    def retry_counted() -> Any:
        samples = scrape(port)
        errors = total(
            samples, "celery_lock_backend_errors_total", name=runtime.retries_on_outage.name
        )
        return samples if errors >= 1 else None

    during = wait_until(retry_counted, timeout=30, interval=0.1)
    lock.start()
    retried_result = retried.get(timeout=30)
    return unlocked_result, during, retried_result, scrape(port)


def test_a_call_kept_waiting_for_a_pool_process_is_timed_from_its_receipt(
    outcome: Outcome,
) -> None:
    samples = outcome.after_wait
    count = total(samples, "celery_lock_acquire_seconds_count", name=QUEUED_TASK)
    below = total(
        samples, "celery_lock_acquire_seconds_bucket", name=QUEUED_TASK, le=BELOW_THE_WAIT
    )
    assert (count, below) == (1, 0)


def test_the_acquire_histogram_sum_includes_the_wait_in_the_worker(outcome: Outcome) -> None:
    waited = total(outcome.after_wait, "celery_lock_acquire_seconds_sum", name=QUEUED_TASK)
    assert waited >= QUEUED_FOR


def test_a_call_that_runs_unlocked_on_an_outage_counts_one_backend_error(
    outcome: Outcome,
) -> None:
    errors = total(
        outcome.after_outage, "celery_lock_backend_errors_total", name=runtime.runs_unlocked.name
    )
    assert errors == 1


def test_a_call_that_runs_unlocked_on_an_outage_runs_its_body_without_the_lock(
    outcome: Outcome,
) -> None:
    assert outcome.unlocked_result is False


def test_a_call_that_retries_on_an_outage_is_counted_before_the_server_is_back(
    outcome: Outcome,
) -> None:
    errors = total(
        outcome.during_outage,
        "celery_lock_backend_errors_total",
        name=runtime.retries_on_outage.name,
    )
    assert errors >= 1


def test_a_call_that_retries_on_an_outage_runs_once_the_server_is_back(outcome: Outcome) -> None:
    assert outcome.retried_result == "ran"


def test_an_outage_counts_no_acquire_of_the_calls_that_met_it(outcome: Outcome) -> None:
    acquired = total(
        outcome.during_outage, "celery_lock_acquired_total", name=runtime.runs_unlocked.name
    )
    assert acquired == 0
