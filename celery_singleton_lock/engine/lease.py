"""Value objects of the engine: who owns a lock, who holds it, and a held lease."""

from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Optional, Protocol, Sequence, Union
from urllib.parse import unquote

from celery_singleton_lock.engine import fork_safety
from celery_singleton_lock.engine.capabilities import Capabilities
from celery_singleton_lock.engine.fork_safety import ForkSafeLock, current_pid
from celery_singleton_lock.engine.keys import LockKeys
from celery_singleton_lock.errors import AlreadyFinished, LockError

#: Width of the token at the start of a lock value (hex of 128 random bits; the scripts read
#: it as ``string.sub(value, 1, 32)``, see lua/includes/lock_value.lua).
TOKEN_LENGTH = 32

log = logging.getLogger("celery_singleton_lock.renewal")


def slot_name(lock: str, slot: int) -> str:
    """The name slot ``slot`` of lock key ``lock`` is shown under (:mod:`.slots`): the lock key
    for slot 1, ``<lock>:slot:<k>`` for the others."""
    return lock if slot == 1 else f"{lock}:slot:{slot}"


def new_token() -> str:
    """A fresh 128-bit random owner token (hex), from ``os.urandom`` as ``secrets`` does."""
    return os.urandom(16).hex()


def as_text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def as_bytes(value: Union[bytes, str]) -> bytes:
    # a client made with decode_responses=True hands back str
    return value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value


def as_int(value: Any) -> Optional[int]:
    text = as_text(value)
    return int(text) if text.lstrip("-").isdigit() else None


def already_finished(keys: LockKeys, owner: Owner) -> AlreadyFinished:
    """The error of an acquire that found ``owner``'s finish record under ``keys``' lock."""
    return AlreadyFinished(
        f"task id {owner.task_id} already ran to the end under lock {keys.lock} "
        "(its finish record exists): nothing was taken",
        keys.lock,
        {"task_id": owner.task_id},
    )


def _escape_host(host: str) -> str:
    return host.replace("%", "%25").replace("|", "%7C")


@dataclass(frozen=True)
class Owner:
    """Metadata stored with a lock so that inspecting it needs no other key."""

    task_id: str = ""
    host: str = field(default_factory=socket.gethostname)
    #: this process's, unless given (a supervisor naming its child): kept by fork_safety, so
    #: an owner made per call costs no system call
    pid: int = field(default_factory=lambda: fork_safety.pid)

    @property
    def fields(self) -> str:
        """``'<pid>|<host>|<task_id>'``: the owner part of a lock value, as scripts store it."""
        host = self.host
        if "|" in host or "%" in host:
            host = _escape_host(host)
        return f"{self.pid}|{host}|{self.task_id}"


@dataclass(frozen=True)
class LockHolder:
    """Who holds a lock we failed to take (or that we inspected)."""

    #: what an acquire that returns this got (see ``engine.AcquireOutcome``)
    state: ClassVar[str] = "held"

    key: str
    task_id: str
    host: str
    pid: Optional[int]
    acquired_at: Optional[float]  # seconds since the epoch, holder's clock
    fence: Optional[int]
    ttl: Optional[float]  # seconds left; None when the key has no TTL
    #: the key is in the cooldown after a run (``lock_cooldown``, see cooldown.py): ``ttl`` is
    #: the cooldown left, the other fields are the run's that ended
    cooling: bool = False
    #: not held: a slot is free but the lock's rate (``lock_rate``) allows no start before
    #: ``ttl`` seconds; the other fields are unknown
    over_rate: bool = False
    #: not held: the task's or group's live rule pauses every start (``celery locks pause``,
    #: ``pause_for``) for ``ttl`` seconds more (None: until resumed); the other fields unknown
    paused: bool = False

    @classmethod
    def parse(cls, key: str, fields: Any, pttl: Any) -> Optional[LockHolder]:
        """The holder described by ``'fence|acquired_at|pid|host|task_id'`` (a lock value
        without its token) with ``pttl`` ms left; None if it is not that shape."""
        parts = as_text(fields).split("|", 4)
        if len(parts) != 5:
            return None
        fence, acquired_at, pid, host, task_id = parts
        acquired_ms = as_int(acquired_at)
        ttl_ms = as_int(pttl)
        return cls(
            key=key,
            task_id=task_id,
            host=unquote(host) if "%" in host else host,
            pid=as_int(pid),
            acquired_at=None if acquired_ms is None else acquired_ms / 1000.0,
            fence=as_int(fence),
            ttl=None if ttl_ms is None or ttl_ms < 0 else ttl_ms / 1000.0,
            cooling=pid == "cooldown",  # cooldown.COOLDOWN_PID
        )

    @classmethod
    def paused_for(cls, key: str, ms: Any) -> LockHolder:
        """No holder: the name is paused for ``ms`` more (-1: until resumed)."""
        left = as_int(ms)
        ttl = None if left is None or left < 0 else left / 1000.0
        return cls(key, "", "", None, None, None, ttl, False, False, True)

    @classmethod
    def unknown(cls, key: str, task_id: str = "") -> LockHolder:
        """A holder nothing is known of, but perhaps its task id."""
        return cls(
            key=key, task_id=task_id, host="", pid=None, acquired_at=None, fence=None, ttl=None
        )

    @classmethod
    def from_value(cls, key: str, value: Any, pttl: Any) -> Optional[LockHolder]:
        """The holder of a whole stored lock value; None if it is not a lock value."""
        text = as_text(value)
        if len(text) <= TOKEN_LENGTH or text[TOKEN_LENGTH] != "|":
            return None
        return cls.parse(key, text[TOKEN_LENGTH + 1 :], pttl)

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "task_id": self.task_id,
            "host": self.host,
            "pid": self.pid,
            "acquired_at": self.acquired_at,
            "fence": self.fence,
            "ttl": self.ttl,
        }


@dataclass(frozen=True)
class Parked:
    """A task id parked behind a held lock, to be handed the lock in arrival order."""

    #: what an acquire that returns this got (see ``engine.AcquireOutcome``)
    state: ClassVar[str] = "parked"

    key: str
    #: who holds the lock; None when it was free and just handed to an older parked task id
    holder: Optional[LockHolder]
    #: this task id's 1-based place among the parked ones
    position: int
    #: the message of the parked task id the lock was just reserved for, which the caller must
    #: publish; None when nothing was handed off
    handed: Optional[bytes]
    #: with several slots (``lock_limit``): the messages of further calls handed a free slot
    #: by the same acquire, to publish too
    more_handed: tuple[bytes, ...] = ()
    #: the messages of the calls this one took the place of (policy ``replace``), each
    #: ``<task id>\n<message>``: they will never run
    displaced: tuple[bytes, ...] = ()
    #: the task's or group's live rule pauses every start (``celery locks pause``,
    #: ``pause_for``): the call waits for the pause's end, whether or not a slot is free
    paused: bool = False


LostCallback = Callable[["Lease"], None]


class Registry(Protocol):
    """What keeps a lease alive (the process's renewer, :mod:`.renewer`)."""

    def add(self, lease: Lease) -> None: ...

    def discard(self, lease: Lease) -> None: ...


class LeaseKeeper(Protocol):
    """What releases and renews a lease: the backend that granted it (:mod:`.backend`)."""

    @property
    def capabilities(self) -> Capabilities: ...

    def release(self, lease: Lease, *, remember_for: Optional[float] = None) -> bool: ...

    def release_later(
        self,
        lease: Lease,
        then: Callable[[Optional[bool], Optional[LockError]], None],
        *,
        remember_for: Optional[float] = None,
    ) -> bool: ...

    def renew_batch(self, leases: Sequence[Lease], *, now: float) -> list[int]: ...


#: Guards the lost/released state of every lease. State changes are rare (loss, release,
#: registering a callback), so one lock for all leases costs nothing in contention and saves
#: allocating a lock per lease.
_state_lock = ForkSafeLock()


class LostFlag:
    """Set once, when a lease is lost. Reads like a ``threading.Event``.

    ``is_set()`` is a plain attribute read; the ``threading.Event`` behind ``wait()`` is only
    created for a caller that actually waits.
    """

    __slots__ = ("_event", "_set")

    def __init__(self) -> None:
        self._set = False
        self._event: Optional[threading.Event] = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        with _state_lock:
            self._set = True
            event = self._event
        if event is not None:
            event.set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until the flag is set or ``timeout`` passes; return whether it is set."""
        with _state_lock:
            if self._set:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    def __repr__(self) -> str:
        return f"<LostFlag {'set' if self._set else 'unset'}>"


#: ``Lease._lost_callbacks`` while ``mark_lost`` reports a loss (never appended to)
_REPORTING: list[LostCallback] = []


class Lease:
    """A lock this process holds.

    A lease is renewed by its process's :class:`~celery_singleton_lock.engine.renewer.Renewer`
    until it is released, lost, or reaches ``max_lifetime``. ``lost`` is set (and the
    ``on_lost`` callbacks fire, once, from the renewer thread) when Redis says the lock is no
    longer ours, or when Redis could not be reached for longer than the TTL.

    ``ttl`` (and ``keys``, ``token``) are fixed when the lease is created. A lease given a
    ``renewer`` registers itself with it at once, and leaves it when released. A release that
    fails (the server unreachable, an error in the script) leaves it not ``held``: nothing
    renews it any more and its key expires within its TTL; it may be released again.
    """

    #: what an acquire that returns this got (see ``engine.AcquireOutcome``)
    state: ClassVar[str] = "acquired"

    __slots__ = (
        "_lost_callbacks",
        "_third",
        "confirmed_at",
        "deadline",
        "fence",
        "key",
        "keys",
        "locker",
        "lost",
        "owner",
        "pid",
        "release_failed",
        "released",
        "renew_due",
        "renewer",
        "slot",
        "token",
        "ttl",
        "ttl_ms",
    )

    def __init__(
        self,
        *,
        locker: LeaseKeeper,
        keys: LockKeys,
        token: str,
        ttl: float,
        owner: Owner,
        fence: Optional[int],
        confirmed_at: float,
        deadline: Optional[float],
        on_lost: Optional[LostCallback] = None,
        renewer: Optional[Registry] = None,
        slot: int = 0,
    ) -> None:
        if len(token) != TOKEN_LENGTH:
            # Renewal sends tokens back to back at a fixed width; a shorter or longer one
            # would shift every token after it.
            raise ValueError(f"a lease token is {TOKEN_LENGTH} characters, got {token!r}")
        self.locker = locker
        self.keys = keys
        #: 0 for a lock key; else the 1-based slot of the lock's slot table (``lock_limit``,
        #: :mod:`.slots`) this lease holds, and ``key`` that slot's name
        self.slot = slot
        self.key = keys.lock if not slot else slot_name(keys.lock, slot)
        self.token = token
        self.ttl = ttl
        #: ``ttl`` in whole milliseconds (at least 1), as sent to Redis.
        self.ttl_ms = max(1, int(ttl * 1000))
        self._third = ttl / 3.0
        self.owner = owner
        self.fence = fence
        #: renewer-clock time just before the last request that set our TTL was sent:
        #: the lock is certainly ours until ``confirmed_at + ttl``.
        self.confirmed_at = confirmed_at
        #: renewer-clock time after which renewal stops (max lifetime), or None.
        self.deadline = deadline
        self.renew_due = confirmed_at + self._third
        #: the process that holds the lease: a forked child never touches it
        self.pid = fork_safety.pid
        self.lost = LostFlag()
        self.released = False
        #: a release was sent and failed: not held, not renewed, may be released again
        self.release_failed = False
        # ``on_lost`` given here needs no lock: no other thread can see the lease yet
        self._lost_callbacks: Optional[list[LostCallback]] = None if on_lost is None else [on_lost]
        #: what keeps this lease alive until it is released (None: not renewed)
        self.renewer = renewer
        if renewer is not None:
            renewer.add(self)

    def keep_renewed(self, renewer: Registry) -> None:
        """Have ``renewer`` keep this lease alive until it is released."""
        self.renewer = renewer
        renewer.add(self)

    def releasing(self) -> bool:
        """Mark the lease released and leave its renewer, before its release is sent: False
        when there is nothing to send (already released, or inherited from the parent)."""
        if self.pid != fork_safety.pid:  # inherited from the parent: never touched here
            return False
        with _state_lock:
            if self.released:
                return False
            self.released = True  # from here a failed renewal is not reported as a loss
        if self.renewer is not None:
            self.renewer.discard(self)
        return True

    def not_released(self) -> None:
        """Its release failed: not held from now on (nothing renews it and its key expires
        within its TTL; a lease reported held would block nobody and protect nothing), but
        it keeps its token so that it may be released again."""
        self.released = False
        self.release_failed = True

    @property
    def inherited(self) -> bool:
        """True in a forked child: the lease belongs to the parent and is never touched here."""
        return self.pid != current_pid()

    @property
    def held(self) -> bool:
        return not (self.released or self.release_failed or self.lost._set or self.inherited)

    def on_lost(self, callback: LostCallback) -> None:
        """Call ``callback(lease)`` once when the lease is lost (immediately if it already is)."""
        with _state_lock:
            if not self.lost._set and self._lost_callbacks is not _REPORTING:
                if self._lost_callbacks is None:
                    self._lost_callbacks = []
                self._lost_callbacks.append(callback)
                return
        callback(self)

    def mark_lost(self, reason: str) -> None:
        """Fire the lease's lost callbacks, then flag it lost; later calls do nothing.

        Callbacks first: a body waiting on the flag returns at once when it is set, and its
        task's end must not come before the loss is reported (signal, trace event)."""
        with _state_lock:
            if self.lost._set or self.released or self._lost_callbacks is _REPORTING:
                return
            callbacks, self._lost_callbacks = self._lost_callbacks or [], _REPORTING
        log.error("lease on %s lost: %s", self.key, reason)
        for callback in callbacks:
            try:
                callback(self)
            except Exception:
                log.exception("lost-lease callback for %s raised", self.key)
        self.lost.set()

    def release(self, *, remember_for: Optional[float] = None) -> bool:
        """Release through the locker that granted the lease; True if it was still ours.

        ``remember_for``: see :meth:`~.locker.RedisLocker.release`.
        """
        return self.locker.release(self, remember_for=remember_for)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "held" if self.held else ("lost" if self.lost._set else "released")
        if self.release_failed and not self.released:
            state = "release failed"
        return f"<Lease {self.key} fence={self.fence} {state}>"
