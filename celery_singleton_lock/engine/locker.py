"""The lock engine: acquire, release, renew and inspect leases on one Redis server.

Knows nothing of Celery. One round trip to acquire, one to release, one per tick to renew
every lease of the process (see :mod:`.renewer`).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from typing import Any, Callable, Iterator, Optional, Sequence, TypeVar, Union

import redis
from redis.commands.core import Script

from ..errors import LockBackendUnavailable, LockError, LockNotOwnedError
from . import scripts
from .keys import LockKeys, validate_prefix
from .lease import Lease, LockHolder, LostCallback, Owner
from .renewer import Renewer, process_renewer

log_acquire = logging.getLogger("celery_singleton_lock.acquire")
log_release = logging.getLogger("celery_singleton_lock.release")

T = TypeVar("T")

#: Errors that mean "the lock server is not usable right now" rather than a bug of ours.
BACKEND_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.AuthenticationError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.BusyLoadingError,
)

AcquireResult = Union[Lease, LockHolder]


def new_token() -> str:
    """A fresh 128-bit random owner token (hex)."""
    return secrets.token_hex(16)


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def _int_or_none(value: Any) -> Optional[int]:
    text = _text(value)
    return int(text) if text.lstrip("-").isdigit() else None


def _ttl_seconds(pttl: Any) -> Optional[float]:
    ms = _int_or_none(pttl)
    return None if ms is None or ms < 0 else ms / 1000.0


class RedisLocker:
    """Leases on one Redis server (or one primary behind Sentinel).

    Args:
        client: a redis-py client. Its connection pool, timeouts and retry policy are used
            as they are; the engine adds none of its own.
        prefix: namespace of every key this locker writes.
        renewer: renews the leases; defaults to the one renewer of this process.
        wall_clock: clock stored as ``acquired_at`` (seconds since the epoch).
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        prefix: str = "singleton-lock",
        renewer: Optional[Renewer] = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.prefix = validate_prefix(prefix)
        self._renewer = renewer
        self.wall_clock = wall_clock
        self._acquire: Script = client.register_script(scripts.ACQUIRE)
        self._release: Script = client.register_script(scripts.RELEASE)
        self._renew: Script = client.register_script(scripts.RENEW)
        self._release_abandoned: Script = client.register_script(scripts.RELEASE_ABANDONED)
        self._leases_lock = threading.Lock()

    @property
    def renewer(self) -> Renewer:
        return self._renewer if self._renewer is not None else process_renewer()

    def keys(self, name: str) -> LockKeys:
        """Key names of the lock called ``name`` under this locker's prefix."""
        return LockKeys.build(self.prefix, name)

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
    ) -> AcquireResult:
        """Take the lock ``name`` for ``ttl`` seconds, in one round trip, without waiting.

        Returns the :class:`Lease` when acquired, or the current :class:`LockHolder` (with
        its remaining TTL) when someone else holds it.

        Args:
            renew: keep the lease alive from the process renewer until it is released.
            max_lifetime: seconds after which renewal stops (the key then expires within
                ``ttl``); None renews until release.
            fencing: hand out a fencing token, strictly increasing per lock name.
            on_lost: called once, from the renewer thread, if the lease is lost.

        Raises:
            LockBackendUnavailable: the server could not be reached or refused the write.
        """
        if not ttl > 0:
            raise ValueError(f"ttl must be a positive number of seconds, got {ttl!r}")
        if max_lifetime is not None and not max_lifetime > 0:
            raise ValueError(f"max_lifetime must be positive or None, got {max_lifetime!r}")
        return self._acquire_once(
            self.keys(name), ttl, owner or Owner(), fencing, renew, max_lifetime, on_lost
        )

    def _acquire_once(
        self,
        keys: LockKeys,
        ttl: float,
        owner: Owner,
        fencing: bool,
        renew: bool,
        max_lifetime: Optional[float],
        on_lost: Optional[LostCallback],
    ) -> AcquireResult:
        token = new_token()
        renewer = self.renewer
        sent_at = renewer.clock()
        reply = self._call(
            self._acquire,
            keys.lock,
            [keys.lock, keys.fence],
            [
                token,
                max(1, int(ttl * 1000)),
                "1" if fencing else "0",
                owner.task_id,
                owner.host,
                owner.pid,
                int(self.wall_clock() * 1000),
            ],
        )
        if int(reply[0]) != 1:
            task_id, host, pid, acquired_at, fence, pttl = reply[1:7]
            acquired_ms = _int_or_none(acquired_at)
            return LockHolder(
                key=keys.lock,
                task_id=_text(task_id),
                host=_text(host),
                pid=_int_or_none(pid),
                acquired_at=None if acquired_ms is None else acquired_ms / 1000.0,
                fence=_int_or_none(fence),
                ttl=_ttl_seconds(pttl),
            )
        lease = Lease(
            locker=self,
            keys=keys,
            token=token,
            ttl=ttl,
            owner=owner,
            fence=_int_or_none(reply[1]),
            confirmed_at=sent_at,
            deadline=None if max_lifetime is None else sent_at + max_lifetime,
        )
        if on_lost is not None:
            lease.on_lost(on_lost)
        if renew:
            renewer.add(lease)
        log_acquire.debug("acquired %s (fence=%s)", keys.lock, lease.fence)
        return lease

    # -- release ------------------------------------------------------------------------------

    def release(self, lease: Lease) -> bool:
        """Release ``lease`` with a compare-and-delete, in one round trip.

        Returns True if the lock was still ours, False if it had expired or been taken over
        (nothing is deleted then). Releasing twice, or from a forked child that inherited the
        lease, changes nothing and returns False.

        Raises:
            LockBackendUnavailable: the server could not be reached; the lease keeps its
                token (and stays unrenewed), so ``release`` may simply be called again.
        """
        if lease.inherited:
            return False
        with self._leases_lock:
            if lease.released:
                return False
            lease.released = True  # from here a failed renewal is not reported as a loss
        self.renewer.discard(lease)
        try:
            released = self._call(
                self._release, lease.key, [lease.key], [lease.token, lease.keys.channel]
            )
        except LockBackendUnavailable:
            lease.released = False
            raise
        if not released:
            log_release.warning("released %s but it was no longer ours", lease.key)
        return bool(released)

    def release_abandoned(self, name: str, *, task_id: str, host: str, pid: int) -> bool:
        """Release the lock ``name`` if it is held by that (dead) execution; True if released.

        For a supervisor whose child died holding a lock: it cannot know the child's token,
        so the owner metadata stands in for it. Callers must first make sure that ``pid`` on
        ``host`` is really gone.
        """
        keys = self.keys(name)
        return bool(
            self._call(
                self._release_abandoned,
                keys.lock,
                [keys.lock],
                [task_id, host, pid, keys.channel],
            )
        )

    def release_all(self) -> int:
        """Release every lease this process holds through this locker; returns how many."""
        released = 0
        for lease in self.renewer.leases():
            if lease.locker is self and lease.held:
                try:
                    released += self.release(lease)
                except LockError as exc:
                    log_release.error("could not release %s: %s", lease.key, exc)
        return released

    # -- renew --------------------------------------------------------------------------------

    def renew_many(self, leases: Sequence[Lease], *, now: float) -> list[bool]:
        """Renew ``leases`` in one round trip; return, per lease, whether it is still ours.

        Each TTL is replaced (never extended past ``ttl`` from now), and capped at the lease's
        deadline so renewal never outlives its maximum lifetime.
        """
        keys: list[str] = []
        argv: list[Any] = []
        for lease in leases:
            ttl = lease.ttl if lease.deadline is None else min(lease.ttl, lease.deadline - now)
            keys.append(lease.key)
            argv.extend((lease.token, max(1, int(ttl * 1000))))
        reply = self._call(self._renew, keys[0], keys, argv)
        return [bool(int(flag)) for flag in reply]

    # -- inspect ------------------------------------------------------------------------------

    def read(self, name: str) -> Optional[LockHolder]:
        """The holder of lock ``name``, or None when it is free (one pipelined round trip)."""
        keys = self.keys(name)
        return next(iter(self._read_many([keys.lock])), None)

    def fence(self, name: str) -> int:
        """The last fence handed out for ``name`` (0 if none yet)."""
        value = self._call(lambda: self.client.get(self.keys(name).fence), name)
        return _int_or_none(value) or 0

    def scan(self, count: int = 500) -> Iterator[LockHolder]:
        """Every lock under this prefix, via ``SCAN`` (never ``KEYS``) plus pipelined reads."""
        pattern = f"{self.prefix}:{{*}}"
        batch: list[str] = []
        try:
            for raw in self.client.scan_iter(match=pattern, count=count, _type="hash"):
                batch.append(_text(raw))
                if len(batch) >= count:
                    yield from self._read_many(batch)
                    batch = []
        except BACKEND_ERRORS as exc:
            raise LockBackendUnavailable(f"lock server unavailable during SCAN: {exc}") from exc
        if batch:
            yield from self._read_many(batch)

    def _read_many(self, lock_keys: list[str]) -> list[LockHolder]:
        def fetch() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for key in lock_keys:
                pipe.hgetall(key)
                pipe.pttl(key)
            return pipe.execute()

        replies = self._call(fetch, lock_keys[0])
        holders = []
        for key, fields, pttl in zip(lock_keys, replies[0::2], replies[1::2]):
            if not fields:
                continue
            data = {_text(k): v for k, v in fields.items()}
            acquired_ms = _int_or_none(data.get("acquired_at"))
            holders.append(
                LockHolder(
                    key=key,
                    task_id=_text(data.get("task_id")),
                    host=_text(data.get("host")),
                    pid=_int_or_none(data.get("pid")),
                    acquired_at=None if acquired_ms is None else acquired_ms / 1000.0,
                    fence=_int_or_none(data.get("fence")),
                    ttl=_ttl_seconds(pttl),
                )
            )
        return holders

    # -- waiting ------------------------------------------------------------------------------

    def subscribe_releases(self, name: str) -> redis.client.PubSub:
        """A subscription to the release channel of ``name`` (the caller closes it)."""
        pubsub: redis.client.PubSub = self.client.pubsub(  # type: ignore[no-untyped-call]
            ignore_subscribe_messages=True
        )
        channel = self.keys(name).channel
        self._call(lambda: pubsub.subscribe(channel), channel)
        return pubsub

    def wait_for_release(self, pubsub: redis.client.PubSub, timeout: float) -> bool:
        """Block until a release is published on ``pubsub`` or ``timeout`` passes.

        Returns True when woken by a release. A crashed holder publishes nothing, so callers
        bound ``timeout`` by the holder's remaining TTL.
        """
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            message = self._call(pubsub.get_message, "pubsub", False, remaining)
            if message is not None and message.get("type") == "message":
                return True

    # -- plumbing -----------------------------------------------------------------------------

    def _call(self, fn: Callable[..., T], key: str, *args: Any) -> T:
        """Run one Redis call, mapping server trouble to ``LockBackendUnavailable``."""
        try:
            if isinstance(fn, Script):
                return fn(keys=args[0], args=args[1])  # type: ignore[no-any-return]
            return fn(*args)
        except BACKEND_ERRORS as exc:
            raise LockBackendUnavailable(
                f"lock server unavailable ({type(exc).__name__}: {exc})", key
            ) from exc
        except redis.exceptions.ResponseError as exc:
            text = str(exc)
            words = set(text.replace(":", " ").split())
            if words & {"OOM", "NOPERM", "NOAUTH", "WRONGPASS", "MISCONF", "READONLY"}:
                raise LockBackendUnavailable(f"lock server refused: {text}", key) from exc
            if "WRONGTYPE" in words:
                raise LockNotOwnedError(
                    f"key {key} exists but is not a lock written by this package ({text}); "
                    "use a singleton_lock_prefix that no other data shares",
                    key,
                ) from exc
            raise LockError(f"lock server error on {key}: {text}", key) from exc
