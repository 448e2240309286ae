"""celery-singleton-lock: run-time, per-argument Redis locks for Celery tasks.

Public API::

    from celery_singleton_lock import LockedTask

    @app.task(base=LockedTask, lock_on=("account_id",), on_duplicate="retry")
    def apply_delta(account_id, cents): ...

The lock engine (:mod:`celery_singleton_lock.engine`) imports nothing from Celery; the Celery
layer is loaded on first use of its names, so the engine works without Celery installed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from celery_singleton_lock.errors import (
    AlreadyFinished,
    AlreadySuperseded,
    DuplicateTaskError,
    DuplicateTaskSkipped,
    LockBackendUnavailable,
    LockConfigurationError,
    LockError,
    LockKeyError,
    LockLostError,
    LockNotOwnedError,
    ReplicasUnavailable,
    StaleFenceError,
    UnsupportedArgumentError,
)

if TYPE_CHECKING:
    from celery_singleton_lock.celery import (
        LockedTask,
        LockHandle,
        lock_acquired,
        lock_backend_error,
        lock_duplicate,
        lock_lost,
        lock_released,
    )

__version__ = "0.1.0"

_CELERY_NAMES = {
    "LockedTask",
    "LockHandle",
    "lock_acquired",
    "lock_backend_error",
    "lock_duplicate",
    "lock_lost",
    "lock_released",
}

__all__ = [
    "AlreadyFinished",
    "AlreadySuperseded",
    "DuplicateTaskError",
    "DuplicateTaskSkipped",
    "LockBackendUnavailable",
    "LockConfigurationError",
    "LockError",
    "LockHandle",
    "LockKeyError",
    "LockLostError",
    "LockNotOwnedError",
    "LockedTask",
    "ReplicasUnavailable",
    "StaleFenceError",
    "UnsupportedArgumentError",
    "lock_acquired",
    "lock_backend_error",
    "lock_duplicate",
    "lock_lost",
    "lock_released",
]


def __getattr__(name: str) -> Any:
    if name in _CELERY_NAMES:
        return getattr(importlib.import_module(".celery", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
