"""The lock engine: Redis leases with owner-checked release, batched renewal and fencing.

Imports nothing from Celery; the Celery layer (:mod:`celery_singleton_lock.celery`) uses it.
"""

from .inspect import LockInspector
from .keys import LockKeys
from .lease import Lease, LockHolder, Owner
from .locker import AcquireResult, RedisLocker, new_token
from .renewer import Renewer, process_renewer

__all__ = [
    "AcquireResult",
    "Lease",
    "LockHolder",
    "LockInspector",
    "LockKeys",
    "Owner",
    "RedisLocker",
    "Renewer",
    "new_token",
    "process_renewer",
]
