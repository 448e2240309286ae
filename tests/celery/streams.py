"""A stream of calls sent to real workers while servers fail, read back from the records the
bodies leave (``runs:<key>``: ``task_id|pid|started``; see ``body`` in tasks/core.py): which
calls ran and when. Shared by the Sentinel, Cluster and Redlock worker tests."""

from __future__ import annotations

import time
import uuid
from typing import Any, Callable

import redis

from tests.celery.tasks import limits


def wait_for(predicate: Callable[[], bool], budget: float) -> bool:
    """Poll ``predicate`` every 0.2 s for up to ``budget`` seconds; its last answer."""
    deadline = time.monotonic() + budget
    for _ in range(int(budget / 0.2) + 1):
        if predicate() or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return predicate()


def starts(records: redis.Redis, keys: list[str]) -> list[tuple[float, str, str]]:
    """Every body start recorded for ``keys``: (time started, task id, key)."""
    found = []
    for key in keys:
        for raw in records.lrange(f"runs:{key}", 0, -1):
            task_id, _pid, started = raw.decode().split("|")
            found.append((float(started), task_id, key))
    return found


def ran(records: redis.Redis, keys: list[str]) -> set[str]:
    """Task ids whose body started for one of ``keys``."""
    return {task_id for _, task_id, _ in starts(records, keys)}


def limited_runs(client: Any, queue: str, records: redis.Redis, calls: int = 4) -> int:
    """Send ``calls`` calls of one key at once to ``limit2_skip`` (``lock_limit=2``, skip,
    5 s bodies: they all arrive while the first two run, even on a loaded machine, where
    1.5 s bodies once let a late call find a slot free again); how many bodies ran."""
    key = f"lim-{uuid.uuid4().hex[:12]}"
    name = limits.limit2_skip.name
    results = [client.send_task(name, args=(key, 5.0), queue=queue) for _ in range(calls)]
    for result in results:
        result.get(timeout=60, propagate=False)  # a skipped call stores its skip
    return int(records.llen(f"runs:{key}"))
