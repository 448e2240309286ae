"""The lock engine: Redis leases with owner-checked release, batched renewal and fencing.

Imports nothing from Celery. This module is the engine's one surface: the Celery layer
(:mod:`celery_singleton_lock.celery`) imports the engine only from here (a test pins it).
"""

from .acquire_request import AcquireOutcome, AcquireRequest, AcquireResult, PreparedAcquire
from .backend import (
    CooldownRelease,
    KeyspaceReader,
    LatestQueue,
    LiveRule,
    LiveRules,
    LockBackend,
    LockReader,
    ParkingQueue,
    PartsReader,
    PausingRules,
    PushedCancelFlags,
    QueuedMarkers,
    ReleaseSubscription,
)
from .cancel_watch import CancelSignal
from .capabilities import Capabilities
from .checks import required
from .fork_safety import ForkSafeLock, current_pid, no_fork, reset_in_forked_children
from .keys import LockKeys, cap_key, validate_prefix
from .latest import Latest
from .lease import Lease, LockHolder, Owner, Parked, new_token
from .locker import CLUSTER, SINGLE_SERVER, RedisLocker
from .postgres import POSTGRES, postgres_locker
from .postgres import SCHEMES as POSTGRES_SCHEMES
from .quorum_reading import QUORUM
from .reading import Client, LockInspector
from .redlock import MIN_SERVERS, QuorumLocker
from .renewer import Renewer, process_renewer
from .slots import slot_key, slot_of
from .waiting import subscribe_releases, wait_for_release

__all__ = [
    "CLUSTER",
    "MIN_SERVERS",
    "POSTGRES",
    "POSTGRES_SCHEMES",
    "QUORUM",
    "SINGLE_SERVER",
    "AcquireOutcome",
    "AcquireRequest",
    "AcquireResult",
    "CancelSignal",
    "Capabilities",
    "Client",
    "CooldownRelease",
    "ForkSafeLock",
    "KeyspaceReader",
    "Latest",
    "LatestQueue",
    "Lease",
    "LiveRule",
    "LiveRules",
    "LockBackend",
    "LockHolder",
    "LockInspector",
    "LockKeys",
    "LockReader",
    "Owner",
    "Parked",
    "ParkingQueue",
    "PartsReader",
    "PausingRules",
    "PreparedAcquire",
    "PushedCancelFlags",
    "QueuedMarkers",
    "QuorumLocker",
    "RedisLocker",
    "ReleaseSubscription",
    "Renewer",
    "cap_key",
    "current_pid",
    "new_token",
    "no_fork",
    "postgres_locker",
    "process_renewer",
    "required",
    "reset_in_forked_children",
    "slot_key",
    "slot_of",
    "subscribe_releases",
    "validate_prefix",
    "wait_for_release",
]
