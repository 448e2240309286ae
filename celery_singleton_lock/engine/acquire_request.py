"""What one acquire asks of a backend (:class:`AcquireRequest`) and what it answers, and the
acquire prepared once for many calls (:class:`PreparedAcquire`).

Apart from the seam (:mod:`.backend`) because the engine's own modules build and read these
on the hot path (:mod:`.locker`, :mod:`.kinds`), while the protocols are read by the Celery
layer.

A task's calls differ in their lock name, owner and time limit only; the rest of their
:class:`AcquireRequest` (TTL, fencing, finish records, queued markers) is the task's.
``backend.prepare(request)`` checks that request once against the backend and returns a
:class:`PreparedAcquire`, whose ``acquire(name, owner, max_lifetime)`` is the hot path of every
call. Two implementations, side by side, chosen by the backend:

* :class:`GeneralAcquire`: any backend, any request: ``backend.acquire`` of the request with
  the call's fields.
* ``PackedMutex`` (:mod:`.kinds.mutex`): one Redis server (or a Sentinel group's primary) with
  kept connections, a mutex: the hot path of a plain lock.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Protocol, Union

from celery_singleton_lock.engine.latest import Latest
from celery_singleton_lock.engine.lease import Lease, LockHolder, LostCallback, Owner, Parked

#: What an acquire returns: the :class:`Lease` when acquired, the current :class:`LockHolder`
#: when someone else holds the lock, :class:`Parked` when the call was parked behind it (only
#: with ``park``). Each says which it is in ``state`` ("acquired", "held", "parked"); no object
#: is made to wrap it (the acquire is the hot path).
AcquireOutcome = Union[Lease, LockHolder, Parked]
#: What an acquire without ``park`` returns.
AcquireResult = Union[Lease, LockHolder]


class AcquireRequest(NamedTuple):
    """One acquire (see :func:`.checks.try_acquire` for what each field asks).

    A named tuple, not a dataclass: immutable, and as cheap to make as a tuple (it is made for
    every task execution); Python 3.9 has no slotted dataclasses.
    """

    name: str
    ttl: float
    owner: Optional[Owner] = None
    fencing: bool = False
    renew: bool = True
    max_lifetime: Optional[float] = None
    on_lost: Optional[LostCallback] = None
    unless_finished: bool = False
    min_replicas: int = 0
    replica_timeout: float = 1.0
    take_queued: bool = False
    park: Optional[bytes] = None
    reservation_ttl: float = 30.0
    token: Optional[str] = None
    latest: Optional[Latest] = None
    #: at most this many holders of ``name`` at once (:mod:`.slots`); 1 is the mutex
    limit: int = 1
    #: at most ``rate[0]`` acquisitions of ``name`` in any ``rate[1]`` seconds, or None
    rate: Optional[tuple[int, float]] = None
    finished_ttl: float = 3600.0
    #: with ``take_queued``: keep the marker while another owner holds the lock (the caller
    #: sends the call again: it is still queued, see ACQUIRE's ARGV[6])
    queued_while_held: bool = False
    #: with ``park``: the call's fairness value (its ``lock_fair_by`` arguments); parked
    #: calls are handed slots round robin across values, oldest first within one ("": in
    #: arrival order)
    fair: str = ""
    #: with ``limit`` (or ``rate``): the key of the task's live cap (``celery locks limit``),
    #: at most that many slots taken at once whatever ``limit`` says ("": none is read)
    cap_key: str = ""
    #: with ``park`` and no ``fair``: the call's rank, handed a slot before the parked calls
    #: of a lower rank (arrival order within one rank); within -255..255, 0 by default
    priority: int = 0
    #: the lock's holders live in its slot table (:mod:`.slots`) even when ``limit`` is 1 and
    #: no rate is asked: chosen once per task (a ``lock_limit`` other than the static 1, a
    #: rate, policy ``queue``), so that every call of the task, whatever its limit, sees the
    #: others; False: the lock key, unless ``limit``, ``rate`` or ``park`` (not ``latest``)
    #: ask for the slot table
    slotted: bool = False

    def for_call(
        self, name: str, owner: Optional[Owner], max_lifetime: Optional[float]
    ) -> AcquireRequest:
        """This request with ``name``, ``owner`` and ``max_lifetime`` set: one call of a task
        whose other fields are the same for every call (cheaper than ``_replace``)."""
        fields = (name, self[1], owner, self[3], self[4], max_lifetime, *self[6:])
        return _new(AcquireRequest, fields)


_new = tuple.__new__


class PreparedAcquire(Protocol):
    """The acquire of one kind of call, checked once (``backend.prepare(request)``)."""

    #: the request every call starts from (its name, owner and time limit unset)
    request: AcquireRequest

    def acquire(
        self, name: str, owner: Owner, max_lifetime: Optional[float] = None
    ) -> AcquireOutcome:
        """Take the lock ``name`` for ``owner``, as ``backend.acquire(request)`` with those
        fields would (the same outcomes and errors)."""
        ...


def check_call(request: AcquireRequest, owner: Owner, max_lifetime: Optional[float]) -> None:
    """What ``backend.acquire`` checks of a call's own fields (the rest was checked once)."""
    if max_lifetime is not None and not max_lifetime > 0:
        raise ValueError(f"max_lifetime must be positive or None, got {max_lifetime!r}")
    if (request.unless_finished or request.take_queued or request.park is not None) and not (
        owner.task_id
    ):
        raise ValueError("unless_finished, take_queued and park need an owner with a task_id")


class Acquires(Protocol):
    """What :class:`GeneralAcquire` needs of a backend."""

    def acquire(self, request: AcquireRequest) -> AcquireOutcome: ...


class GeneralAcquire:
    """``backend.acquire`` of ``request`` with each call's name, owner and time limit."""

    def __init__(self, backend: Acquires, request: AcquireRequest) -> None:
        self.backend = backend
        self.request = request

    def acquire(
        self, name: str, owner: Owner, max_lifetime: Optional[float] = None
    ) -> AcquireOutcome:
        return self.backend.acquire(self.request.for_call(name, owner, max_lifetime))
