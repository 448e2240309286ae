"""Policy ``replace`` (and ``lock_debounce``): the newest duplicate wins.

While one call of a lock runs, at most one call of it waits, parked in Redis as with policy
``queue`` (:mod:`.parking`): it holds no worker slot and polls nothing. A newer duplicate takes
the waiting place in the same script as its acquire (the engine's ``ACQUIRE_OR_REPLACE``);
the call it displaced will never run, and ends at once as REVOKED with the reason
``"superseded"``, as ``celery.control.revoke`` would end it: ``AsyncResult.get()`` raises
``TaskRevokedError('superseded')``; its ``link`` and ``link_error`` callbacks are not called
and the rest of its chain is not sent (Celery calls no callback of a revoked task); a chord it
belongs to fails without running its body, as with any revoked header task. A revoke is also
broadcast, so a copy of its message delivered again is discarded by the worker.

When the running call ends, its release reserves the lock for the waiting call and sends its
message again (the waiting call runs with its own, the newest, arguments). With
``lock_debounce`` a call waits even on a free lock, until its due time; the hand-off sweeper
of any worker's main process sends it then (or the release of a run going on at that time).
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn

from celery.app.task import Context
from celery.exceptions import Ignore
from kombu.exceptions import KombuError
from kombu.utils import json

from celery_singleton_lock.celery import celery_api
from celery_singleton_lock.celery.duplicates.policies import Duplicate, describe
from celery_singleton_lock.engine import Parked

log = logging.getLogger("celery_singleton_lock.duplicate")

#: The reason stored with the REVOKED state of a call a newer one took the place of.
SUPERSEDED = "superseded"

#: What storing the state or broadcasting the revoke may raise (a backend or broker down).
_MARKING_ERRORS: tuple[type[BaseException], ...] = (KombuError, *celery_api.BACKEND_ERRORS)


def _request_of(message: bytes) -> Context:
    """The request a displaced parked ``message`` would have run as: what marking it revoked
    needs (its id, and its group and chord, so that a chord it belongs to learns of it)."""
    task_id, _, body = message.partition(b"\n")
    try:
        options = dict(json.loads(body.decode("utf-8")).get("options") or {})  # type: ignore[no-untyped-call]
    except (ValueError, TypeError, UnicodeDecodeError, AttributeError):
        options = {}
    return Context(
        id=task_id.decode("utf-8", "replace"),
        group=options.get("group_id"),
        group_index=options.get("group_index"),
        chord=options.get("chord"),
        root_id=options.get("root_id"),
        parent_id=options.get("parent_id"),
        ignore_result=bool(options.get("ignore_result")),
    )


def supersede(task: Any, message: bytes, by: str, key: str, hostname: str = "") -> None:
    """End the call of the displaced parked ``message`` as REVOKED ("superseded"), and
    broadcast its revoke. Never raises: a failure is logged (the call stays PENDING)."""
    request = _request_of(message)
    log.info("task %s[%s] superseded by %s (lock %s): REVOKED", task.name, request.id, by, key)
    try:
        if not request.ignore_result and not task.ignore_result:
            task.backend.mark_as_revoked(request.id, SUPERSEDED, request=request)
        task.app.control.revoke(request.id)
    except _MARKING_ERRORS as exc:
        log.error(
            "task %s[%s] was superseded by %s but could not be marked REVOKED (%s: %s)",
            task.name,
            request.id,
            by,
            type(exc).__name__,
            exc,
        )
    celery_api.send_event(
        task, "task-lock-superseded", task_id=request.id, hostname=hostname, key=key, by=by
    )


def wait_newest(duplicate: Duplicate, parked: Parked) -> NoReturn:
    """This call waits behind the lock (parked by the acquire itself), in place of the calls
    it displaced, which end superseded; end now, holding no worker slot."""
    for message in parked.displaced:
        request = duplicate.request
        supersede(duplicate.task, message, request.id, parked.key, request.hostname or "")
    debounce = duplicate.options.debounce
    reason = "held"
    if parked.holder is not None:
        why = f"held by {describe(parked.holder)}"
    elif debounce:
        why, reason = f"free, but calls are debounced for {debounce:g}s", "debounce"
    else:
        why = "left by a holder that did not hand it on"
    log.info("task %s: lock %s %s; waiting as the newest call", duplicate.label, parked.key, why)
    duplicate.announce("replace", reason)
    celery_api.logged_already(duplicate.request.id)
    raise Ignore(f"waiting behind lock {parked.key} as the newest call")
