"""When the message of each execution of a locked task was received and when it took its
lock, for the metrics and the trace events.

Connected only when one of them is on: with both off, no receiver of ``task_prerun`` or of
the lock signals exists and the hot path pays nothing. Times are ``time.monotonic()`` of the
process running the body, by task id (one body per task id runs in a process at a time).

The start of the wait is the worker's receipt of the message, carried in the request dict by
:class:`.task.worker_request.LockedRequest` as a wall-clock time (the main process that
received it and the pool child reading it share the machine's clock) and turned into this
process's monotonic time at ``task_prerun``. Without it (an eager call, a task whose
``Request`` is not ours) the start is ``task_prerun`` itself.
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from typing import Any, Optional

from celery import signals

from celery_singleton_lock.celery.celery_api import RECEIVED_FIELD
from celery_singleton_lock.celery.signals import lock_acquired
from celery_singleton_lock.celery.task.execution import release_sent_at
from celery_singleton_lock.celery.task.locked_task import LockedTask

#: Locks taken and not yet reported released that are remembered at most (the oldest is
#: forgotten first): only a release that failed, or metrics off, leaves one behind for good.
MAX_UNRELEASED = 1024

_started: dict[str, float] = {}
_acquired: OrderedDict[str, float] = OrderedDict()  # popitem(last=False): atomic, oldest


def _on_prerun(sender: Any = None, task_id: Optional[str] = None, **_: Any) -> None:
    # task_prerun comes before before_start (celery/app/trace.py): the acquire, a policy's
    # wait and a replica wait all fall after it
    if task_id and isinstance(sender, LockedTask):
        started = time.monotonic()
        received = getattr(sender.request, RECEIVED_FIELD, None)
        if received is not None:
            # the wall clock may have stepped since: never later than now, as before
            started -= max(0.0, time.time() - received)
        _started[task_id] = started


def _on_acquired(task_id: Optional[str] = None, **_: Any) -> None:
    if task_id:
        if len(_acquired) >= MAX_UNRELEASED:
            with contextlib.suppress(KeyError):  # emptied meanwhile by another thread
                _acquired.popitem(last=False)
        _acquired[task_id] = time.monotonic()


def _forget(task_id: Optional[str] = None, **_: Any) -> None:
    # Not the acquire time: a release sent without waiting (release_later) is reported when
    # its reply is read, often by the renewer thread after task_postrun; forgetting it here
    # lost that release's celery_lock_held_seconds observation. held() forgets it.
    if task_id:
        _started.pop(task_id, None)


def waited(task_id: Optional[str]) -> Optional[float]:
    """Seconds from the receipt of this execution's message (or its ``task_prerun``) to now
    (its lock just taken), if known."""
    started = _started.get(task_id) if task_id else None
    return None if started is None else max(0.0, time.monotonic() - started)


def held(task_id: Optional[str]) -> Optional[float]:
    """Seconds this execution held its lock (from its acquire to its release being sent), if
    it took it in this process; called once, when its release is reported (the acquire time
    is forgotten then): a deferred release's reply, read later, adds nothing to it."""
    acquired = _acquired.pop(task_id, None) if task_id else None
    return None if acquired is None else max(0.0, release_sent_at() - acquired)


#: who asked for timing, by the sender they asked it for (None: every task): the metrics, the
#: trace events; timing runs for a sender while anyone asks
_users: dict[Any, set[str]] = {}


def connect(sender: Any = None, *, user: str) -> None:
    """Start timing executions for ``user`` (``"metrics"``, ``"tracing"``; idempotent); of
    ``sender`` only if given (the bench)."""
    _users.setdefault(sender, set()).add(user)
    for signal, receiver, uid in (
        (signals.task_prerun, _on_prerun, "csl-timing-prerun"),
        (signals.task_postrun, _forget, "csl-timing-postrun"),
        (lock_acquired, _on_acquired, "csl-timing-acquired"),
    ):
        signal.connect(receiver, sender=sender, weak=False, dispatch_uid=uid)


def disconnect(sender: Any = None, *, user: str) -> None:
    """``user`` no longer needs timing (of ``sender``): stopped once no one does (tests, the
    bench, trace events that find nothing to record)."""
    users = _users.get(sender, set())
    users.discard(user)
    if users:
        return
    _users.pop(sender, None)
    for signal, uid in (
        (signals.task_prerun, "csl-timing-prerun"),
        (signals.task_postrun, "csl-timing-postrun"),
        (lock_acquired, "csl-timing-acquired"),
    ):
        signal.disconnect(sender=sender, dispatch_uid=uid)
    _started.clear()
    _acquired.clear()
