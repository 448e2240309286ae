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


def _on_prerun(sender: Any = None, task_id: Optional[str] = None, **_: Any) -> None:
    # task_prerun comes before before_start (celery/app/trace.py): the acquire, a policy's
    # wait and a replica wait all fall after it
    if task_id and isinstance(sender, LockedTask):
        _started[task_id] = time.monotonic()


def _on_acquired(task_id: Optional[str] = None, **_: Any) -> None:
    if task_id:
        _acquired[task_id] = time.monotonic()


def _forget(task_id: Optional[str] = None, **_: Any) -> None:
    if task_id:
        _started.pop(task_id, None)
        _acquired.pop(task_id, None)


def waited(task_id: Optional[str]) -> Optional[float]:
    """Seconds from the start of this execution to now (its lock just taken), if known."""
    started = _started.get(task_id) if task_id else None
    return None if started is None else max(0.0, time.monotonic() - started)


def held(task_id: Optional[str]) -> Optional[float]:
    """Seconds this execution has held its lock, if it took it in this process."""
    acquired = _acquired.get(task_id) if task_id else None
    return None if acquired is None else max(0.0, time.monotonic() - acquired)


def connect(sender: Any = None) -> None:
    """Start timing executions (idempotent: ``dispatch_uid``); of ``sender`` only if given
    (the bench)."""
    for signal, receiver, uid in (
        (signals.task_prerun, _on_prerun, "csl-timing-prerun"),
        # forgotten at task_postrun, after the release (whose receivers read held())
        (signals.task_postrun, _forget, "csl-timing-postrun"),
        (lock_acquired, _on_acquired, "csl-timing-acquired"),
    ):
        signal.connect(receiver, sender=sender, weak=False, dispatch_uid=uid)


def disconnect(sender: Any = None) -> None:
    """Stop timing (tests, the bench): what :func:`connect` with this ``sender`` started."""
    for signal, uid in (
        (signals.task_prerun, "csl-timing-prerun"),
        (signals.task_postrun, "csl-timing-postrun"),
        (lock_acquired, "csl-timing-acquired"),
    ):
        signal.disconnect(sender=sender, dispatch_uid=uid)
    _started.clear()
    _acquired.clear()
