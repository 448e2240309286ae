"""When each execution of a locked task started and took its lock, for the metrics and the
trace events.

Connected only when one of them is on: with both off, no receiver of ``task_prerun`` or of
the lock signals exists and the hot path pays nothing. Times are ``time.monotonic()`` of the
process running the body, by task id (one body per task id runs in a process at a time).
"""

from __future__ import annotations

import time
from typing import Any, Optional

from celery import signals

from celery_singleton_lock.celery.signals import lock_acquired
from celery_singleton_lock.celery.task.locked_task import LockedTask

_started: dict[str, float] = {}
_acquired: dict[str, float] = {}
#: True while the metrics read :func:`held_at_release`: an acquire time is then kept past the
#: task's end, until its release is reported (a release sent without waiting is reported when
#: its reply is read, after ``task_postrun``: forgotten there, the held time was lost)
_until_released = False
#: acquire times kept at most: a release never reported (it failed) leaves one behind
KEEP_AT_MOST = 4096


def _on_prerun(sender: Any = None, task_id: Optional[str] = None, **_: Any) -> None:
    # task_prerun comes before before_start (celery/app/trace.py): the acquire, a policy's
    # wait and a replica wait all fall after it
    if task_id and isinstance(sender, LockedTask):
        _started[task_id] = time.monotonic()


def _on_acquired(task_id: Optional[str] = None, **_: Any) -> None:
    if task_id:
        _acquired[task_id] = time.monotonic()
        if len(_acquired) > KEEP_AT_MOST:
            del _acquired[next(iter(_acquired))]  # the oldest


def _forget(task_id: Optional[str] = None, **_: Any) -> None:
    if task_id:
        _started.pop(task_id, None)
        if not _until_released:
            _acquired.pop(task_id, None)


def waited(task_id: Optional[str]) -> Optional[float]:
    """Seconds from the start of this execution to now (its lock just taken), if known."""
    started = _started.get(task_id) if task_id else None
    return None if started is None else max(0.0, time.monotonic() - started)


def held_at_release(task_id: Optional[str]) -> Optional[float]:
    """Seconds this execution held its lock, if it took it in this process; for the receiver
    of ``lock_released``, whose report it is: the acquire time is forgotten then."""
    acquired = _acquired.pop(task_id, None) if task_id else None
    return None if acquired is None else max(0.0, time.monotonic() - acquired)


def connect(sender: Any = None, *, until_released: bool = False) -> None:
    """Start timing executions (idempotent: ``dispatch_uid``); of ``sender`` only if given
    (the bench). ``until_released``: :func:`held_at_release` will be read (the metrics)."""
    global _until_released
    _until_released = _until_released or until_released
    for signal, receiver, uid in (
        (signals.task_prerun, _on_prerun, "csl-timing-prerun"),
        # the start forgotten at task_postrun; the acquire time too unless until_released
        (signals.task_postrun, _forget, "csl-timing-postrun"),
        (lock_acquired, _on_acquired, "csl-timing-acquired"),
    ):
        signal.connect(receiver, sender=sender, weak=False, dispatch_uid=uid)


def disconnect(sender: Any = None) -> None:
    """Stop timing (tests, the bench): what :func:`connect` with this ``sender`` started."""
    global _until_released
    _until_released = False
    for signal, uid in (
        (signals.task_prerun, "csl-timing-prerun"),
        (signals.task_postrun, "csl-timing-postrun"),
        (lock_acquired, "csl-timing-acquired"),
    ):
        signal.disconnect(sender=sender, dispatch_uid=uid)
    _started.clear()
    _acquired.clear()
