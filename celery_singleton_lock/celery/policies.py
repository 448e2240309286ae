"""What a duplicate does when its lock is held: skip, retry, wait, fail, join or queue.

Each policy either returns a lease (``wait`` got the lock) or ends the execution by raising
what Celery's tracer understands: ``Ignore`` after storing the state first (skip: the outcome,
so ``AsyncResult.get()`` never hangs; retry: RETRY, then a new message is sent with a
countdown), or an exception (fail).

A lock retry is not a Celery retry: it does not count against the task's ``max_retries`` and
does not call ``on_retry`` or send ``task_retry`` (``lock_duplicate`` with ``action="retry"``
announces it). Celery's retry stores RETRY after sending the new message; storing it before
is what keeps a fast new attempt's SUCCESS from being overwritten.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NoReturn, Optional

from celery.exceptions import Ignore

from ..engine import Lease, LockHolder
from ..engine.lease import Parked
from ..engine.locker import AcquireResult
from ..engine.waiting import subscribe_releases, wait_for_release
from ..errors import DuplicateTaskError, DuplicateTaskSkipped, LockBackendUnavailable, LockError
from . import celery_api, handoff
from .celery_api import BACKEND_ERRORS, ignores_result
from .options import LockOptions
from .signals import lock_duplicate

log = logging.getLogger("celery_singleton_lock.duplicate")

#: Message header counting lock retries; kept apart from Celery's own ``retries``.
RETRY_HEADER = "singleton_lock_retries"

#: Message header of a ``join`` duplicate's lock retry: the task id it was joining, whose
#: outcome it takes if that execution ended while the retry was on its way.
JOIN_HEADER = "singleton_lock_joins"

#: Seconds a joiner that took the lock reads the holder's state for its outcome: the holder
#: releases as its body ends, before the tracer stores the outcome (after the callbacks).
OUTCOME_GRACE = 2.0
OUTCOME_POLL = 0.05

#: Message header marking a copy of an execution that was running under the same task id
#: (a broker redelivery of an ``acks_late`` task): it must not run again once that finished.
COPY_HEADER = "singleton_lock_copy"


def backoff_delay(
    attempt: int, base: float, cap: float, rng: Callable[[], float] = random.random
) -> float:
    """Exponential backoff with full jitter: uniform in ``[0, min(cap, base * 2**attempt))``."""
    return float(rng() * min(cap, base * (2 ** min(attempt, 60))))


def lock_retries(request: Any) -> int:
    """How many lock retries the execution behind ``request`` has had."""
    try:
        return max(0, int(celery_api.header(request, RETRY_HEADER) or 0))
    except (TypeError, ValueError):
        return 0


def describe(holder: LockHolder) -> str:
    ttl = "no TTL" if holder.ttl is None else f"{holder.ttl:.1f}s left"
    return f"task {holder.task_id or '?'} on {holder.host or '?'} pid {holder.pid} ({ttl})"


@dataclass
class Duplicate:
    """One execution that found its lock held."""

    task: Any
    request: Any
    options: LockOptions
    name: str
    holder: LockHolder

    @property
    def is_copy(self) -> bool:
        """This is a copy of an execution that was running under the same task id (a broker
        redelivery): it must never store a state, which belongs to that execution."""
        same_id = bool(self.holder.task_id) and self.holder.task_id == self.request.id
        return same_id or is_marked_copy(self.request)

    @property
    def label(self) -> str:
        return f"{self.task.name}[{self.request.id}]"

    def announce(self, action: str) -> None:
        """Signal ``lock_duplicate`` and send the ``task-lock-duplicate`` event."""
        request = self.request
        celery_api.send_event(
            self.task,
            "task-lock-duplicate",
            task_id=request.id,
            hostname=request.hostname or "",
            key=self.holder.key,
            holder=self.holder.task_id,
            action=action,
        )
        if lock_duplicate.receivers:
            lock_duplicate.send(
                sender=self.task,
                task_id=self.request.id,
                key=self.holder.key,
                holder=self.holder.as_dict(),
                action=action,
            )


def skip(duplicate: Duplicate) -> NoReturn:
    """End without running the body; store ``DuplicateTaskSkipped`` as the outcome."""
    task, request, holder = duplicate.task, duplicate.request, duplicate.holder
    message = f"task {duplicate.label} skipped: lock {holder.key} is held by {describe(holder)}"
    log.warning(message)
    duplicate.announce("skip")
    # Store the skip unless the outcome belongs to another execution of this task id: the
    # holder itself, or an original that already finished.
    if (
        holder.task_id != request.id
        and not ignores_result(task, request)
        and not (duplicate.is_copy and outcome_stored(task, request))
    ):
        celery_api.store_failure_quietly(
            task, request, DuplicateTaskSkipped(message, holder.key, holder.as_dict())
        )
    celery_api.logged_already(request.id)
    raise Ignore(message)


def fail(duplicate: Duplicate) -> NoReturn:
    holder = duplicate.holder
    duplicate.announce("fail")
    raise DuplicateTaskError(
        f"task {duplicate.label} refused to run: lock {holder.key} is held by "
        f"{describe(holder)} (on_duplicate='fail')",
        holder.key,
        holder.as_dict(),
    )


def queue(duplicate: Duplicate, parked: Parked) -> NoReturn:
    """The message is parked behind the lock (by the acquire itself): end now, holding no
    worker slot; the release before it sends it again (see :mod:`.handoff`). Its state is
    left as it is: it has not run yet."""
    if parked.handed is not None:
        # the lock was free but promised to an older parked message: this caller sends it
        handoff.publish(duplicate.task.app, parked.handed, duplicate.name)
    ahead = describe(duplicate.holder) if parked.holder is not None else "an older parked call"
    log.info(
        "task %s: lock %s held by %s; queued behind it (position %d)",
        duplicate.label,
        parked.key,
        ahead,
        parked.position,
    )
    duplicate.announce("queue")
    celery_api.logged_already(duplicate.request.id)
    raise Ignore(f"queued behind lock {parked.key} (position {parked.position})")


def retry(
    duplicate: Duplicate,
    cause: Optional[LockError] = None,
    *,
    extra_headers: Optional[dict[str, Any]] = None,
) -> NoReturn:
    """Send the execution again after a jittered backoff; fail once the budget is spent."""
    task, request, options = duplicate.task, duplicate.request, duplicate.options
    attempt = lock_retries(request)
    holder = duplicate.holder
    if options.max_retries is not None and attempt >= options.max_retries:
        if cause is not None:
            raise type(cause)(
                f"task {duplicate.label}: gave up after {attempt} lock retries "
                f"(lock_max_retries={options.max_retries}): {cause.message}",
                cause.key,
                cause.holder,
            )
        raise DuplicateTaskError(
            f"task {duplicate.label}: lock {holder.key} still held by {describe(holder)} "
            f"after {attempt} lock retries (lock_max_retries={options.max_retries})",
            holder.key,
            holder.as_dict(),
        )
    reason = cause or DuplicateTaskError(
        f"lock {holder.key} held by {describe(holder)}", holder.key, holder.as_dict()
    )
    if request.is_eager:
        # apply() would re-run the retry signature recursively, at once: the caller gets the
        # outcome instead (``handle`` has already waited for a held lock).
        raise reason
    countdown = backoff_delay(attempt, options.retry_backoff, options.retry_backoff_max)
    if cause is None:
        log.info(
            "task %s: lock held by %s; lock retry %d in %.2fs",
            duplicate.label,
            describe(holder),
            attempt + 1,
            countdown,
        )
        duplicate.announce("retry")
    headers = {
        **(getattr(request, "headers", None) or {}),
        **(extra_headers or {}),
        RETRY_HEADER: attempt + 1,
    }
    if duplicate.is_copy:
        headers[COPY_HEADER] = 1
    else:
        # RETRY is stored BEFORE the new message exists. Celery's own retry stores it after
        # sending, and a new message that runs at once can store SUCCESS in between: the
        # late RETRY then overwrites it and ``get()`` never returns. A copy stores nothing:
        # the state belongs to the execution it copies.
        _store_retry(task, request, reason)
    celery_api.send_again(task, request, countdown=countdown, headers=headers)
    celery_api.logged_already(request.id)
    raise Ignore(f"lock retry {attempt + 1} sent: {reason}")


def _store_retry(task: Any, request: Any, reason: LockError) -> None:
    """Store RETRY with ``reason`` as the state's result, unless results are ignored."""
    if ignores_result(task, request):
        return
    try:
        celery_api.store_retry(task, request, reason)
    except BACKEND_ERRORS as exc:  # the retry message matters more than the state
        log.warning("task %s[%s]: cannot store RETRY (%s)", task.name, request.id, exc)


@contextlib.contextmanager
def _release_notifications(
    duplicate: Duplicate, extra_headers: Optional[dict[str, Any]] = None
) -> Iterator[Any]:
    """A subscription to the lock's releases, closed at the end. A lock server unreachable
    now sends the duplicate on a lock retry, as the acquire's own outage does."""
    locker = duplicate.task.lock_locker
    try:
        pubsub = subscribe_releases(locker.client, locker.keys(duplicate.name).channel)
    except LockBackendUnavailable as exc:
        retry(duplicate, exc, extra_headers=extra_headers)
    try:
        yield pubsub
    finally:
        pubsub.close()


def _waited_for(duplicate: Duplicate, holder: LockHolder, pubsub: Any, deadline: float) -> bool:
    """Wait for ``holder`` to release (woken by its release, or at its TTL: a crashed holder
    publishes nothing); False, without waiting, once ``deadline`` has passed."""
    duplicate.holder = holder
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return False
    holder_ttl = holder.ttl if holder.ttl is not None else remaining
    wait_for_release(pubsub, min(remaining, holder_ttl + 0.01))
    return True


def wait(duplicate: Duplicate, acquire: Callable[[], AcquireResult]) -> Lease:
    """Block the worker slot until the lock is released or ``lock_wait_timeout`` passes.

    Woken by the release notification, and re-checking at the holder's remaining TTL (a
    crashed holder publishes nothing). Subscribing happens before each re-check, so a release
    between the check and the wait is never missed. Falls back to ``retry`` on timeout.
    """
    deadline = time.monotonic() + duplicate.options.wait_timeout
    duplicate.announce("wait")
    with _release_notifications(duplicate) as pubsub:
        try:
            while True:
                outcome = acquire()
                if isinstance(outcome, Lease):
                    return outcome
                if not _waited_for(duplicate, outcome, pubsub, deadline):
                    break
        except LockBackendUnavailable as exc:
            retry(duplicate, exc)
    log.info(
        "task %s: waited %.1fs for the lock; retrying later",
        duplicate.label,
        duplicate.options.wait_timeout,
    )
    retry(duplicate)


def join(duplicate: Duplicate, acquire: Callable[[], AcquireResult]) -> Lease:
    """End with the holder's outcome as this execution's own, without running the body.

    Waits for the release as ``wait`` does (up to ``lock_wait_timeout``), then reads the
    outcome the holder stored. A duplicate that takes the lock once the holder is gone reads
    it for up to ``OUTCOME_GRACE`` (the holder releases before its outcome is stored) and
    runs the body only if none comes: the holder died without one. Other joiners then follow
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
    with _release_notifications(duplicate, {JOIN_HEADER: following}) as pubsub:
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
                if not _waited_for(duplicate, outcome, pubsub, deadline):
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
    log.info("task %s: joined %s, which ended in %s", label, task_id, state)
    celery_api.finish_as(task, request, state, result)
    celery_api.logged_already(request.id)
    raise Ignore(f"joined {task_id} ({state})")


def rejoin(task: Any, request: Any) -> None:
    """A ``join`` duplicate's lock retry that took the lock: if the execution it joined ended
    with an outcome while the retry was on its way, end with that outcome (``Ignore``; the
    caller's scope releases the lock after it is stored), else run the body."""
    if task.lock_options.on_duplicate != "join" or request.is_eager:
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


def is_marked_copy(request: Any) -> bool:
    """The message may repeat an execution that already ran: the broker redelivered it
    (``acks_late``), or a copy re-sent it under the same task id."""
    return bool(celery_api.header(request, COPY_HEADER)) or celery_api.is_redelivered(request)


def outcome_stored(task: Any, request: Any) -> bool:
    """True if an outcome is stored under this request's task id (one backend read)."""
    try:
        return celery_api.outcome_is_stored(task, request.id)
    except BACKEND_ERRORS as exc:  # run rather than lose the task
        log.warning("task %s[%s]: cannot read its state (%s)", task.name, request.id, exc)
        return False


def already_ran(task: Any, request: Any, is_copy: bool) -> bool:
    """True if this message repeats an execution of its task id whose outcome is stored.

    Asked once the lock is held, of copies and of lock-retried ``acks_late`` messages only
    (one backend read): the broker may have handed the first delivery out again, and that
    copy may have run the body meanwhile. The finish record checked by the acquire itself
    (``unless_finished``) answers first; this covers an execution whose release could not
    record it (the lock server was down as it ended).
    """
    if is_copy or (task.acks_late and lock_retries(request)):
        return outcome_stored(task, request)
    return False


def handle(duplicate: Duplicate, acquire: Callable[[], AcquireResult]) -> Lease:
    """Apply the task's ``on_duplicate`` policy; returns a lease only if ``wait`` got one, or
    ``join`` found the holder gone without an outcome."""
    policy = duplicate.options.on_duplicate
    if policy in ("retry", "join", "queue") and duplicate.request.is_eager:
        # in eager mode, wait in place up to lock_wait_timeout, then fail (no result is
        # stored to join)
        policy = "wait"
    if policy in ("fail", "join", "queue") and duplicate.holder.task_id == duplicate.request.id:
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
    if policy == "queue":
        retry(duplicate)  # a call that could not be parked (see handoff.parked_message)
    return wait(duplicate, acquire)
