"""The acquire a locked task's call sends: what every call of the task asks (made once per
resolved options, see :func:`request_base`), then the call's own name, owner and time limit.

A worker's call of a mutex (no parking, one holder) goes through the locker's prepared acquire
(:func:`prepared`, ``LockBackend.prepare``: checked and packed once); the others add their own
fields to the request (``AcquireRequest.for_call``), in ``LockedTask._acquire``."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from celery_singleton_lock.celery.config import lockers
from celery_singleton_lock.celery.config.lockers import locker_for
from celery_singleton_lock.celery.config.resolution import LockOptions
from celery_singleton_lock.engine import AcquireRequest, LockBackend, PreparedAcquire


def request_base(task: Any, options: LockOptions, has_id: bool, eager: bool) -> AcquireRequest:
    """What every acquire of ``task`` (a ``LockedTask``: not imported, it imports this module)
    asks, before the call's own name, owner and time limit; made once per resolved options for
    a worker's call (a task id, not eager)."""
    cached: Optional[tuple[LockOptions, AcquireRequest]] = task._acquire_base
    worker_call = has_id and not eager
    if worker_call and cached is not None and cached[0] is options:
        return cached[1]
    # A redelivered message of an acks_late task may repeat an execution that already
    # ran to the end: the acquire itself looks for that execution's finish record. A
    # message a parking policy (queue, replace) hands the lock twice must not run twice.
    unless_finished = bool(task.acks_late and has_id and options.finished_ttl) or (
        worker_call and options.policy.parks
    )
    # This message is no longer queued: the acquire deletes its marker (enqueue dedupe).
    take_queued = bool(options.dedupe_on_enqueue and worker_call)
    # A call that will run later stays queued while the lock is held: a retry's re-send, and
    # with 'until_started' a wait too (only a started call lets the next one be published).
    policy = options.policy
    later = policy.resends or (options.dedupe_until_started and policy.waits_in_place)
    base = AcquireRequest(
        "",
        options.ttl,
        fencing=options.fencing,
        on_lost=task._on_lock_lost,
        unless_finished=unless_finished,
        min_replicas=options.min_replicas,
        replica_timeout=options.min_replicas_timeout,
        take_queued=take_queued,
        queued_while_held=take_queued and later,
        reservation_ttl=options.send_window,
        finished_ttl=options.finished_ttl or 3600.0,
        rate=options.rate,
        cap_key=options.cap_key,
        slotted=options.slotted,
    )
    if worker_call:
        task._acquire_base = (options, base)  # per task instance: on_lost is its own
    return base


def prepared(task: Any, options: LockOptions) -> PreparedMutex:
    """The locker and prepared acquire of a worker's mutex call of ``task``, made once per
    resolved options and locker; kept on the task as ``_prepared_acquire``. A forked child, or
    a test, makes lockers of its own: the app's locker is known unchanged while
    ``lockers.generation`` is; a subclass's own ``lock_locker`` is read at every call.

    Raises:
        LockBackendUnavailable: making the locker asked the server, which did not answer.
    """
    cached: Optional[PreparedMutex] = task._prepared_acquire
    if task._app_locker:
        if (
            cached is not None
            and cached.options is options
            and cached.generation == lockers.generation
        ):
            return cached
        locker = locker_for(task.app)  # may make it: the generation changes then
        generation = lockers.generation
        keep = locker_for(task.app) is locker  # else it changed meanwhile: not kept
    else:
        locker = task.lock_locker
        if cached is not None and cached.options is options and cached.locker is locker:
            return cached
        generation, keep = lockers.generation, True
    plan = PreparedMutex(
        options, generation, locker, locker.prepare(request_base(task, options, True, False))
    )
    if keep:
        task._prepared_acquire = plan
    return plan


class PreparedMutex(NamedTuple):
    """What a worker's mutex call of a task acquires through (see :func:`prepared`)."""

    options: LockOptions
    generation: int
    locker: LockBackend
    acquire: PreparedAcquire
