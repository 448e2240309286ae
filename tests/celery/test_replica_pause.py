"""``lock_min_replicas`` with no replica attached: locked work pauses until one is, and the
worker says so once when it starts and once when it ends, not once per task (real in-process
worker, real lock server, a real replica attached mid-test)."""

from __future__ import annotations

import logging
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


@pytest.fixture
def paused_then_resumed(
    worker: Any,
    lock_server: RedisServer,
    unique_key: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[list[logging.LogRecord], list[Any], int]]:
    """Three calls refused for want of a replica until each was retried, then a replica of the
    lock server attached: the log records, the results and the refusals counted."""
    pause = ReplicaPause()
    monkeypatch.setattr(locked_task, "PAUSE", pause)  # resumed there
    monkeypatch.setattr(backend_outage, "PAUSE", pause)  # refused there
    kept = Kept()
    logger = logging.getLogger(LOGGER)
    monkeypatch.setattr(logger, "level", logging.DEBUG)
    logger.addHandler(kept)
    try:
        results = [runtime.paused_without_replica.delay(f"{unique_key}-{n}") for n in range(CALLS)]
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


def test_a_pause_for_want_of_replicas_is_said_once(
    paused_then_resumed: tuple[list[logging.LogRecord], list[Any], int],
) -> None:
    records, _, refused = paused_then_resumed
    paused = [r for r in records if r.levelno >= logging.ERROR]
    assert refused >= 2 * CALLS
    assert len(paused) == 1
    assert "PAUSED" in paused[0].getMessage()
    assert "does not end by itself" in paused[0].getMessage()


def test_the_end_of_a_pause_is_said_once(
    paused_then_resumed: tuple[list[logging.LogRecord], list[Any], int],
) -> None:
    records, values, _ = paused_then_resumed
    resumed = [r for r in records if r.levelno == logging.WARNING]
    assert values == ["ran"] * CALLS
    assert len(resumed) == 1
    assert "RESUMED" in resumed[0].getMessage()
