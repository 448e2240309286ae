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

The displacing script also records the displaced task id, for the finish records' lifetime,
and its message as left to mark. The worker marks it and clears that (:func:`wait_newest`);
if the worker dies in between, the hand-off sweeper of any worker's main process marks it a few
seconds later (:func:`mark_left`), so it never stays PENDING. A stale copy of a displaced call
(its message delivered again, or to a worker that missed the revoke) is refused by the acquire
and ends superseded again (:func:`end_stale_copy`): it never displaces the newer call.

Calls are ordered by when they were *sent*, not by when they reach the lock: ``apply_async``
stamps each call (:func:`stamped`, the message header :data:`SENT_HEADER`: the
producer's wall clock in microseconds, kept by Celery's retries and by the hand-off's
re-publish); a call sent without it (``send_task`` from another app) is stamped when the worker
first tries its lock. The acquire refuses a call sent before the newest
that waits, holds or held the lock: it ends superseded at once (:func:`end_stale_copy`).

When the running call ends, its release reserves the lock for the waiting call and sends its
message again (the waiting call runs with its own, the newest, arguments). With
``lock_debounce`` a call waits even on a free lock, until its due time; the hand-off sweeper
of any worker's main process sends it then (or the release of a run going on at that time).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, NoReturn, Optional

from celery.app.task import Context
from celery.exceptions import Ignore
from kombu.utils import json

from celery_singleton_lock.celery import celery_api
from celery_singleton_lock.celery.duplicates.actions import Duplicate, describe
from celery_singleton_lock.celery.observe import events
from celery_singleton_lock.engine import LockBackend, Parked, required
from celery_singleton_lock.errors import LockError

log = logging.getLogger("celery_singleton_lock.duplicate")

#: The reason stored with the REVOKED state of a call a newer one took the place of.
SUPERSEDED = "superseded"

#: The message header that says when a call was sent (see :func:`new_stamp`).
SENT_HEADER = "singleton_lock_sent"
_last_sent = [0]  # this process's last stamp, in microseconds: its stamps only grow


def new_stamp() -> str:
    """When a call is sent, as a string that sorts in sending order: 16 digits of epoch
    microseconds (this process's stamps grow even if its clock steps back), then its pid in
    hex, the tie-breaker between producers stamping the same microsecond."""
    micros = max(time.time_ns() // 1000, _last_sent[0] + 1)
    _last_sent[0] = micros
    return f"{micros:016d}.{os.getpid():x}"


def stamped(headers: Optional[dict[str, Any]]) -> dict[str, Any]:
    """``headers`` with their stamp if it is one (a retry, a hand-off's re-publish: still the
    call sent then), else with a new one: :func:`.policies.Replace.sending` stamps each call
    ``apply_async`` sends; a worker stamps a call sent without it (``send_task`` from another
    app) at its first acquire, in its request's headers: its parked message and retries keep it."""
    headers = headers or {}
    stamp = headers.get(SENT_HEADER)
    if isinstance(stamp, str) and len(stamp) > 16 and stamp[:16].isdigit():
        return headers
    return {**headers, SENT_HEADER: new_stamp()}


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


def supersede(task: Any, message: bytes, by: str, key: str, hostname: str = "") -> bool:
    """End the call of the displaced parked ``message`` as REVOKED ("superseded"), and
    broadcast its revoke. Never raises: False when it could not be marked (logged)."""
    return mark_superseded(task, _request_of(message), by, key, hostname)


def mark_superseded(task: Any, request: Any, by: str, key: str, hostname: str) -> bool:
    """Store REVOKED ("superseded") for ``request`` (unless its results are ignored) and
    broadcast its revoke; False when it could not be (logged). Never raises."""
    log.info("task %s[%s] superseded by %s (lock %s): REVOKED", task.name, request.id, by, key)
    try:
        if not request.ignore_result and not task.ignore_result:
            task.backend.mark_as_revoked(request.id, SUPERSEDED, request=request)
        task.app.control.revoke(request.id)
    except celery_api.STORE_ERRORS as exc:  # a broadcast's KombuError too (a broker down)
        log.error(
            "task %s[%s] was superseded by %s but could not be marked REVOKED (%s: %s)",
            task.name,
            request.id,
            by,
            type(exc).__name__,
            exc,
        )
        return False
    events.send_event(
        task, events.SUPERSEDED, task_id=request.id, hostname=hostname, key=key, by=by
    )
    events.announce_revoked(task, task_id=request.id, hostname=hostname, reason=SUPERSEDED)
    return True


def _cleared(task: Any, name: str, task_ids: list[str]) -> None:
    """Tell the lock server the displaced ``task_ids`` are marked; a failure leaves them to
    a sweeper, which marks them again (marking twice is harmless)."""
    if not task_ids:
        return
    try:
        locker = task.lock_locker
        required(locker.latest, locker, "on_duplicate='replace'", "parking").clear_superseded(
            name, task_ids
        )
    except LockError as exc:
        log.warning("superseded calls %s left to the sweeper: %s", ", ".join(task_ids), exc)


def wait_newest(duplicate: Duplicate, parked: Parked) -> NoReturn:
    """This call waits behind the lock (parked by the acquire itself), in place of the calls
    it displaced, which end superseded; end now, holding no worker slot."""
    request = duplicate.request
    marked = [
        _request_of(message).id
        for message in parked.displaced
        if supersede(duplicate.task, message, request.id, parked.key, request.hostname or "")
    ]
    _cleared(duplicate.task, duplicate.name, marked)
    debounce = duplicate.options.debounce
    reason = "held"
    if parked.paused:  # waits for the pause's end, whatever the lock (as skip's reason)
        why, reason = "paused (celery locks pause, pause_for)", "paused"
    elif parked.holder is not None:
        why = f"held by {describe(parked.holder)}"
    elif debounce:
        why, reason = f"free, but calls are debounced for {debounce:g}s", "debounce"
    else:
        why = "left by a holder that did not hand it on"
    log.info("task %s: lock %s %s; waiting as the newest call", duplicate.label, parked.key, why)
    duplicate.announce("replace", reason)
    celery_api.logged_already(duplicate.request.id)
    raise Ignore(f"waiting behind lock {parked.key} as the newest call")


def end_stale_copy(task: Any, request: Any, name: str, key: str) -> NoReturn:
    """A call of lock ``name`` the acquire refused: a copy of a call a newer one displaced
    (ended superseded again, as its first delivery was: idempotent), or a call sent before the
    newest of its lock (left to mark by the acquire, as a displaced call); end it superseded
    without running or displacing anything."""
    log.warning(
        "task %s[%s]: not run: a call of lock %s sent after it superseded it (a stale copy, "
        "or it reached the lock late)",
        task.name,
        request.id,
        key,
    )
    if mark_superseded(task, request, "a newer call", key, request.hostname or ""):
        _cleared(task, name, [request.id])
    celery_api.logged_already(request.id)
    raise Ignore(f"superseded by a newer call of lock {key}")


def mark_left(app: Any, locker: LockBackend, look_again_in: float) -> int:
    """Mark the displaced calls whose worker died before marking them (the hand-off sweeper,
    in a worker's main process); those that cannot be marked now are looked at again in
    ``look_again_in`` seconds. Returns how many were marked."""
    latest = locker.latest
    if latest is None:  # a backend where no call waits displaces none
        return 0
    marked_count = 0
    for name, messages in latest.superseded_left():
        marked = []
        for message in messages:
            task = app.tasks.get(_task_name_of(message))
            if task is None:  # not a task of this worker: one that knows it marks it
                continue
            if supersede(task, message, "a newer call", locker.keys(name).lock):
                marked.append(_request_of(message).id)
        latest.clear_superseded(name, marked, look_again_in=look_again_in)
        marked_count += len(marked)
    return marked_count


def _task_name_of(message: bytes) -> str:
    try:
        return str(json.loads(message.partition(b"\n")[2].decode("utf-8")).get("task") or "")  # type: ignore[no-untyped-call]
    except (ValueError, TypeError, UnicodeDecodeError, AttributeError):
        return ""
