"""Policy ``join``: a duplicate waits for the running call and takes its outcome.

Also what a redelivered or re-sent copy of a call that already ran does: it is recognised
(a stored outcome, a marked copy) and does not run the body again."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from celery.exceptions import Ignore

from celery_singleton_lock.celery import celery_api
from celery_singleton_lock.celery.celery_api import BACKEND_ERRORS
from celery_singleton_lock.celery.duplicates.actions import (
    Duplicate,
    release_notifications,
    retry,
    skip,
    waited_for,
)
from celery_singleton_lock.celery.duplicates.redelivery import outcome_stored
from celery_singleton_lock.engine import AcquireResult, Lease, LockHolder
from celery_singleton_lock.errors import (
    LockBackendUnavailable,
    LockError,
)

log = logging.getLogger("celery_singleton_lock.duplicate")

#: Message header of a ``join`` duplicate's lock retry: the task id it was joining, whose
#: outcome it takes if that execution ended while the retry was on its way.
JOIN_HEADER = "singleton_lock_joins"

#: Seconds a joiner that took the lock reads the holder's state for its outcome: the holder
#: releases as its body ends, before the tracer stores the outcome (after the callbacks).
OUTCOME_GRACE = 2.0
OUTCOME_POLL = 0.05


def join(duplicate: Duplicate, acquire: Callable[[], AcquireResult]) -> Lease:
    """End with the holder's outcome as this execution's own, without running the body.

    Waits for the release as ``wait`` does (up to ``lock_wait_timeout``), then reads the
    outcome the holder stored. A duplicate that takes the lock once the holder is gone reads
    it for up to ``OUTCOME_GRACE`` (the holder releases before its outcome is stored) and
    runs the body only if none comes: the holder died without one (its worker killed, its
    lock expired), or its pool child died and Celery stored ``WorkerLostError``, which only
    the holder's own caller gets. Other joiners then follow
    the one running. On timeout: a lock retry that remembers whom it joined (``JOIN_HEADER``).
    Returns a lease only when this duplicate is the one that runs the body.
    """
    task = duplicate.task
    if duplicate.is_copy and outcome_stored(task, duplicate.request):
        skip(duplicate)  # its own task id already ended: the copy must store nothing
    earlier = str(celery_api.header(duplicate.request, JOIN_HEADER) or "")
    if earlier and earlier != duplicate.holder.task_id:
        _join_if_stored(duplicate, earlier, grace=0.0)
    following = duplicate.holder.task_id
    deadline = time.monotonic() + duplicate.options.wait_timeout
    duplicate.announce("join")
    with release_notifications(duplicate, {JOIN_HEADER: following}) as pubsub:
        try:
            while True:
                outcome = acquire()
                if isinstance(outcome, Lease):
                    return _take_over(duplicate, following, outcome)
                if outcome.task_id != following:
                    # the execution followed is gone; another holds the lock (maybe a joiner
                    # that took over): take the outcome if it is stored, else follow the new one
                    _join_if_stored(duplicate, following, grace=0.0)
                    following = outcome.task_id
                if not waited_for(duplicate, outcome, pubsub, deadline):
                    break
        except LockBackendUnavailable as exc:
            retry(duplicate, exc, extra_headers={JOIN_HEADER: following})
    log.info(
        "task %s: joined %s for %.1fs without an outcome; retrying later",
        duplicate.label,
        following,
        duplicate.options.wait_timeout,
    )
    retry(duplicate, extra_headers={JOIN_HEADER: following})


def _take_over(duplicate: Duplicate, following: str, lease: Lease) -> Lease:
    """This joiner holds the lock the execution it followed released: join that one's
    outcome if it comes within the grace, else return the lease to run the body."""
    try:
        _join_if_stored(duplicate, following, grace=OUTCOME_GRACE)
    except BaseException:
        # after the outcome is stored: the joiners its release wakes find it
        try:
            lease.release()
        except LockError as exc:  # the lease expires by itself; the outcome matters more
            log.warning("task %s: release of %s failed (%s)", duplicate.label, lease.key, exc)
        raise
    log.warning(
        "task %s: %s ended without storing an outcome; running the body",
        duplicate.label,
        following or "the holder",
    )
    return lease


def _join_if_stored(duplicate: Duplicate, task_id: str, *, grace: float) -> None:
    _join_outcome(duplicate.task, duplicate.request, task_id, duplicate.holder.key, grace)


def _join_outcome(task: Any, request: Any, task_id: str, key: str, grace: float) -> None:
    """If ``task_id`` has a ready state (read for up to ``grace`` seconds), end with it as
    the outcome of ``request`` (raises ``Ignore``); else return."""
    if not task_id or task_id == request.id:
        return
    label = f"{task.name}[{request.id}]"
    stored = None
    for read in range(1 + int(grace / OUTCOME_POLL)):  # bounded: the grace, in polls
        if read:
            time.sleep(OUTCOME_POLL)
        try:
            stored = celery_api.stored_outcome(task, task_id)
        except BACKEND_ERRORS as exc:
            raise LockBackendUnavailable(
                f"task {label}: cannot read the outcome of {task_id} to join it ({exc})", key
            ) from exc
        if stored is not None:
            break
    if stored is None:
        return
    state, result = stored
    if celery_api.died_without_outcome(state, result):
        # its process died under it: the body never ended, so there is nothing to join; one
        # joiner (the one that takes the lock) runs it and the others join that run
        log.info("task %s: %s died without an outcome (%s)", label, task_id, type(result).__name__)
        return
    log.info("task %s: joined %s, which ended in %s", label, task_id, state)
    celery_api.finish_as(task, request, state, result)
    celery_api.logged_already(request.id)
    raise Ignore(f"joined {task_id} ({state})")


def rejoin(task: Any, request: Any) -> None:
    """A ``join`` duplicate's lock retry that took the lock: if the execution it joined ended
    with an outcome while the retry was on its way, end with that outcome (``Ignore``; the
    caller's scope releases the lock after it is stored), else run the body."""
    if request.is_eager:
        return
    joined = str(celery_api.header(request, JOIN_HEADER) or "")
    if not joined:
        return
    key = request.lock.key
    try:
        _join_outcome(task, request, joined, key, OUTCOME_GRACE)
    except LockBackendUnavailable as exc:
        # whether it ended is unknown: running could run the body twice; retry later
        holder = LockHolder.unknown(key, joined)
        duplicate = Duplicate(task, request, task.lock_options, request.lock.name, holder)
        retry(duplicate, exc, extra_headers={JOIN_HEADER: joined})
