"""The Celery layer: ``LockedTask``, duplicate policies, signals and worker hooks."""

from . import supervisor as _supervisor  # noqa: F401  (main-process renewal, prefork)
from . import worker as _worker  # noqa: F401  (connects the worker-side signal receivers)
from .handle import LockHandle
from .options import LockOptions
from .signals import lock_acquired, lock_duplicate, lock_lost, lock_released
from .task import LockedTask

__all__ = [
    "LockHandle",
    "LockOptions",
    "LockedTask",
    "lock_acquired",
    "lock_duplicate",
    "lock_lost",
    "lock_released",
]
