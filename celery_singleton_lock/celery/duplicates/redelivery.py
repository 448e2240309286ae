"""Redelivered and re-sent copies of a call: recognising a message that may repeat an
execution of its task id, and whether that execution's outcome is already stored.

A copy must never run the body again once its task id ran to the end, and must never store a
state that belongs to the execution it repeats."""

from __future__ import annotations

import logging
from typing import Any

from celery_singleton_lock.celery import celery_api
from celery_singleton_lock.celery.celery_api import BACKEND_ERRORS

log = logging.getLogger("celery_singleton_lock.duplicate")

#: Message header marking a copy of an execution that was running under the same task id
#: (a broker redelivery of an ``acks_late`` task): it must not run again once that finished.
COPY_HEADER = "singleton_lock_copy"


def is_marked_copy(request: Any) -> bool:
    """The message may repeat an execution that already ran: the broker redelivered it
    (``acks_late``), or a copy re-sent it under the same task id."""
    return celery_api.is_redelivered(request) or bool(celery_api.header(request, COPY_HEADER))


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


#: Message header counting lock retries; kept apart from Celery's own ``retries``.
RETRY_HEADER = "singleton_lock_retries"
#: Message header counting the lock retries that backed off (the backoff's exponent): a
#: retry sent for when the lock can be had (a cooldown's end, a rate's next start) counts
#: against the retry budget, not here.
BACKOFF_HEADER = "singleton_lock_backoffs"


def lock_retries(request: Any, header: str = RETRY_HEADER) -> int:
    """How many lock retries the execution behind ``request`` has had (``header``: how many
    of them backed off)."""
    try:
        return max(0, int(celery_api.header(request, header) or 0))
    except (TypeError, ValueError):
        return 0
