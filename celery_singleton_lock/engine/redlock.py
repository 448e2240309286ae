"""Leases on a quorum of independent Redis masters (the Redlock algorithm), opt-in.

A :class:`QuorumLocker` presents the interface of :class:`~.locker.RedisLocker` (it is a
subclass, so the Celery layer, the renewer and the CLI take it where they take one) over N >= 3
independent servers, each reached through a ``RedisLocker`` of its own:

* **acquire**: the same random token is sent to every server at once (one thread per server
  from a small pool of this locker). The lock is held when a majority (``N // 2 + 1``) took it
  and the *validity* is still positive: ``ttl - elapsed - drift``, elapsed measured from just
  before the first send to the reply that made the majority, drift = ``ttl * 0.01 + 2 ms`` (the
  Redlock specification's allowance for clocks running at different rates). Otherwise it is
  released on every server where it may have been written (compare-and-delete with our token,
  concurrently) and the holder seen on most servers returned; ``LockBackendUnavailable`` when
  fewer than a majority answered at all. A split vote (no one on a majority) is retried after a
  short random delay, as the specification recommends, before a holder is reported.
* **release, renew**: on every server at once; a lease is lost when fewer than a majority
  renewed it, and a release raises ``LockBackendUnavailable`` when fewer than a majority
  answered (the lease keeps its token: release may be called again).
* **waiting for a release**: the release script publishes on each server; a waiter subscribes
  on every server that answers and polls their subscriptions in turn, in slices of at most
  :data:`POLL_SLICE` seconds, so it wakes within about that long of the first publish.

What it cannot do, and refuses with ``LockConfigurationError``: fencing tokens (a counter per
server is not one counter: a restarted master without fsync'd persistence starts again from
0, and the majority of the next acquire may not overlap the one that saw the highest value),
waiting for replicas (``min_replicas``) and the queued markers of enqueue deduplication
(a marker on one server is not a marker on the quorum). ``isinstance(locker, QuorumLocker)`` is
the test for callers that must refuse more.

Safety rests on timing assumptions (bounded clock drift, bounded process pauses and network
delays); see docs/explanation/redlock-safety.md: the fence, not the quorum, protects data,
and there is no fence here.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Callable, Iterator, Optional, Sequence, TypeVar, Union, cast

import redis

from celery_singleton_lock.engine import lease as _lease
from celery_singleton_lock.engine.fork_safety import reset_in_forked_children
from celery_singleton_lock.engine.keys import validate_prefix
from celery_singleton_lock.engine.lease import Lease, LockHolder, LostCallback, Owner, Parked
from celery_singleton_lock.engine.locker import AcquireResult, RedisLocker, new_token
from celery_singleton_lock.engine.reading import Client, LockInspector
from celery_singleton_lock.engine.renewer import Renewer
from celery_singleton_lock.errors import (
    AlreadyFinished,
    LockBackendUnavailable,
    LockConfigurationError,
    LockError,
)

log = logging.getLogger("celery_singleton_lock.acquire")

T = TypeVar("T")

#: The fewest servers a quorum may have: with 2, a majority is both, and one outage stops it.
MIN_SERVERS = 3
#: Clock drift allowance, as the Redlock specification: this share of the TTL, plus a floor.
DRIFT_FACTOR = 0.01
DRIFT_FLOOR = 0.002
#: Attempts at an acquire that ended in a split vote (no one on a majority) before a holder
#: is reported, and the bound of the random delay between them (seconds).
SPLIT_VOTE_ATTEMPTS = 3
SPLIT_VOTE_DELAY = 0.05
#: Longest a release waits for the acquire replies still on their way (seconds): a write that
#: lands after our delete would otherwise keep the key until its TTL.
PENDING_WAIT = 5.0
#: Longest slice a waiter listens on one server's subscription before the next (seconds).
POLL_SLICE = 0.05


def drift(ttl: float) -> float:
    """Clock-drift allowance for a lock of ``ttl`` seconds (Redlock: ttl * 0.01 + 2 ms)."""
    return ttl * DRIFT_FACTOR + DRIFT_FLOOR


def majority(count: int) -> int:
    return count // 2 + 1


class QuorumLease(Lease):
    """A lease held on a majority of a quorum's servers."""

    __slots__ = ("pending",)

    #: acquire replies not yet in when the majority was reached (see :data:`PENDING_WAIT`)
    pending: list[Future[Any]]


def _refused(what: str, name: str = "") -> LockConfigurationError:
    return LockConfigurationError(
        f"{what} is not supported on a Redlock quorum of independent Redis servers: "
        "use one Redis server (or Sentinel / Cluster) for it",
        name,
    )


class QuorumLocker(RedisLocker):
    """Leases on a majority of ``clients`` (N >= 3 independent Redis masters); see the module.

    Args:
        clients: one plain redis-py client per server (no Sentinel, no Cluster).
        prefix, renewer, wall_clock: as :class:`RedisLocker`.
    """

    #: False: fences, replica acknowledgement and queued markers need one server.
    supports_single_server_features = False
    #: reads the locks held on a majority, and each server's view
    inspect: QuorumInspector

    def __init__(
        self,
        clients: Sequence[redis.Redis],
        *,
        prefix: str = "singleton-lock",
        renewer: Optional[Renewer] = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if len(clients) < MIN_SERVERS:
            raise LockConfigurationError(
                f"a Redlock quorum needs at least {MIN_SERVERS} independent Redis servers, got "
                f"{len(clients)}; give 3 or 5 URLs, or one URL for a single server"
            )
        self.prefix = validate_prefix(prefix)
        self._renewer = renewer
        self.wall_clock = wall_clock
        #: one locker per server, in the order given
        self.servers = [
            RedisLocker(client, prefix=self.prefix, renewer=renewer, wall_clock=wall_clock)
            for client in clients
        ]
        #: how many servers must agree
        self.quorum = majority(len(self.servers))
        self.cluster = False
        self.connections = None
        facade = QuorumClient(list(clients))
        self.client = cast(Client, facade)
        self.inspect = QuorumInspector(self)
        self._pool: Optional[ThreadPoolExecutor] = None
        self._pool_lock = threading.Lock()
        reset_in_forked_children(self)

    def after_fork_in_child(self) -> None:
        # The parent's pool threads do not exist in a child: a new pool is made on first use.
        self._pool = None
        self._pool_lock = threading.Lock()

    # -- concurrency --------------------------------------------------------------------------

    def _each(self, call: Callable[[RedisLocker], T]) -> list[Future[T]]:
        """``call(server)`` for every server at once, from this locker's thread pool."""
        pool = self._pool
        if pool is None:
            with self._pool_lock:
                pool = self._pool
                if pool is None:
                    # two threads a server: a renewal tick never queues behind acquires
                    pool = self._pool = ThreadPoolExecutor(
                        max_workers=2 * len(self.servers), thread_name_prefix="csl-quorum"
                    )
        return [pool.submit(call, server) for server in self.servers]

    def _answers(self, futures: Sequence[Future[T]], key: str) -> list[Optional[T]]:
        """The replies of ``futures`` in server order (None where a server did not answer);
        ``LockBackendUnavailable`` when fewer than a majority answered."""
        replies: list[Optional[T]] = []
        failures: list[str] = []
        for future in futures:
            try:
                replies.append(future.result())
            except LockBackendUnavailable as exc:
                replies.append(None)
                failures.append(exc.message)
        answered = len(futures) - len(failures)
        if answered < self.quorum:
            raise LockBackendUnavailable(
                f"only {answered} of {len(futures)} lock servers answered about {key}, "
                f"{self.quorum} needed ({'; '.join(failures)})",
                key,
            )
        return replies

    # -- acquire ------------------------------------------------------------------------------

    def try_acquire(
        self,
        name: str,
        ttl: float,
        *,
        owner: Optional[Owner] = None,
        fencing: bool = False,
        renew: bool = True,
        max_lifetime: Optional[float] = None,
        on_lost: Optional[LostCallback] = None,
        unless_finished: bool = False,
        min_replicas: int = 0,
        replica_timeout: float = 1.0,
        take_queued: bool = False,
        park: Optional[bytes] = None,
        reservation_ttl: float = 30.0,
        token: Optional[str] = None,
    ) -> Union[AcquireResult, Parked]:
        """Take the lock ``name`` on a majority of the servers; see :meth:`RedisLocker.try_acquire`
        and the module docstring.

        Raises:
            LockConfigurationError: ``fencing``, ``min_replicas``, ``take_queued`` or
                ``park``.
            AlreadyFinished: with ``unless_finished``, a server holds that record.
            LockBackendUnavailable: fewer than a majority answered, or the majority came
                too late (no validity left); nothing is held.
        """
        if fencing:
            raise _refused("lock_fencing (a fencing token)", name)
        if min_replicas:
            raise _refused("lock_min_replicas", name)
        if take_queued:
            raise _refused("dedupe_on_enqueue (queued markers)", name)
        if park is not None:
            raise _refused("on_duplicate='queue' (parked messages)", name)
        if not ttl > 0:
            raise ValueError(f"ttl must be a positive number of seconds, got {ttl!r}")
        if max_lifetime is not None and not max_lifetime > 0:
            raise ValueError(f"max_lifetime must be positive or None, got {max_lifetime!r}")
        owner = owner or Owner()
        for attempt in range(SPLIT_VOTE_ATTEMPTS):
            last = attempt + 1 == SPLIT_VOTE_ATTEMPTS
            outcome = self._attempt(name, ttl, owner, unless_finished, token, last=last)
            if outcome is not None:
                break
            time.sleep(random.uniform(0, min(SPLIT_VOTE_DELAY, ttl / 10)))
        assert outcome is not None
        if isinstance(outcome, Lease):
            if max_lifetime is not None:
                outcome.deadline = outcome.confirmed_at + max_lifetime
            if on_lost is not None:
                outcome.on_lost(on_lost)
            if renew:
                self.renewer.add(outcome)
        return outcome

    def _attempt(
        self,
        name: str,
        ttl: float,
        owner: Owner,
        unless_finished: bool,
        token: Optional[str],
        *,
        last: bool,
    ) -> Optional[AcquireResult]:
        """One round of acquires on every server: the lease, the holder, or None for a split
        vote worth trying again (never when ``last``)."""
        keys = self.keys(name)
        token = token or new_token()
        clock = self.renewer.clock
        sent_at = clock()
        futures = self._each(
            lambda server: server.try_acquire(
                name, ttl, owner=owner, renew=False, unless_finished=unless_finished, token=token
            )
        )
        taken, refused = 0, 0
        pending = set(futures)
        while pending and taken < self.quorum and refused <= len(futures) - self.quorum:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                if future.exception() is None and isinstance(future.result(), Lease):
                    taken += 1
                else:
                    refused += 1
        validity = ttl - (clock() - sent_at) - drift(ttl)
        lease = QuorumLease(
            locker=self,
            keys=keys,
            token=token,
            ttl=ttl,
            owner=owner,
            fence=None,
            confirmed_at=sent_at,
            deadline=None,
        )
        if taken >= self.quorum and validity > 0:
            lease.pending = [future for future in futures if not future.done()]
            log.debug("acquired %s on %d of %d servers", keys.lock, taken, len(futures))
            return lease
        # Not held: take back whatever was written, once every reply is in.
        lease.pending = futures
        try:
            self._release_everywhere(lease, None)
        except LockBackendUnavailable:
            pass  # best effort: what was written on a server out of reach expires at its TTL
        holders: list[LockHolder] = []
        failures: list[str] = []
        for future in futures:
            error = future.exception()
            if isinstance(error, AlreadyFinished):
                raise error
            if isinstance(error, LockBackendUnavailable):
                failures.append(error.message)
            elif error is not None:
                raise error
            elif isinstance(future.result(), LockHolder):
                holders.append(cast(LockHolder, future.result()))
        answered = len(futures) - len(failures)
        if taken >= self.quorum:
            raise LockBackendUnavailable(
                f"lock {keys.lock} was taken on {taken} of {len(futures)} servers, but too late: "
                f"no validity left of its {ttl}s TTL (slow servers?); released it again",
                keys.lock,
            )
        if answered < self.quorum:
            raise LockBackendUnavailable(
                f"only {answered} of {len(futures)} lock servers answered about {keys.lock}, "
                f"{self.quorum} needed ({'; '.join(failures)}); released what was taken",
                keys.lock,
            )
        if not holders:  # cannot happen: a server that answered took it or named a holder
            raise LockBackendUnavailable(f"no majority for {keys.lock}", keys.lock)
        seen = Counter((h.task_id, h.host, h.pid) for h in holders)
        owner_key, count = seen.most_common(1)[0]
        if count < self.quorum and not last:
            return None  # a split vote: nobody holds a majority, maybe not even the holders
        return max(
            (h for h in holders if (h.task_id, h.host, h.pid) == owner_key),
            key=lambda h: h.ttl or 0.0,
        )

    # -- release ------------------------------------------------------------------------------

    def release(self, lease: Lease, *, remember_for: Optional[float] = None) -> bool:
        """Release ``lease`` on every server at once (compare-and-delete with its token).

        True if it was still ours on a majority. ``remember_for``: see
        :meth:`RedisLocker.release` (the record is written on each server that still held it).

        Raises:
            LockBackendUnavailable: fewer than a majority answered; the lease keeps its token,
                so ``release`` may simply be called again.
        """
        if lease.pid != os.getpid():
            return False
        with _lease._state_lock:
            if lease.released:
                return False
            lease.released = True
        self.renewer.discard(lease)
        try:
            released = self._release_everywhere(lease, remember_for)
        except LockError:
            lease.released = False
            raise
        return released >= self.quorum

    def _release_everywhere(self, lease: Lease, remember_for: Optional[float]) -> int:
        """Compare-and-delete ``lease``'s token on every server; how many deleted it."""
        pending = getattr(lease, "pending", None)
        if pending:
            wait(pending, timeout=PENDING_WAIT)

        def release_on(server: RedisLocker) -> bool:
            return server.release(self._lease_on(server, lease), remember_for=remember_for)

        replies = self._answers(self._each(release_on), lease.key)
        return sum(1 for released in replies if released)

    @staticmethod
    def _lease_on(server: RedisLocker, lease: Lease) -> Lease:
        """``lease`` as seen by one server: the same key and token, released there only."""
        return Lease(
            locker=server,
            keys=lease.keys,
            token=lease.token,
            ttl=lease.ttl,
            owner=lease.owner,
            fence=None,
            confirmed_at=lease.confirmed_at,
            deadline=None,
        )

    def release_abandoned(self, name: str, *, task_id: str, host: str, pid: int) -> bool:
        """Release the lock ``name`` of a dead execution on every server; True if it was
        released on any (see :meth:`RedisLocker.release_abandoned`)."""
        futures = self._each(
            lambda server: server.release_abandoned(name, task_id=task_id, host=host, pid=pid)
        )
        replies: list[Optional[bool]] = self._answers(futures, self.keys(name).lock)
        return any(replies)

    # -- renew --------------------------------------------------------------------------------

    def renew_batch(self, leases: Sequence[Lease], *, now: float) -> list[int]:
        """Renew ``leases`` on every server at once; the indices of the leases renewed on
        fewer than a majority (lost).

        Raises:
            LockBackendUnavailable: fewer than a majority answered (the renewer tries again
                until the TTL has certainly run out).
        """
        if not leases:
            return []
        futures = self._each(lambda server: server.renew_batch(leases, now=now))
        return self._lost(self._answers(futures, leases[0].key), len(leases))

    def renew_by_owner(self, held: Sequence[tuple[str, Owner, float]]) -> list[int]:
        """:meth:`RedisLocker.renew_by_owner` on every server; lost below a majority."""
        if not held:
            return []
        futures = self._each(lambda server: server.renew_by_owner(held))
        return self._lost(self._answers(futures, self.keys(held[0][0]).lock), len(held))

    def _lost(self, replies: list[Optional[list[int]]], count: int) -> list[int]:
        renewed = [0] * count
        for lost in replies:
            if lost is None:
                continue
            gone = set(lost)
            for index in range(count):
                if index not in gone:
                    renewed[index] += 1
        return [index for index, times in enumerate(renewed) if times < self.quorum]

    # -- refused: queued markers need one server ----------------------------------------------

    def enqueue(
        self, name: str, task_id: str, ttl: float, *, resend: bool = False, running: bool = True
    ) -> Optional[str]:
        raise _refused("dedupe_on_enqueue (queued markers)", name)

    def clear_queued(self, name: str, task_id: Optional[str] = None) -> bool:
        raise _refused("a queued marker", name)

    def queued_for(self, name: str) -> Optional[float]:
        raise _refused("a queued marker", name)

    def queued(self, name: str) -> Optional[str]:
        raise _refused("a queued marker", name)

    def close(self) -> None:
        """Close every server's connections and stop the thread pool."""
        self.client.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False)


class QuorumInspector(LockInspector):
    """Reads the locks of a quorum: a lock is held when the same owner holds it on a majority."""

    def __init__(self, locker: QuorumLocker) -> None:
        self.client = locker.client
        self.prefix = locker.prefix
        self._locker = locker

    def per_server(self, name: str) -> list[tuple[str, Any]]:
        """``(server, holder or None or the error)`` of lock ``name`` on each server."""
        futures = self._locker._each(lambda server: server.inspect.read(name))
        views: list[tuple[str, Any]] = []
        for server, future in zip(self._locker.servers, futures):
            error = future.exception()
            views.append((server_address(server), error if error is not None else future.result()))
        return views

    def read(self, name: str) -> Optional[LockHolder]:
        """The holder of ``name`` on a majority, or None.

        Raises:
            LockBackendUnavailable: fewer than a majority answered.
        """
        futures = self._locker._each(lambda server: server.inspect.read(name))
        return self._agreed(self._locker._answers(futures, self._locker.keys(name).lock))

    def _agreed(self, holders: Sequence[Optional[LockHolder]]) -> Optional[LockHolder]:
        """The holder that a majority of ``holders`` names (the copy with the least TTL)."""
        seen = [holder for holder in holders if holder is not None]
        owners = Counter((h.task_id, h.host, h.pid) for h in seen)
        for owner_key, count in owners.items():
            if count >= self._locker.quorum:
                return min(
                    (h for h in seen if (h.task_id, h.host, h.pid) == owner_key),
                    key=lambda h: float("inf") if h.ttl is None else h.ttl,
                )
        return None

    def fence(self, name: str) -> int:
        """The highest fence counter of ``name`` among the servers that answered. Fencing is
        refused on a quorum, so this is 0 unless the servers were used singly before."""
        futures = self._locker._each(lambda server: server.inspect.fence(name))
        return max(value or 0 for value in self._locker._answers(futures, name))

    def scan(self, count: int = 500) -> Iterator[LockHolder]:
        """Every lock held on a majority (SCAN on each server)."""
        futures = self._locker._each(lambda server: list(server.inspect.scan(count)))
        found: dict[str, list[Optional[LockHolder]]] = {}
        for holders in self._locker._answers(futures, f"{self.prefix}:*"):
            for holder in holders or ():
                found.setdefault(holder.key, []).append(holder)
        for key in sorted(found):
            agreed = self._agreed(found[key])
            if agreed is not None:
                yield agreed


def server_address(server: RedisLocker) -> str:
    """``host:port`` (or the socket path) of one server's client, for people."""
    pool: Any = getattr(server.client, "connection_pool", None)
    kwargs = pool.connection_kwargs if pool is not None else {}
    if "path" in kwargs:
        return str(kwargs["path"])
    return f"{kwargs.get('host')}:{kwargs.get('port')}"


class QuorumClient:
    """What the Celery layer asks of ``locker.client`` on a quorum: a subscription to a release
    channel on every server (``pubsub``), and ``close``."""

    def __init__(self, clients: list[redis.Redis]) -> None:
        self.clients = clients

    def pubsub(self, **kwargs: Any) -> QuorumPubSub:
        return QuorumPubSub([client.pubsub(**kwargs) for client in self.clients])  # type: ignore[no-untyped-call]

    def close(self) -> None:
        for client in self.clients:
            client.close()


class QuorumPubSub:
    """Subscriptions on several servers read as one (see :data:`POLL_SLICE`)."""

    def __init__(self, pubsubs: list[Any]) -> None:
        self._all = pubsubs
        self._live: list[Any] = []

    def subscribe(self, *channels: str) -> None:
        """Subscribe on every server that answers; raise the last error if none does."""
        error: Optional[redis.RedisError] = None
        for pubsub in self._all:
            try:
                pubsub.subscribe(*channels)
                self._live.append(pubsub)
            except redis.RedisError as exc:
                error = exc
        if not self._live and error is not None:
            raise error

    def get_message(
        self, ignore_subscribe_messages: bool = False, timeout: float = 0.0
    ) -> Optional[dict[str, Any]]:
        """The first message from any server within ``timeout`` seconds, or None."""
        deadline = time.monotonic() + timeout
        while self._live:
            step = min(POLL_SLICE, max(0.0, deadline - time.monotonic())) / len(self._live)
            for pubsub in list(self._live):
                try:
                    message = pubsub.get_message(ignore_subscribe_messages, step)
                except redis.ConnectionError:
                    self._live.remove(pubsub)  # that server went away: listen to the others
                    pubsub.close()
                    continue
                if message is not None:
                    return cast(dict[str, Any], message)
            if time.monotonic() >= deadline:
                return None
        raise redis.ConnectionError("no lock server left to hear a release from")

    def close(self) -> None:
        for pubsub in self._all:
            pubsub.close()
