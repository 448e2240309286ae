"""Reading a Redlock quorum (see :mod:`.redlock`): what it supports, who holds a lock on a
majority, each server's own view, and a subscription to a lock's release on every server."""

from __future__ import annotations

import time
from collections import Counter
from typing import (
    TYPE_CHECKING,
    Any,
    Iterator,
    Optional,
    Sequence,
    TypeVar,
    cast,
)

import redis

from celery_singleton_lock.engine import server_errors
from celery_singleton_lock.engine.capabilities import Capabilities
from celery_singleton_lock.engine.fan_out import FanOut
from celery_singleton_lock.engine.lease import LockHolder
from celery_singleton_lock.engine.reading import server_address

if TYPE_CHECKING:
    from celery_singleton_lock.engine.locker import RedisLocker

T = TypeVar("T")

#: Longest slice a waiter listens on one server's subscription before the next (seconds).
POLL_SLICE = 0.05


#: What a quorum supports (see the module docstring for why each is refused).
QUORUM = Capabilities(
    fencing=False,
    replica_acks=False,
    parking=False,
    enqueue_markers=False,
    cluster=False,
    kind="a Redlock quorum of independent Redis servers",
    instead="use one Redis server (or Sentinel / Cluster)",
    slots=False,
    cooldown=False,
    rate=False,
    reasons=(
        (
            "fencing",
            "a fencing token needs one counter, and a counter per independent master is not "
            "one: a master restarted without fsync'd persistence counts again from 0, and the "
            "next majority need not include the master that handed out the highest fence",
        ),
        ("replica_acks", "replica acknowledgement (WAIT) is a property of one master"),
        ("enqueue_markers", "the queued marker would live on one master, not on the quorum"),
        ("parking", "parked messages and the index that hands them the lock live on one server"),
        (
            "slots",
            "N slots taken on each master apart need not be the same N on a majority: two "
            "majorities may each count a different set of holders, and no proof bounds them",
        ),
        (
            "cooldown",
            "a cooldown written on a majority is not seen by a later majority that misses "
            "those masters; no proof bounds it",
        ),
        (
            "rate",
            "starts counted on each master apart are not one count: a majority that misses "
            "the masters of earlier starts would allow more; no proof bounds it",
        ),
    ),
)


class QuorumInspector:
    """Reads the locks of a quorum: a lock is held when the same owner holds it on a majority."""

    def __init__(self, quorum: FanOut, prefix: str) -> None:
        self.prefix = prefix
        self._quorum = quorum

    def per_server(self, name: str) -> list[tuple[str, Any]]:
        """``(server, holder or None or the error)`` of lock ``name`` on each server."""
        futures = self._quorum.each(lambda server: server.inspect.read(name))
        views: list[tuple[str, Any]] = []
        for server, future in zip(self._quorum.servers, futures):
            error = future.exception()
            views.append(
                (server_address(server.client), error if error is not None else future.result())
            )
        return views

    def holders(self, name: str, limit: int) -> list[LockHolder]:
        """The holder of lock ``name`` (a quorum has one slot: its capabilities refuse more)."""
        holder = self.read(name)
        return [] if holder is None else [holder]

    def read(self, name: str) -> Optional[LockHolder]:
        """The holder of ``name`` on a majority, or None.

        Raises:
            LockBackendUnavailable: fewer than a majority answered.
        """
        futures = self._quorum.each(lambda server: server.inspect.read(name))
        key = self._quorum.servers[0].keys(name).lock
        return self._agreed(self._quorum.answers(futures, key))

    def _agreed(self, holders: Sequence[Optional[LockHolder]]) -> Optional[LockHolder]:
        """The holder that a majority of ``holders`` names (the copy with the least TTL)."""
        seen = [holder for holder in holders if holder is not None]
        owners = Counter((h.task_id, h.host, h.pid) for h in seen)
        for owner_key, count in owners.items():
            if count >= self._quorum.quorum:
                return min(
                    (h for h in seen if (h.task_id, h.host, h.pid) == owner_key),
                    key=lambda h: float("inf") if h.ttl is None else h.ttl,
                )
        return None

    def fence(self, name: str) -> int:
        """The highest fence counter of ``name`` among the servers that answered. Fencing is
        refused on a quorum, so this is 0 unless the servers were used singly before."""
        futures = self._quorum.each(lambda server: server.inspect.fence(name))
        return max(value or 0 for value in self._quorum.answers(futures, name))

    def scan(self, count: int = 500) -> Iterator[LockHolder]:
        """Every lock held on a majority (SCAN on each server)."""
        futures = self._quorum.each(lambda server: list(server.inspect.scan(count)))
        found: dict[str, list[Optional[LockHolder]]] = {}
        for holders in self._quorum.answers(futures, f"{self.prefix}:*"):
            for holder in holders or ():
                found.setdefault(holder.key, []).append(holder)
        for key in sorted(found):
            agreed = self._agreed(found[key])
            if agreed is not None:
                yield agreed


class QuorumSubscription:
    """Subscriptions to one release channel on several servers, read as one: a waiter polls
    them in turn in slices of at most :data:`POLL_SLICE` seconds, so it wakes within about that
    long of the first publish."""

    def __init__(self, servers: Sequence[RedisLocker], channel: str) -> None:
        self._all: list[Any] = []
        self._live: list[Any] = []
        error: Optional[Exception] = None
        for server in servers:
            pubsub = server.client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
            self._all.append(pubsub)
            try:
                pubsub.subscribe(channel)
                self._live.append(pubsub)
            except redis.RedisError as exc:
                error = exc
        if not self._live and error is not None:
            self.close()
            raise server_errors.translate(error, channel)

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
