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


def connect() -> None:
    """Start timing executions (idempotent: ``dispatch_uid``)."""
    signals.task_prerun.connect(_on_prerun, weak=False, dispatch_uid="csl-timing-prerun")
    signals.task_postrun.connect(_forget, weak=False, dispatch_uid="csl-timing-postrun")
    # forgotten at task_postrun, after the release (whose receivers read held())
    lock_acquired.connect(_on_acquired, weak=False, dispatch_uid="csl-timing-acquired")


def disconnect() -> None:
    """Stop timing (tests, the bench)."""
    signals.task_prerun.disconnect(dispatch_uid="csl-timing-prerun")
    signals.task_postrun.disconnect(dispatch_uid="csl-timing-postrun")
    lock_acquired.disconnect(dispatch_uid="csl-timing-acquired")
    _started.clear()
    _acquired.clear()
