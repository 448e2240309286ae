"""``lock_min_replicas`` with no replica attached: locked work pauses until one is, and the
worker says so once when it starts and once when it ends, not once per task (real in-process
worker, real lock server, a real replica attached mid-test)."""

from __future__ import annotations

import logging
import uuid
from typing import Any, Iterator

import pytest

from celery_singleton_lock.celery.duplicates import backend_outage
from celery_singleton_lock.celery.task import locked_task
from celery_singleton_lock.celery.task.replica_pause import ReplicaPause
from celery_singleton_lock.testing import RedisServer
from tests.celery.tasks import runtime
from tests.support import wait_until

CALLS = 3


class Kept(logging.Handler):
    """Keeps the records of the worker's threads (pytest's caplog does not see them all)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


LOGGER = "celery_singleton_lock.acquire"


@pytest.fixture(scope="module")
def paused_then_resumed(
    celery_session_worker: Any, lock_server: RedisServer
) -> Iterator[tuple[list[logging.LogRecord], list[Any], int]]:
    """Three calls refused for want of a replica until each was retried, then a replica of the
    lock server attached: the log records, the results and the refusals counted (one run,
    read by every test of the module)."""
    pause = ReplicaPause()
    key = f"k-{uuid.uuid4().hex[:12]}"
    kept = Kept()
    logger = logging.getLogger(LOGGER)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(locked_task, "PAUSE", pause)  # resumed there
        patch.setattr(backend_outage, "PAUSE", pause)  # refused there
        patch.setattr(logger, "level", logging.DEBUG)
        logger.addHandler(kept)
        try:
            results = [runtime.paused_without_replica.delay(f"{key}-{n}") for n in range(CALLS)]
            # each call retried at least once
            wait_until(lambda: pause.refused >= 2 * CALLS, timeout=20)
            refused = pause.refused
            replica_of = ["--replicaof", "127.0.0.1", str(lock_server.port)]
            with RedisServer.running(extra_args=replica_of) as replica:
                try:
                    values = [result.get(timeout=30) for result in results]
                finally:
                    replica.client().replicaof("NO", "ONE")
        finally:
            logger.removeHandler(kept)
    yield kept.records, values, refused


def _said(records: list[logging.LogRecord]) -> list[str]:
    """What the worker said of pauses, in order: "PAUSED" (an ERROR) or "RESUMED" (a WARNING).
    Usually one of each; on a loaded machine a replica that has just attached can miss one
    acknowledgement window (0.5 s) right after the first: a second pause, said anew."""
    return [
        "PAUSED" if r.levelno >= logging.ERROR else "RESUMED"
        for r in records
        if r.levelno >= logging.WARNING
    ]


def test_a_pause_for_want_of_replicas_is_said_once_not_per_refused_acquire(
    paused_then_resumed: tuple[list[logging.LogRecord], list[Any], int],
) -> None:
    records, _, refused = paused_then_resumed
    said = _said(records)
    assert refused >= 2 * CALLS
    assert said[0] == "PAUSED"
    assert all(one != next_one for one, next_one in zip(said, said[1:])), said


def test_a_pause_says_that_it_does_not_end_by_itself(
    paused_then_resumed: tuple[list[logging.LogRecord], list[Any], int],
) -> None:
    records, _, _ = paused_then_resumed
    first = next(r for r in records if r.levelno >= logging.ERROR).getMessage()
    assert "PAUSED" in first and "does not end by itself" in first


def test_the_end_of_a_pause_is_said_once(
    paused_then_resumed: tuple[list[logging.LogRecord], list[Any], int],
) -> None:
    records, values, _ = paused_then_resumed
    said = _said(records)
    assert values == ["ran"] * CALLS
    assert said[-1] == "RESUMED"
    assert said.count("RESUMED") == said.count("PAUSED")
