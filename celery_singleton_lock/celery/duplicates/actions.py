"""The actions the duplicate policies (:mod:`.policies`) are made of: skip, fail, retry and
wait, and ``Duplicate``, the call that found its lock held.

Each action either returns a lease (``wait`` got the lock) or ends the execution by raising
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

from celery_singleton_lock.celery import celery_api
from celery_singleton_lock.celery.celery_api import ignores_result
from celery_singleton_lock.celery.duplicates import enqueue
from celery_singleton_lock.celery.duplicates.redelivery import (
    BACKOFF_HEADER,
    COPY_HEADER,
    RETRY_HEADER,
    is_marked_copy,
    lock_retries,
    outcome_stored,
)
from celery_singleton_lock.celery.duplicates.skip_log import SkipLog
from celery_singleton_lock.celery.observe import events
from celery_singleton_lock.celery.signals import lock_duplicate
from celery_singleton_lock.engine import (
    AcquireResult,
    Lease,
    LockHolder,
    wait_for_release,
)
from celery_singleton_lock.errors import (
    DuplicateTaskError,
    DuplicateTaskSkipped,
    LockBackendUnavailable,
    LockError,
)

log = logging.getLogger("celery_singleton_lock.duplicate")
#: a skip's WARNING, once per burst of skips of one key
SKIPS = SkipLog(log)

#: seconds a lock retry for a cooldown's end (or a rate window's) is sent after it, so that it
#: finds the key gone (the window slid)
COOLDOWN_MARGIN = 0.05
#: at most this many seconds over which the lock retries told the same instant (a cooldown's
#: end, a rate's next start) are spread: woken together, all but one would be refused again
SPREAD_MAX = 1.0


def backoff_delay(
    attempt: int, base: float, cap: float, rng: Callable[[], float] = random.random
) -> float:
    """Exponential backoff with full jitter: uniform in ``[0, min(cap, base * 2**attempt))``."""
    return float(rng() * min(cap, base * (2 ** min(attempt, 60))))


def due_delay(
    holder: LockHolder, options: Any, rng: Callable[[], float] = random.random
) -> Optional[float]:
    """Seconds until the lock can be had, as the refusal told: a cooldown's end, the rate's next
    start; jittered over one start's share of the period (at most :data:`SPREAD_MAX`) so that
    the calls refused together do not all come back at once. None for a running holder,
    whose end nobody knows: back off then."""
    share: float  # the period one start has, on average
    if holder.ttl is None:
        return None
    if holder.paused:  # all come back when the pause ends: spread over a second
        share = SPREAD_MAX
    elif holder.over_rate and options.rate is not None:
        share = options.rate[1] / options.rate[0]
    elif holder.cooling and options.cooldown:
        share = options.cooldown
    else:
        return None
    return holder.ttl + COOLDOWN_MARGIN + rng() * min(SPREAD_MAX, share)


def reserved_for(holder: LockHolder) -> Optional[str]:
    """The task id of the parked call a hand-off reservation keeps the lock (or slot) for, or
    None if a running call holds it. A reservation (engine/lua/includes/handoff.lua,
    slot_queue.lua) stores pid 0, no host and the parked call's task id: no process holds it,
    so "task ... on ? pid 0" would name a run that does not exist."""
    if holder.pid == 0 and not holder.host and holder.task_id and not holder.cooling:
        return holder.task_id
    return None


def holding(holder: LockHolder) -> str:
    """What the lock is doing, for "lock K ...": "held by <describe>", or "reserved for parked
    call <id>" while the release hands it to the oldest parked call."""
    parked = reserved_for(holder)
    if parked is not None:
        ttl = "" if holder.ttl is None else f" ({holder.ttl:.1f}s left to start)"
        return f"reserved for parked call {parked}{ttl}"
    return f"held by {describe(holder)}"


def describe(holder: LockHolder) -> str:
    """Who holds the lock, to follow "held by": a running task, or no one (a rate window, a
    hand-off reservation, or a cooldown, whose holder fields are those of the run that
    ended)."""
    if holder.paused:
        until = "until resumed" if holder.ttl is None else f"for {holder.ttl:.1f}s more"
        return f"no one: its task or group is paused {until} (celery locks pause, pause_for)"
    if holder.over_rate:
        return f"no one: the key's lock_rate allows its next start in {holder.ttl or 0:.1f}s"
    ttl = "no TTL" if holder.ttl is None else f"{holder.ttl:.1f}s left"
    parked = reserved_for(holder)
    if parked is not None:
        return f"no one yet: it is reserved for parked call {parked} ({ttl})"
    run = f"task {holder.task_id or '?'} on {holder.host or '?'}"
    if holder.cooling:
        return f"no one: the key is in its lock_cooldown after the run of {run} ended ({ttl})"
    return f"{run} pid {holder.pid if holder.pid is not None else '?'} ({ttl})"


@dataclass
class Duplicate:
    """One execution that found its lock held."""

    task: Any
    request: Any
    #: the task's ``LockOptions`` (not imported: they import the policies)
    options: Any
    name: str
    holder: LockHolder
    #: why the call cannot run now: "held" (another execution holds the lock), "limit"
    #: (every one of the key's lock_limit slots is held), "cooldown" (the key is in the
    #: cooldown after a run), "rate" (the key's lock_rate allows no start now)
    reason: str = "held"

    @property
    def is_copy(self) -> bool:
        """This is a copy of an execution that was running under the same task id (a broker
        redelivery): it must never store a state, which belongs to that execution."""
        same_id = bool(self.holder.task_id) and self.holder.task_id == self.request.id
        return same_id or is_marked_copy(self.request)

    @property
    def label(self) -> str:
        return f"{self.task.name}[{self.request.id}]"

    def announce(self, action: str, reason: Optional[str] = None) -> None:
        """Signal ``lock_duplicate`` and send the ``lock-duplicate`` event, saying why
        the call could not run now: ``reason``, else this duplicate's own (``self.reason``);
        the metrics label duplicates with it."""
        request, reason = self.request, reason or self.reason
        events.send_event(
            self.task,
            events.DUPLICATE,
            task_id=request.id,
            hostname=request.hostname or "",
            key=self.holder.key,
            holder=self.holder.task_id,
            action=action,
            reason=reason,
        )
        if lock_duplicate.receivers:
            lock_duplicate.send(
                sender=self.task,
                task_id=self.request.id,
                key=self.holder.key,
                holder=self.holder.as_dict(),
                action=action,
                reason=reason,
            )


def skip(duplicate: Duplicate) -> NoReturn:
    """End without running the body; store ``DuplicateTaskSkipped`` as the outcome, in state
    REVOKED (ready, not failed: ``get()`` raises it, naming the holder)."""
    task, request, holder = duplicate.task, duplicate.request, duplicate.holder
    message = f"task {duplicate.label} skipped: lock {holder.key} is held by {describe(holder)}"
    SKIPS.skipped(holder.key, message)
    duplicate.announce("skip")
    # Store the skip unless the outcome belongs to another execution of this task id: the
    # holder itself, or an original that already finished. REVOKED, not FAILURE: not run on
    # purpose, which failure dashboards and alerts must not count; get() still raises it.
    if holder.task_id != request.id:
        if ignores_result(task, request):
            ends_here = not duplicate.is_copy
        else:
            ends_here = not (duplicate.is_copy and outcome_stored(task, request))
            if ends_here:
                celery_api.store_not_run(
                    task, request, DuplicateTaskSkipped(message, holder.key, holder.as_dict())
                )
        if ends_here:
            events.announce_revoked(
                task, task_id=request.id, hostname=request.hostname or "", reason="skipped"
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
        if options.dedupe_on_enqueue and not request.is_eager:
            # its acquire kept the queued marker for the re-send that will not come
            enqueue.forget_discarded(task, request)
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
    backoffs = lock_retries(request, BACKOFF_HEADER)
    countdown = due_delay(holder, options)  # no polling, and no backoff grown by waiting
    if countdown is None:
        countdown = backoff_delay(backoffs, options.retry_backoff, options.retry_backoff_max)
        backoffs += 1
    if cause is None:
        log.info(
            "task %s: lock %s; lock retry %d in %.2fs",
            duplicate.label,
            holding(holder),
            attempt + 1,
            countdown,
        )
        duplicate.announce("retry")
    headers = {
        **(getattr(request, "headers", None) or {}),
        **(extra_headers or {}),
        RETRY_HEADER: attempt + 1,
        BACKOFF_HEADER: backoffs,
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
    except celery_api.STORE_ERRORS as exc:  # the retry message matters more than the state
        log.warning("task %s[%s]: cannot store RETRY (%r)", task.name, request.id, exc)


@contextlib.contextmanager
def release_notifications(
    duplicate: Duplicate, extra_headers: Optional[dict[str, Any]] = None
) -> Iterator[Any]:
    """A subscription to the lock's releases, closed at the end. A lock server unreachable
    now sends the duplicate on a lock retry, as the acquire's own outage does."""
    locker = duplicate.task.lock_locker
    try:
        pubsub = locker.subscribe_releases(duplicate.name)
    except LockBackendUnavailable as exc:
        retry(duplicate, exc, extra_headers=extra_headers)
    try:
        yield pubsub
    finally:
        pubsub.close()


def waited_for(duplicate: Duplicate, holder: LockHolder, pubsub: Any, deadline: float) -> bool:
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
    with release_notifications(duplicate) as pubsub:
        try:
            while True:
                outcome = acquire()
                if isinstance(outcome, Lease):
                    return outcome
                if not waited_for(duplicate, outcome, pubsub, deadline):
                    break
        except LockBackendUnavailable as exc:
            retry(duplicate, exc)
    log.info(
        "task %s: waited %.1fs for the lock; retrying later",
        duplicate.label,
        duplicate.options.wait_timeout,
    )
    retry(duplicate)
