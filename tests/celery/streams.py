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


def most_inside_at_once(client: Any, queue: str, records: redis.Redis, calls: int = 4) -> int:
    """Send ``calls`` calls of one key at once to ``limit2_skip`` (``lock_limit=2``, skip, 5 s
    bodies), wait for every outcome, and return the most bodies of the key ever inside at once.

    Not how many ran: a worker may reserve a call behind its own two busy pool processes, and
    that call rightly runs once a body ends and frees a slot (seen on a loaded machine: 3 of 4
    ran, never more than 2 at once). The limit's guarantee is the number inside at once."""
    key = f"lim-{uuid.uuid4().hex[:12]}"
    name = limits.limit2_skip.name
    results = [client.send_task(name, args=(key, 5.0), queue=queue) for _ in range(calls)]
    for result in results:
        result.get(timeout=60, propagate=False)  # a skipped call stores its skip
    return int(records.get(f"most:{key}") or 0)
