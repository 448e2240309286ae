"""Tasks of ``on_duplicate="join"``: duplicates end with the running execution's outcome
(tests/celery/test_join.py, test_join_fallbacks.py). ``shared=False``: other apps finalized
in the tests' process have no result backend, which a join task needs when it is bound (see
the ``add_defaults`` in :mod:`~tests.celery.tasks.core`)."""

from __future__ import annotations

from typing import Any

from celery_singleton_lock import LockedTask
from tests.celery.tasks.core import app, body, keyed_task

#: a duplicate waits 1 s for the holder, then lock-retries (a worker slot is never held longer)
join_value = keyed_task(
    __name__,
    "join_value",
    shared=False,
    on_duplicate="join",
    lock_wait_timeout=1,
    lock_retry_backoff=0.1,
    lock_retry_backoff_max=0.3,
)
#: the holder is killed -9 in its worker: its lock expires after 2 s with no outcome stored
join_short_ttl = keyed_task(
    __name__,
    "join_short_ttl",
    shared=False,
    on_duplicate="join",
    lock_ttl=2,
    lock_wait_timeout=20,
)


class AccountMissing(LookupError):
    """What ``join_raises`` raises: a class of the test's own, rebuilt from the backend."""


@app.task(
    bind=True,
    base=LockedTask,
    shared=False,
    lock_on=("key",),
    on_duplicate="join",
    lock_wait_timeout=10,
)
def join_raises(self: LockedTask, key: str, seconds: float = 0.0) -> None:
    body(key, seconds, self.request.id)
    raise AccountMissing(f"no account {key}")


@app.task(bind=True, base=LockedTask, lock_on=("key",), on_duplicate="skip", max_retries=1)
def retries_in_two_seconds(self: LockedTask, key: str, retry_first: bool) -> dict[str, Any]:
    """With ``retry_first``, its first attempt calls ``self.retry(countdown=2)``; otherwise (and
    on the retry) the body runs 3 s."""
    if retry_first and self.request.retries == 0:
        raise self.retry(countdown=2)
    return body(key, 3.0, self.request.id)
