"""The Celery layer: ``LockedTask``, duplicate policies, signals and worker hooks."""

from celery_singleton_lock.celery.config.resolution import LockOptions
from celery_singleton_lock.celery.signals import (
    lock_acquired,
    lock_backend_error,
    lock_duplicate,
    lock_lost,
    lock_released,
)
from celery_singleton_lock.celery.task.lock_view import LockHandle
from celery_singleton_lock.celery.task.locked_task import LockedTask
from celery_singleton_lock.celery.worker import wiring as _wiring  # noqa: F401  (connects the receivers)

__all__ = [
    "LockHandle",
    "LockOptions",
    "LockedTask",
    "lock_acquired",
    "lock_backend_error",
    "lock_duplicate",
    "lock_lost",
    "lock_released",
]
