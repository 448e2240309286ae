"""``dedupe_on_enqueue="until_started"`` with a real ``celery worker`` (prefork): a call is not
published while another of its lock name is queued and not yet started; once that one runs,
the next call is published (one more run for a burst during a run).

The test process sends through ``lockapp.app`` itself (only a task object deduplicates at
enqueue), to a queue no worker consumes until the test starts one.
"""

from __future__ import annotations

from typing import Any

from celery_singleton_lock.celery.config.lockers import locker_for
from tests.celery.tasks import core, dedupe
from tests.celery.test_enqueue_dedupe import name_of, published, runs
from tests.celery.workers import Servers, unique, worker_group
from tests.support import wait_until


def test_a_burst_while_a_call_runs_publishes_one_more_call_and_runs_it_once(
    servers: Servers, celery_app: Any
) -> None:
    task, key, queue = dedupe.dedupe_until_started, unique("k"), unique("q")
    with worker_group(servers) as group:
        with published(task) as before_start:
            first = [task.apply_async((key,), queue=queue) for _ in range(5)]
        assert len(before_start) == 1  # no worker yet: the first call is queued
        assert {result.id for result in first} == set(before_start)
        group.start(1, queue=queue, pool="prefork", concurrency=2)
        wait_until(lambda: len(runs(key)) == 1, timeout=30)  # the first body runs (gated)
        with published(task) as during_run:
            second = [task.apply_async((key,), queue=queue) for _ in range(5)]
        assert len(during_run) == 1  # the running call does not block; the queued one does
        assert {result.id for result in second} == set(during_run)
        core.open_gate(key, 2)
        assert second[0].get(timeout=30) == during_run[0]
        assert first[0].get(timeout=30) == before_start[0]
        assert runs(key) == [before_start[0], during_run[0]]
        markers = locker_for(task.app).markers
    assert markers is not None and markers.queued(name_of(task, key)) is None
