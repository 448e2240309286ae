"""The lock engine: Redis leases with owner-checked release, batched renewal and fencing.

Imports nothing from Celery. This module is the engine's one surface: the Celery layer
(:mod:`celery_singleton_lock.celery`) imports the engine only from here (a test pins it).
"""

from .fork_safety import ForkSafeLock, no_fork, reset_in_forked_children
from .keys import LockKeys, validate_prefix
from .lease import Lease, LockHolder, Owner, Parked
from .locker import AcquireResult, RedisLocker, new_token
from .reading import Client, LockInspector
from .redlock import MIN_SERVERS, QuorumLocker
from .renewer import Renewer, process_renewer
from .waiting import subscribe_releases, wait_for_release

__all__ = [
    "MIN_SERVERS",
    "AcquireResult",
    "Client",
    "ForkSafeLock",
    "Lease",
    "LockHolder",
    "LockInspector",
    "LockKeys",
    "Owner",
    "Parked",
    "QuorumLocker",
    "RedisLocker",
    "Renewer",
    "new_token",
    "no_fork",
    "process_renewer",
    "reset_in_forked_children",
    "subscribe_releases",
    "validate_prefix",
    "wait_for_release",
]
