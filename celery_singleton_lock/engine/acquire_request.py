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
* :class:`ChosenAcquire`: a backend that chooses the kind of lock a request takes (one Redis
  server or Cluster: a mutex, slots, parked): chosen once, each call goes to it directly.
* ``PackedMutex`` (:mod:`.kinds.mutex`): one Redis server (or a Sentinel group's primary) with
  kept connections, a mutex: the hot path of a plain lock.

A request is checked against a backend's :class:`~.capabilities.Capabilities` (:func:`check`,
as redis-py's ``lock.py`` validates in a public method, then delegates) once when prepared, and
a call's own fields (:func:`check_call`) at each call.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional, Protocol, Union

from celery_singleton_lock.engine.capabilities import Capabilities
from celery_singleton_lock.engine.keys import LockKeys
from celery_singleton_lock.engine.latest import Latest
from celery_singleton_lock.engine.lease import Lease, LockHolder, LostCallback, Owner, Parked
from celery_singleton_lock.errors import LockConfigurationError, LockError

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
    #: calls are handed slots round robin across values, by ``priority`` then oldest first
    #: within one ("": in arrival order)
    fair: str = ""
    #: with ``limit`` (or ``rate``): the key of the task's live cap (``celery locks limit``),
    #: at most that many slots taken at once whatever ``limit`` says ("": none is read)
    cap_key: str = ""
    #: with ``park``: the call's rank, handed a slot before the parked calls of a lower rank
    #: (with ``fair``: of its fairness value; arrival order within one rank); within
    #: -255..255, 0 by default
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


#: One kind of lock's acquire of a checked request, for its owner (e.g. ``Slots.acquire``).
Take = Callable[[AcquireRequest, Owner], AcquireOutcome]


class ChosenAcquire:
    """``take`` of ``request`` with each call's name, owner and time limit: the request was
    checked, and the kind of lock that takes it chosen, once; a call checks its own fields."""

    def __init__(self, take: Take, request: AcquireRequest) -> None:
        self.take = take
        self.request = request

    def acquire(
        self, name: str, owner: Owner, max_lifetime: Optional[float] = None
    ) -> AcquireOutcome:
        request = self.request.for_call(name, owner, max_lifetime)
        check_call(request, owner, max_lifetime)
        return self.take(request, owner)


# -- checks of a request against a backend's capabilities ---------------------------------------

#: field of the request -> the capability it needs, and the option it comes from (for people)
_NEEDS = (
    ("fencing", "fencing", "lock_fencing (a fencing token)"),
    ("min_replicas", "replica_acks", "lock_min_replicas"),
    ("take_queued", "enqueue_markers", "dedupe_on_enqueue (queued markers)"),
    ("park", "parking", "on_duplicate='queue' (parked messages)"),
)


def unsupported(capabilities: Capabilities, what: str, feature: str, name: str) -> LockError:
    """The error for asking ``capabilities`` for ``feature`` (said to people as ``what``)."""
    return LockConfigurationError(
        f"{what} is not supported on {capabilities.kind}: {capabilities.why_not(feature)}; "
        f"{capabilities.instead} for it",
        name,
    )


def check(request: AcquireRequest, capabilities: Capabilities, prefix: str) -> None:
    """Refuse what no call of ``request`` could do on a backend of ``capabilities`` under
    ``prefix`` (whatever its name and owner)."""
    ttl = request.ttl
    if not ttl > 0:
        raise ValueError(f"ttl must be a positive number of seconds, got {ttl!r}")
    if request.latest is not None and request.park is None:
        raise ValueError("latest needs park: the waiting call's message")
    if request.fair and (request.park is None or request.latest is not None):
        raise ValueError("fair needs park without latest: it orders the parked calls")
    if request.fencing or request.min_replicas or request.take_queued or request.park:
        for option, feature, what in _NEEDS:
            if getattr(request, option) and not getattr(capabilities, feature):
                raise unsupported(capabilities, what, feature, _named(request, prefix))
    if request.limit != 1 or request.rate is not None:
        _check_limit(request, capabilities, prefix)


def _named(request: AcquireRequest, prefix: str) -> str:
    """The lock key an error about ``request`` names (its prefix for a prepared request,
    which has no name yet)."""
    return LockKeys.build(prefix, request.name).lock if request.name else prefix


def _check_limit(request: AcquireRequest, capabilities: Capabilities, prefix: str) -> None:
    limit = request.limit
    if type(limit) is not int or limit < 1:
        raise ValueError(f"limit must be an integer >= 1, got {limit!r}")
    if limit != 1 and not capabilities.slots:
        raise unsupported(capabilities, "lock_limit > 1", "slots", _named(request, prefix))
    if request.rate is not None and not capabilities.rate:
        raise unsupported(capabilities, "lock_rate", "rate", _named(request, prefix))
    if request.park is not None and not capabilities.parking_slots:
        raise unsupported(
            capabilities,
            "on_duplicate='queue' with lock_limit > 1 or lock_rate",
            "parking_slots",
            _named(request, prefix),
        )
    if request.latest is not None or request.take_queued or request.min_replicas:
        raise LockConfigurationError(
            "a limit above 1 or a rate does not combine with latest wins, queued markers "
            "or replica acknowledgements (each of them is about one lock key)",
            _named(request, prefix),
        )
