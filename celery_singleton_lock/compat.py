"""Drop-in replacements for celery-once's ``QueueOnce`` and celery-singleton's ``Singleton``.

Both are :class:`~celery_singleton_lock.LockedTask` subclasses with ``dedupe_on_enqueue`` on:
a duplicate is refused when it is sent (as with the originals), and the execution that runs
holds the renewed run-time lock, so a crashed worker blocks its key for ``lock_ttl`` (15 s by
default), not for the original's hour, and a task running longer than its timeout keeps its
lock. Their options are read as the originals read them; the lock server is this package's
(``singleton_lock_url``, else the broker), not ``ONCE_REDIS_URL`` / ``singleton_backend_url``.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence

from celery_singleton_lock.celery.config.lockers import locker_for
from celery_singleton_lock.celery.config.options import UNSET
from celery_singleton_lock.celery.duplicates import enqueue
from celery_singleton_lock.celery.task.locked_task import LockedTask
from celery_singleton_lock.errors import DuplicateTaskError as _DuplicateTaskError
from celery_singleton_lock.errors import LockConfigurationError, LockError

__all__ = ["AlreadyQueued", "DuplicateTaskError", "QueueOnce", "Singleton"]


class AlreadyQueued(LockError):
    """celery-once's ``AlreadyQueued``: the call is already queued or running.

    Attributes:
        countdown: seconds until the queued marker would expire on its own (celery-once's
            lock timeout), 0 when only a running execution was found.
    """

    def __init__(
        self, countdown: float, key: Optional[str] = None, task_id: Optional[str] = None
    ) -> None:
        super().__init__(
            f"Expires in {countdown} seconds", key, {"task_id": task_id} if task_id else None
        )
        self.args = (countdown, key, task_id)

    @property
    def message(self) -> str:
        return f"Expires in {self.args[0]} seconds"

    @property
    def countdown(self) -> float:
        return float(self.args[0])

    @property
    def key(self) -> Optional[str]:
        return str(self.args[1]) if self.args[1] is not None else None

    @property
    def holder(self) -> Optional[dict[str, Any]]:
        return {"task_id": self.args[2]} if self.args[2] else None


class DuplicateTaskError(_DuplicateTaskError):
    """celery-singleton's ``DuplicateTaskError``: ``task_id`` is the task already queued or
    running (raised with ``raise_on_duplicate``)."""

    def __init__(self, message: str, task_id: str, key: Optional[str] = None) -> None:
        super().__init__(message, key, {"task_id": task_id})
        self.args = (message, task_id, key)

    @property
    def task_id(self) -> str:
        return str(self.args[1])

    @property
    def key(self) -> Optional[str]:
        return str(self.args[2]) if self.args[2] is not None else None

    @property
    def holder(self) -> Optional[dict[str, Any]]:
        return {"task_id": self.args[1]}


def _one_per_task(*_: Any, **__: Any) -> str:
    return "all-calls"


def _keys_to_lock_on(task_name: str, keys: Any) -> tuple[Optional[Sequence[str]], Any]:
    """``(lock_on, lock_key)`` for celery-once's ``keys``: None for all arguments, ``[]``
    for one lock per task whatever the arguments."""
    if keys is None:
        return None, None
    if isinstance(keys, str) or not isinstance(keys, (list, tuple)):
        raise LockConfigurationError(
            f"task {task_name}: once['keys'] must be a list of parameter names, got {keys!r}"
        )
    return (tuple(keys), None) if keys else (None, _one_per_task)


class QueueOnce(LockedTask):
    """celery-once's ``QueueOnce``: ``delay`` / ``apply_async`` of a call that is already
    queued or running raises :class:`AlreadyQueued` (or returns None with ``graceful``).

    ``once`` (task option, and per call ``apply_async(..., once={...})`` for ``graceful``
    and ``timeout``): ``keys`` (parameters the lock is on; ``[]``: one per task), ``graceful``,
    ``timeout`` (seconds a queued call blocks duplicates if it never runs; default the
    ``ONCE`` setting's ``default_timeout``, else 3600), ``unlock_before_run`` (a call sent
    while one runs is queued, and runs after it: ``on_duplicate="retry"``).
    """

    abstract = True
    once: Mapping[str, Any] = {"graceful": False, "unlock_before_run": False}

    dedupe_on_enqueue = True

    @classmethod
    def on_bound(cls, app: Any) -> None:
        once = dict(cls.once or {})
        name = cls.name or cls.__qualname__
        if cls.lock_on is None and cls.lock_key is None:
            cls.lock_on, cls.lock_key = _keys_to_lock_on(name, once.get("keys"))
        if cls.lock_queued_ttl is UNSET:
            settings = (app.conf.get("ONCE") or {}).get("settings") or {}
            cls.lock_queued_ttl = once.get("timeout", settings.get("default_timeout", 3600))
        if once.get("unlock_before_run") and cls.on_duplicate is UNSET:
            cls.on_duplicate = "retry"
        super().on_bound(app)

    def enqueue_dedupe(self, options: dict[str, Any]) -> Optional[enqueue.Dedupe]:
        per_call = options.pop("once", None) or {}
        dedupe = super().enqueue_dedupe(options)
        if dedupe is None:
            return None
        once = {**(self.once or {}), **per_call}
        graceful = bool(once.get("graceful", False))
        ttl = float(per_call.get("timeout", dedupe.queued_ttl))

        def on_duplicate(existing: str, name: str) -> Any:
            if graceful:
                return None
            locker = locker_for(self.app)
            # seconds until the key frees itself: the queued marker's, or (the call already
            # reached a worker) the running lock's
            remaining = locker.queued_for(name)
            if remaining is None:
                holder = locker.inspect.read(name)
                remaining = holder.ttl if holder is not None and holder.ttl else 0.0
            raise AlreadyQueued(math.ceil(remaining), locker.keys(name).lock, existing)

        return enqueue.Dedupe(
            queued_ttl=ttl,
            on_duplicate=on_duplicate,
            running_is_duplicate=not once.get("unlock_before_run", False),
        )


class Singleton(LockedTask):
    """celery-singleton's ``Singleton``: ``delay`` / ``apply_async`` of a call that is
    already queued or running returns that task's ``AsyncResult`` (or raises
    :class:`DuplicateTaskError` with ``raise_on_duplicate``).

    ``unique_on`` (a parameter name or a list of them; default all), ``raise_on_duplicate``
    (default: the ``singleton_raise_on_duplicate`` setting, else False), ``lock_expiry``
    (seconds a queued call blocks duplicates if it never runs; default 3600).
    """

    abstract = True
    unique_on: Any = None
    raise_on_duplicate: Optional[bool] = None
    lock_expiry: Optional[float] = None

    dedupe_on_enqueue = True

    @classmethod
    def on_bound(cls, app: Any) -> None:
        if cls.unique_on and cls.lock_on is None and cls.lock_key is None:
            unique_on = cls.unique_on
            cls.lock_on = (unique_on,) if isinstance(unique_on, str) else tuple(unique_on)
        if cls.lock_expiry is not None and cls.lock_queued_ttl is UNSET:
            cls.lock_queued_ttl = cls.lock_expiry
        super().on_bound(app)

    def enqueue_dedupe(self, options: dict[str, Any]) -> Optional[enqueue.Dedupe]:
        dedupe = super().enqueue_dedupe(options)
        if dedupe is None:
            return None
        raises = self.raise_on_duplicate
        if raises is None:
            raises = bool(self.app.conf.get("singleton_raise_on_duplicate") or False)
        if not raises:
            return dedupe

        def on_duplicate(existing: str, name: str) -> Any:
            raise DuplicateTaskError(
                f"Attempted to queue a duplicate of task ID {existing}",
                existing,
                locker_for(self.app).keys(name).lock,
            )

        return enqueue.Dedupe(queued_ttl=dedupe.queued_ttl, on_duplicate=on_duplicate)
