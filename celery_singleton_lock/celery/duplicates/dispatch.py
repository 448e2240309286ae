"""What a duplicate does: the task's ``on_duplicate`` policy chosen and applied, in one place.

:mod:`.policies` holds skip, retry, wait, fail and queue, :mod:`.join` the join policy; this
module only dispatches, so that neither imports the other's caller."""

from __future__ import annotations

from typing import Callable

from celery_singleton_lock.celery.duplicates.join import join
from celery_singleton_lock.celery.duplicates.policies import Duplicate, fail, retry, skip, wait
from celery_singleton_lock.engine import AcquireResult, Lease


def handle(duplicate: Duplicate, acquire: Callable[[], AcquireResult]) -> Lease:
    """Apply the task's ``on_duplicate`` policy; returns a lease only if ``wait`` got one, or
    ``join`` found the holder gone without an outcome."""
    policy = duplicate.options.on_duplicate
    if policy in ("retry", "join", "queue", "replace") and duplicate.request.is_eager:
        # in eager mode, wait in place up to lock_wait_timeout, then fail (no result is
        # stored to join)
        policy = "wait"
    if (
        policy in ("fail", "join", "queue", "replace")
        and duplicate.holder.task_id == duplicate.request.id
    ):
        # a state stored under the running execution's id would clobber it
        policy = "skip"
    if policy == "skip":
        skip(duplicate)
    if policy == "retry":
        retry(duplicate)
    if policy == "fail":
        fail(duplicate)
    if policy == "join":
        return join(duplicate, acquire)
    if policy in ("queue", "replace"):
        retry(duplicate)  # a call that could not be parked (see parking.parked_message)
    return wait(duplicate, acquire)
