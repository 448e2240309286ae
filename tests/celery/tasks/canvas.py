"""Plain tasks a canvas links to: a chord's callback, a chain step, an errback
(tests/celery/test_join.py, test_queue_policy.py, test_celery_api.py)."""

from __future__ import annotations

from typing import Any

from tests.celery.tasks.core import app, store


@app.task
def collects(results: list[Any]) -> list[Any]:
    """A chord callback: what the chord's members returned."""
    return results


@app.task
def tags(value: Any, tag: str) -> list[Any]:
    """A chain step or link callback: the value it was given, tagged."""
    return [tag, value]


@app.task
def records_errback(task_id: str, *, key: str) -> None:
    """A ``link_error`` errback: records the failed task's id in ``errbacks:<key>``. One
    positional parameter: Celery < 5.4 calls one of more as ``(request, exc, traceback)``."""
    store().rpush(f"errbacks:{key}", task_id)
