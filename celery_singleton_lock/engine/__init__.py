"""The lock engine: Redis leases with owner-checked release, batched renewal and fencing.

Imports nothing from Celery; the Celery layer (:mod:`celery_singleton_lock.celery`) uses it.
"""

from .keys import LockKeys
from .lease import Lease, LockHolder, Owner
from .locker import AcquireResult, RedisLocker, new_token
from .releaser import Releaser, process_releaser
from .renewer import Renewer, process_renewer

__all__ = [
    "AcquireResult",
    "Lease",
    "LockHolder",
    "LockKeys",
    "Owner",
    "RedisLocker",
    "Releaser",
    "Renewer",
    "new_token",
    "process_releaser",
    "process_renewer",
]
