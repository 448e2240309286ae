"""Tasks of the duplicate policies skip, retry, wait and fail (tests/celery/test_policies.py;
``hold_skip`` and ``hold_retry`` serve many other modules as "a plain locked task")."""

from __future__ import annotations

from typing import Any

from celery_singleton_lock import LockedTask
from tests.celery.tasks.core import app, body, keyed_task
from tests.celery.tasks.queueing import Colour

hold_skip = keyed_task(__name__, "hold_skip", on_duplicate="skip", lock_ttl=5)
hold_retry = keyed_task(
    __name__,
    "hold_retry",
    on_duplicate="retry",
    lock_ttl=5,
    lock_retry_backoff=0.05,
    lock_retry_backoff_max=0.5,
)
hold_retry_twice = keyed_task(
    __name__,
    "hold_retry_twice",
    on_duplicate="retry",
    lock_ttl=5,
    lock_retry_backoff=0.05,
    lock_retry_backoff_max=0.1,
    lock_max_retries=2,
)
hold_wait = keyed_task(__name__, "hold_wait", on_duplicate="wait", lock_wait_timeout=10)
hold_fail = keyed_task(__name__, "hold_fail", on_duplicate="fail")


@app.task(
    bind=True,
    base=LockedTask,
    name=f"{__name__}.retry_colour",
    lock_on=("key",),
    on_duplicate="retry",
    lock_retry_backoff=0.05,
    lock_retry_backoff_max=0.5,
)
def retry_colour(self: LockedTask, key: str, colour: Colour, seconds: float = 0.0) -> Any:
    """Policy retry, with an argument only pickle can carry (a JSON result backend with
    ``result_extended`` cannot store its states)."""
    return body(key, seconds, self.request.id)
