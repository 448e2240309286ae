"""Enqueue-time deduplication (opt-in ``dedupe_on_enqueue``): a call whose lock name is
already queued or running publishes nothing and gets that task's ``AsyncResult``. With
``"until_started"`` only a queued call that has not started counts (``Dedupe.
running_is_duplicate`` False); a call that will run later (a lock retry, a wait) stays queued
while the lock is held, as its acquire keeps the marker then (see ``execution.request_base``).

At ``apply_async()`` one script call (``ENQUEUE``, see :mod:`..engine.scripts`) both checks
the lock name and, when it is free, writes a "queued" marker holding the new task id; only then
is the message published. The worker's acquire deletes the marker in its own round trip, so the
run-time cost is unchanged. A failed publish removes the marker before the error reaches the
caller (compare-and-delete by task id), and so does the worker when it discards a revoked
message; a message that never reaches a worker (purged, lost) leaves a marker that expires
after ``lock_queued_ttl`` plus its countdown, or that ``RedisLocker.clear_queued`` removes.

Not deduplicated here (the run-time lock and its policy still apply when they run):
``send_task`` by name (no task object at the caller), eager calls, re-sends of an execution
under its own id (``self.retry``, lock retries), which are never blocked by their own marker,
and, unless the ``Dedupe`` says ``canvas``, calls inside a canvas (group, chord, chain, or with
``link``/``link_error``): their task ids are already part of a result the caller holds, which
a duplicate left unpublished would never complete. The drop-ins of :mod:`..compat` dedupe
those too, as the packages they replace do.
"""

from __future__ import annotations

import datetime
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from celery.utils import uuid

from celery_singleton_lock.celery.config.lockers import locker_for
from celery_singleton_lock.engine import required
from celery_singleton_lock.errors import LockBackendUnavailable, LockError

log = logging.getLogger("celery_singleton_lock.enqueue")

#: ``apply_async`` options that make a call part of a canvas.
CANVAS_OPTIONS = ("group_id", "chord", "chain", "link", "link_error")


def in_canvas(options: Mapping[str, Any]) -> bool:
    """True if the call belongs to a group, chord or chain, or has callbacks."""
    return any(options.get(option) for option in CANVAS_OPTIONS)


def sent_by_worker(app: Any, options: Mapping[str, Any]) -> bool:
    """True if a worker is sending this call as a callback (``link``/``link_error``) or the
    next chain step of the task it has just run: Celery's tracer passes that task's id as
    ``parent_id`` (a body's own ``apply_async`` names none). Whatever such a call raises
    becomes the failure of the task that ran, whose body succeeded."""
    parent_id = options.get("parent_id")
    if not parent_id:
        return False
    current = app.current_worker_task
    return current is not None and getattr(current.request, "id", None) == parent_id


def delay_of(options: Mapping[str, Any], now: Callable[[], datetime.datetime]) -> float:
    """Seconds until the message is due (its ``countdown`` or ``eta``), 0 if due now."""
    countdown = options.get("countdown")
    if isinstance(countdown, (int, float)) and not isinstance(countdown, bool):
        return max(0.0, float(countdown))
    eta = options.get("eta")
    if isinstance(eta, str):
        try:
            eta = datetime.datetime.fromisoformat(eta)
        except ValueError:
            return 0.0
    if isinstance(eta, datetime.datetime):
        if eta.tzinfo is None:
            eta = eta.replace(tzinfo=datetime.timezone.utc)
        return max(0.0, (eta - now()).total_seconds())
    return 0.0


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


@dataclass(frozen=True)
class Dedupe:
    """How one ``apply_async`` call is deduplicated (see :meth:`LockedTask.enqueue_dedupe`)."""

    #: seconds the queued marker lives if the message never reaches a worker (the message's
    #: countdown is added)
    queued_ttl: float
    #: what the call returns when it is a duplicate: ``(existing task id, lock name)`` in
    #: (it may raise instead); default: the existing task's ``AsyncResult``
    on_duplicate: Optional[Callable[[str, str], Any]] = None
    #: a running execution counts as a duplicate, not only a queued message
    running_is_duplicate: bool = True
    #: also calls inside a canvas or with callbacks (see the module docstring)
    canvas: bool = False
    #: seconds to wait for the queued or running call to end before the call counts as a
    #: duplicate (celery-once's ``blocking``/``blocking_timeout``: it waited, then published)
    wait: float = 0.0


#: Seconds between two asks while a call waits for its duplicate to end (``Dedupe.wait``):
#: redis-py's ``Lock`` polls at 0.1 s, which is what celery-once's ``blocking`` used.
WAIT_STEP = 0.1


def publish_once(
    task: Any,
    args: Any,
    kwargs: Any,
    task_id: Optional[str],
    options: Mapping[str, Any],
    publish: Callable[[str], Any],
    dedupe: Dedupe,
) -> Any:
    """Publish the call through ``publish(task_id)`` unless its lock name is already queued
    or running; return the ``AsyncResult`` of the published task, or what
    ``dedupe.on_duplicate`` makes of the existing one.

    Raises:
        LockError: the call's lock name cannot be built from its arguments.
        whatever ``publish`` raises, once the marker it wrote is removed again.
    """
    name = task.lock_options.keyer.name(tuple(args or ()), dict(kwargs or {}))
    task_id = task_id or uuid()
    # Celery's retry and the lock retries send the running execution again under its id.
    resend = task_id == getattr(task.request, "id", None)
    ttl = dedupe.queued_ttl + delay_of(options, _utcnow)
    try:
        # made on first use: a server that cannot be reached then is an outage like any other
        locker = locker_for(task.app)
        markers = required(locker.markers, locker, "dedupe_on_enqueue", "enqueue_markers")
        existing = markers.enqueue(
            name, task_id, ttl, resend=resend, running=dedupe.running_is_duplicate
        )
        # bounded by dedupe.wait: each ask is the same one script call, which writes the
        # marker (and so ends the wait) the moment the other call has ended
        if existing is not None and dedupe.wait > 0:
            deadline = time.monotonic() + dedupe.wait
            while existing is not None and time.monotonic() < deadline:
                time.sleep(min(WAIT_STEP, max(0.0, deadline - time.monotonic())))
                existing = markers.enqueue(
                    name, task_id, ttl, resend=resend, running=dedupe.running_is_duplicate
                )
    except LockBackendUnavailable as exc:
        # The run-time lock still guards the body: publish rather than lose the call.
        log.warning(
            "task %s[%s]: cannot check for a queued duplicate (%s); publishing it anyway",
            task.name,
            task_id,
            exc,
        )
        return publish(task_id)
    if existing is not None:
        log.debug(
            "task %s: lock %s already queued or running as %s; nothing published",
            task.name,
            name,
            existing,
        )
        if dedupe.on_duplicate is not None:
            return dedupe.on_duplicate(existing, name)
        return task.AsyncResult(existing)
    try:
        return publish(task_id)
    except BaseException:
        try:
            markers.clear_queued(name, task_id)
        except LockError as exc:
            log.error(
                "task %s[%s]: publishing failed and its queued marker could not be removed "
                "(%s); it expires within %.0fs",
                task.name,
                task_id,
                exc,
                ttl,
            )
        raise


def forget_discarded(task: Any, request: Any) -> bool:
    """Remove the queued marker of a message the worker discarded without running it (a
    revoked or expired task); True if it was removed. Never raises."""
    try:
        name = task.lock_options.keyer.name(tuple(request.args or ()), dict(request.kwargs or {}))
        locker = locker_for(task.app)
        markers = required(locker.markers, locker, "dedupe_on_enqueue", "enqueue_markers")
        return markers.clear_queued(name, request.id)
    except LockError as exc:
        log.error(
            "task %s[%s]: discarded, but its queued marker could not be removed (%s); it "
            "expires after lock_queued_ttl",
            task.name,
            request.id,
            exc,
        )
        return False
