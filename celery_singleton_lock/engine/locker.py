"""The lock engine: acquire, release, renew and inspect leases on one Redis server.

Knows nothing of Celery. One round trip to acquire, one to release, one per tick to renew
every lease of the process (see :mod:`.renewer`). The stored format of a lock is described in
:mod:`.scripts`.
"""

from __future__ import annotations

import logging
import os
import time
from operator import attrgetter
from typing import Any, Callable, Iterator, Optional, Sequence, TypeVar, Union
from urllib.parse import unquote

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from ..errors import AlreadyFinished, LockBackendUnavailable, LockError, LockNotOwnedError
from . import lease as _lease
from . import scripts
from .connections import PinnedConnections
from .keys import LockKeys, validate_prefix
from .lease import Lease, LockHolder, LostCallback, Owner
from .renewer import Renewer, process_renewer
from .settler import ReplySettler, process_settler

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
    # redis-py turns these replies into classes of their own and drops the reply's first
    # word (OOM, NOPERM) from the message, so they must be recognised by class
    *(
        getattr(redis.exceptions, name)
        for name in ("OutOfMemoryError", "NoPermissionError")
        if hasattr(redis.exceptions, name)
    ),
)

AcquireResult = Union[Lease, LockHolder]

#: Called with True (released), False (it was no longer ours) or None (the release failed).
ReleaseCallback = Callable[[Optional[bool]], None]

#: Lock names whose keys a locker keeps built (a plain dict, emptied when it is full).
KEYS_CACHE_SIZE = 4096

_TOKEN_LENGTH = scripts.TOKEN_LENGTH
_lease_wire_key = attrgetter("_wire_key")
_lease_token = attrgetter("token")


def new_token() -> str:
    """A fresh 128-bit random owner token (hex), from ``os.urandom`` as ``secrets`` does."""
    return os.urandom(16).hex()


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


def _escape_host(host: str) -> str:
    if "|" in host or "%" in host:
        return host.replace("%", "%25").replace("|", "%7C")
    return host


def owner_fields(task_id: str, host: str, pid: int) -> str:
    """``'<pid>|<host>|<task_id>'``: the owner part of a lock value, as the scripts store it."""
    return f"{pid}|{_escape_host(host)}|{task_id}"


_default_owner: Optional[tuple[int, Owner, str]] = None


def default_owner() -> tuple[Owner, str]:
    """This process's ``Owner()`` and its lock-value fields, built once per process."""
    global _default_owner
    pid = _lease.current_pid()
    cached = _default_owner
    if cached is None or cached[0] != pid:
        owner = Owner(pid=pid)
        cached = _default_owner = (pid, owner, owner_fields(owner.task_id, owner.host, pid))
    return cached[1], cached[2]


def _holder(key: str, fields: str, pttl: Any) -> Optional[LockHolder]:
    """A holder from ``'fence|acquired_at|pid|host|task_id'``; None if it is not that shape."""
    parts = fields.split("|", 4)
    if len(parts) != 5:
        return None
    fence, acquired_at, pid, host, task_id = parts
    acquired_ms = _int_or_none(acquired_at)
    return LockHolder(
        key=key,
        task_id=task_id,
        host=unquote(host) if "%" in host else host,
        pid=_int_or_none(pid),
        acquired_at=None if acquired_ms is None else acquired_ms / 1000.0,
        fence=_int_or_none(fence),
        ttl=_ttl_seconds(pttl),
    )


def _not_a_lock(key: str) -> LockNotOwnedError:
    return LockNotOwnedError(
        f"key {key} exists but is not a lock written by this package; "
        "use a singleton_lock_prefix that no other data shares",
        key,
    )


class _Lua:
    """A script registered on the client (a redis-py ``Script``) and its SHA1 as sent."""

    __slots__ = ("script", "sha")

    def __init__(self, script: Script) -> None:
        self.script = script
        self.sha = script.sha.encode("ascii")


#: What a locker keeps per lock name: its keys, and the lock key, fence key and channel
#: encoded as the client sends them (so hot paths and renewal skip re-encoding them).
_Named = tuple[LockKeys, bytes, bytes, bytes]


class RedisLocker:
    """Leases on one Redis server (or one primary behind Sentinel).

    Args:
        client: a redis-py client. Its connection pool, timeouts and retry policy are used
            as they are; the engine adds none of its own.
        prefix: namespace of every key this locker writes.
        renewer: renews the leases; defaults to the one renewer of this process.
        settler: reads the confirmations of :meth:`release_soon` releases left unread on an
            idle connection; defaults to the one of this process.
        wall_clock: clock stored as ``acquired_at`` (seconds since the epoch).
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        prefix: str = "singleton-lock",
        renewer: Optional[Renewer] = None,
        settler: Optional[ReplySettler] = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.prefix = validate_prefix(prefix)
        self._renewer = renewer
        self.wall_clock = wall_clock
        self._encode: Callable[[str], bytes] = client.get_encoder().encode
        self._acquire = _Lua(client.register_script(scripts.ACQUIRE))
        self._release = _Lua(client.register_script(scripts.RELEASE))
        self._renew = _Lua(client.register_script(scripts.RENEW))
        self._release_abandoned = _Lua(client.register_script(scripts.RELEASE_ABANDONED))
        self._renew_by_owner = _Lua(client.register_script(scripts.RENEW_BY_OWNER))
        self._names: dict[str, _Named] = {}
        #: Acquire and release run here: connections kept checked out of the client's pool.
        self.connections = PinnedConnections(client, settler=settler or process_settler())

    @property
    def renewer(self) -> Renewer:
        return self._renewer if self._renewer is not None else process_renewer()

    @property
    def settler(self) -> Optional[ReplySettler]:
        return self.connections._settler

    def keys(self, name: str) -> LockKeys:
        """Key names of the lock called ``name`` under this locker's prefix."""
        return self._named(name)[0]

    def wire_keys(self, keys: LockKeys) -> tuple[bytes, bytes]:
        """The lock key and release channel of ``keys`` encoded as this client sends them."""
        return self._encode(keys.lock), self._encode(keys.channel)

    def _named(self, name: str) -> _Named:
        named = self._names.get(name)
        if named is None:
            keys = LockKeys.build(self.prefix, name)
            encode = self._encode
            named = (keys, encode(keys.lock), encode(keys.fence), encode(keys.channel))
            if len(self._names) >= KEYS_CACHE_SIZE:
                self._names.clear()
            self._names[name] = named
        return named

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
            unless_finished: take nothing if ``owner.task_id`` already ran to the end under
                this lock (a release with ``remember_for`` recorded it), in the same round
                trip.

        Raises:
            AlreadyFinished: with ``unless_finished``, that record exists.
            LockBackendUnavailable: the server could not be reached or refused the write.
            LockNotOwnedError: the lock's key holds data this package did not write.
        """
        if not ttl > 0:
            raise ValueError(f"ttl must be a positive number of seconds, got {ttl!r}")
        if max_lifetime is not None and not max_lifetime > 0:
            raise ValueError(f"max_lifetime must be positive or None, got {max_lifetime!r}")
        keys, lock_key, fence_key, channel = self._named(name)
        if owner is None:
            owner, fields = default_owner()
        else:
            fields = owner_fields(owner.task_id, owner.host, owner.pid)
        token = new_token()
        renewer = self.renewer
        sent_at = renewer.clock()
        # The value with an empty fence; the script fills the fence in when fencing.
        value = f"{token}||{int(self.wall_clock() * 1000)}|{fields}"
        ttl_ms = b"%d" % max(1, int(ttl * 1000))
        if unless_finished:
            if not owner.task_id:
                raise ValueError("unless_finished needs an owner with a task_id")
            finished_key = keys.finished(owner.task_id)
            reply = self._script(
                self._acquire,
                keys.lock,
                b"3",
                lock_key,
                fence_key,
                finished_key,
                ttl_ms,
                value,
                b"1" if fencing else b"0",
                pinned=True,
            )
            if reply == -1:
                raise self._already_finished(name, owner.task_id)
        elif fencing:
            reply = self._script(
                self._acquire, keys.lock, b"2", lock_key, fence_key, ttl_ms, value, pinned=True
            )
        else:
            reply = self._script(
                self._acquire, keys.lock, b"1", lock_key, ttl_ms, value, pinned=True
            )
        if type(reply) is not int:
            pttl, _, fields = _text(reply).partition("|")
            holder = _holder(keys.lock, fields, pttl)
            if holder is None:
                raise _not_a_lock(keys.lock)
            return holder
        lease = Lease(
            locker=self,
            keys=keys,
            token=token,
            ttl=ttl,
            owner=owner,
            fence=reply or None,
            confirmed_at=sent_at,
            deadline=None if max_lifetime is None else sent_at + max_lifetime,
            wire_keys=(lock_key, channel),
        )
        if on_lost is not None:
            lease.on_lost(on_lost)
        if renew:
            renewer.add(lease)
        log_acquire.debug("acquired %s (fence=%s)", keys.lock, lease.fence)
        return lease

    # -- release ------------------------------------------------------------------------------

    def release(self, lease: Lease, *, remember_for: Optional[float] = None) -> bool:
        """Release ``lease`` with a compare-and-delete, in one round trip.

        Returns True if the lock was still ours, False if it had expired or been taken over
        (nothing is deleted then). With ``remember_for`` (seconds), the same script records
        that the owner's task id ran to the end: for that long, an acquire of this lock by
        that task id with ``unless_finished`` takes nothing (see :meth:`finished`). Releasing
        twice, or from a forked child that inherited the lease, changes nothing and returns
        False.

        Raises:
            LockBackendUnavailable: the server could not be reached; the lease keeps its
                token (and stays unrenewed), so ``release`` may simply be called again.
        """
        if not self._claim_release(lease):
            return False
        try:
            return self.send_release(lease, remember_for=remember_for)
        except LockBackendUnavailable:
            lease.released = False
            raise

    def release_soon(
        self,
        lease: Lease,
        on_done: Optional[ReleaseCallback] = None,
        *,
        remember_for: Optional[float] = None,
    ) -> bool:
        """Stop renewing ``lease`` and send its release now, without waiting for the reply.

        Redis frees the lock as soon as the command arrives; the caller does not wait the
        round trip. ``on_done`` gets the outcome (see :data:`ReleaseCallback`) once the reply
        is read: by the next command on that connection, or by the process settler thread
        (see :mod:`.connections`). Returns False if there was nothing to release (already
        released, or inherited from a parent). ``remember_for`` as for :meth:`release`.
        """
        if not self._claim_release(lease):
            return False

        def confirmed(reply: Any) -> None:
            owned = self._release_confirmed(lease, reply, remember_for)
            if on_done is not None:
                on_done(owned)

        try:
            self.connections.send(
                "EVALSHA",
                self._release.sha,
                *self._release_args(lease, remember_for),
                on_reply=confirmed,
            )
        except BACKEND_ERRORS as exc:
            confirmed(exc)  # not even sent: released the usual way, with retries
        return True

    def _release_confirmed(
        self, lease: Lease, reply: Any, remember_for: Optional[float]
    ) -> Optional[bool]:
        """The outcome of a release sent by :meth:`release_soon`, from its reply."""
        if not isinstance(reply, BaseException):
            if not reply:
                log_release.warning("released %s but it was no longer ours", lease.key)
            return bool(reply)
        # A compare-and-delete is safe to send again, and its answer is Redis's own: the lock
        # is no longer held under our token. After a broken connection the first send may
        # have run (then "not ours" is our own release), or never reached the server (a
        # restart that lost the key): either way nobody holds it as us, so the answer stands.
        try:
            owned = self.send_release(lease, report=False, remember_for=remember_for)
        except LockError as exc:
            log_release.error(
                "could not release %s (%s); it frees itself within its TTL", lease.key, exc
            )
            return None
        if not owned and not isinstance(reply, NoScriptError):
            log_release.info(
                "release of %s: the connection broke before its reply (%s); the lock is no "
                "longer held under this owner's token",
                lease.key,
                reply,
            )
        return owned

    def _claim_release(self, lease: Lease) -> bool:
        if lease.pid != os.getpid():  # inherited from the parent: never touched here
            return False
        with _lease._state_lock:
            if lease.released:
                return False
            lease.released = True  # from here a failed renewal is not reported as a loss
        self.renewer.discard(lease)
        return True

    def send_release(
        self, lease: Lease, *, report: bool = True, remember_for: Optional[float] = None
    ) -> bool:
        """Run the release script for a lease already marked released; True if it was ours."""
        released = self._script(
            self._release, lease.key, *self._release_args(lease, remember_for), pinned=True
        )
        if not released and report:
            log_release.warning("released %s but it was no longer ours", lease.key)
        return bool(released)

    @staticmethod
    def _release_args(lease: Lease, remember_for: Optional[float]) -> tuple[Any, ...]:
        """numkeys, KEYS and ARGV of the release script for ``lease``."""
        if remember_for is not None and lease.owner.task_id:
            finished = lease.keys.finished(lease.owner.task_id)
            ttl_ms = b"%d" % max(1, int(remember_for * 1000))
            return (b"2", lease._wire_key, finished, lease.token, lease._wire_channel, ttl_ms)
        return (b"1", lease._wire_key, lease.token, lease._wire_channel)

    def finished(self, name: str, task_id: str) -> Optional[LockHolder]:
        """The record that ``task_id`` ran to the end under lock ``name`` (its ``ttl`` is the
        record's remaining life), or None if there is none."""
        keys = self.keys(name)
        record = keys.finished(task_id)

        def fetch() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            pipe.get(record)
            pipe.pttl(record)
            return pipe.execute()

        value, pttl = self._call(fetch, keys.lock)
        return None if value is None else _holder(keys.lock, _text(value), pttl)

    def _already_finished(self, name: str, task_id: str) -> AlreadyFinished:
        keys = self.keys(name)
        return AlreadyFinished(
            f"task id {task_id} already ran to the end under lock {keys.lock} "
            f"(recorded at {keys.finished(task_id)}): nothing was taken",
            keys.lock,
            {"task_id": task_id},
        )

    def release_abandoned(self, name: str, *, task_id: str, host: str, pid: int) -> bool:
        """Release the lock ``name`` if it is held by that (dead) execution; True if released.

        For a supervisor whose child died holding a lock: it cannot know the child's token,
        so the owner metadata stands in for it. Callers must first make sure that ``pid`` on
        ``host`` is really gone.
        """
        keys, lock_key, _, channel = self._named(name)
        fields = owner_fields(task_id, host, pid)
        return bool(
            self._script(self._release_abandoned, keys.lock, b"1", lock_key, fields, channel)
        )

    def release_all(self, timeout: float = 5.0) -> int:
        """Run pending hand-overs, then release every lease this process still holds through
        this locker; returns how many were released here."""
        settler = self.settler
        if settler is not None:
            settler.flush(timeout)
        else:
            self.connections.settle_idle()
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
        still_ours = [True] * len(leases)
        for index in self.renew_batch(leases, now=now):
            still_ours[index] = False
        return still_ours

    def renew_batch(self, leases: Sequence[Lease], *, now: float) -> list[int]:
        """Like :meth:`renew_many`, but return only the indices of the leases NOT renewed.

        One EVALSHA whatever the number of leases: the keys, the first lease's TTL as the
        default, the tokens back to back in one argument, then (index, TTL) pairs for the
        leases whose TTL differs (another ``ttl``, or capped by a deadline).
        """
        if not leases:
            return []
        default_ms = leases[0].ttl_ms
        args: list[Any] = [len(leases)]
        args += map(_lease_wire_key, leases)
        args += (default_ms, "".join(map(_lease_token, leases)))
        others = [
            index
            for index, lease in enumerate(leases)
            if lease.deadline is not None or lease.ttl_ms != default_ms
        ]
        for index in others:
            lease = leases[index]
            ttl_ms = lease.ttl_ms
            if lease.deadline is not None:
                ttl_ms = max(1, int(min(lease.ttl, lease.deadline - now) * 1000))
            args += (index + 1, ttl_ms)
        lost = self._script(self._renew, leases[0].key, *args)
        return [int(index) - 1 for index in lost]

    def renew_by_owner(self, held: Sequence[tuple[str, Owner, float]]) -> list[int]:
        """Renew, in one round trip, each lock ``name`` whose value names exactly ``owner``,
        for ``ttl`` seconds; return the indices (into ``held``) of the locks NOT renewed.

        ``held`` is ``(name, owner, ttl)`` per lock. For a supervisor keeping alive the locks
        of its children without knowing their tokens (a child whose body holds the GIL cannot
        renew its own lease). A lock that is gone (released, expired) or held by any other
        owner is left untouched; none is ever created. Each TTL is replaced, never added to.
        """
        if not held:
            return []
        args: list[Any] = [len(held)]
        args += (self._named(name)[1] for name, _, _ in held)
        args += (owner_fields(owner.task_id, owner.host, owner.pid) for _, owner, _ in held)
        args += (b"%d" % max(1, int(ttl * 1000)) for _, _, ttl in held)
        lost = self._script(self._renew_by_owner, self.keys(held[0][0]).lock, *args)
        return [int(index) - 1 for index in lost]

    # -- inspect ------------------------------------------------------------------------------

    def read(self, name: str) -> Optional[LockHolder]:
        """The holder of lock ``name``, or None when it is free (one pipelined round trip).

        Raises:
            LockNotOwnedError: the lock's key holds data this package did not write.
        """
        keys = self.keys(name)
        return next(iter(self._read_many([keys.lock], strict=True)), None)

    def fence(self, name: str) -> int:
        """The last fence handed out for ``name`` (0 if none yet)."""
        value = self._call(lambda: self.client.get(self.keys(name).fence), name)
        return _int_or_none(value) or 0

    def scan(self, count: int = 500) -> Iterator[LockHolder]:
        """Every lock under this prefix, via ``SCAN`` (never ``KEYS``) plus pipelined reads.

        The pattern ``prefix:{*}`` only matches lock keys (a fence counter key ends in
        ``}:fence``); string keys there that are not lock values are skipped.
        """
        pattern = f"{self.prefix}:{{*}}"
        batch: list[str] = []
        try:
            for raw in self.client.scan_iter(match=pattern, count=count, _type="string"):
                batch.append(_text(raw))
                if len(batch) >= count:
                    yield from self._read_many(batch, strict=False)
                    batch = []
        except BACKEND_ERRORS as exc:
            raise LockBackendUnavailable(f"lock server unavailable during SCAN: {exc}") from exc
        if batch:
            yield from self._read_many(batch, strict=False)

    def _read_many(self, lock_keys: list[str], *, strict: bool) -> list[LockHolder]:
        def fetch() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for key in lock_keys:
                pipe.get(key)
                pipe.pttl(key)
            return pipe.execute()

        replies = self._call(fetch, lock_keys[0])
        holders = []
        for key, value, pttl in zip(lock_keys, replies[0::2], replies[1::2]):
            if value is None:
                continue
            text = _text(value)
            holder = None
            if len(text) > _TOKEN_LENGTH and text[_TOKEN_LENGTH] == "|":
                holder = _holder(key, text[_TOKEN_LENGTH + 1 :], pttl)
            if holder is not None:
                holders.append(holder)
            elif strict:
                raise _not_a_lock(key)
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

    def _script(self, lua: _Lua, key: str, *args: Any, pinned: bool = False) -> Any:
        """EVALSHA ``lua`` with ``args`` (numkeys, keys, argv), loading it on NOSCRIPT.

        What ``Script.__call__`` does (same SHA, a ``SCRIPT LOAD`` fallback, and the
        ``Script`` keeps the new SHA), minus the per-call pipeline check (an import and an
        ``isinstance`` against a protocol class) and two wrapper calls. With ``pinned`` it runs
        on the locker's own connections (:mod:`.connections`), as acquire and release do.
        """
        execute: Callable[..., Any] = (
            self.connections.call if pinned else self.client.execute_command
        )
        try:
            try:
                return execute("EVALSHA", lua.sha, *args)
            except NoScriptError:
                self._load_scripts()
                return execute("EVALSHA", lua.sha, *args)
        except redis.exceptions.RedisError as exc:
            error = self._translate(exc, key)
            if error is exc:
                raise
            raise error from exc

    def _load_scripts(self) -> None:
        """Load every script of this locker, in one pipelined round trip.

        After one NOSCRIPT they are all gone (a restart, a failover, ``SCRIPT FLUSH``), and a
        release sent without waiting (:meth:`release_soon`) must find its script there.
        """
        luas = (
            self._acquire,
            self._release,
            self._renew,
            self._release_abandoned,
            self._renew_by_owner,
        )
        pipe = self.client.pipeline(transaction=False)
        for lua in luas:
            pipe.script_load(lua.script.script)
        for lua, sha in zip(luas, pipe.execute()):
            lua.script.sha = _text(sha)
            lua.sha = lua.script.sha.encode("ascii")

    def _call(self, fn: Callable[..., T], key: str, *args: Any) -> T:
        """Run one Redis call, mapping server trouble to ``LockBackendUnavailable``."""
        try:
            return fn(*args)
        except redis.exceptions.RedisError as exc:
            error = self._translate(exc, key)
            if error is exc:
                raise
            raise error from exc

    @staticmethod
    def _translate(exc: redis.exceptions.RedisError, key: str) -> BaseException:
        """The error to raise for ``exc``: a ``LockError``, or ``exc`` itself if unknown."""
        if isinstance(exc, BACKEND_ERRORS):
            return LockBackendUnavailable(
                f"lock server unavailable ({type(exc).__name__}: {exc})", key
            )
        if isinstance(exc, redis.exceptions.ResponseError):
            text = str(exc)
            # A refusal inside a script reads "...@user_script: 16: -OOM command not allowed".
            words = {word.lstrip("-") for word in text.replace(":", " ").split()}
            if words & {"OOM", "NOPERM", "NOAUTH", "WRONGPASS", "MISCONF", "READONLY"}:
                return LockBackendUnavailable(f"lock server refused: {text}", key)
            if words & {"WRONGTYPE", "NOTLOCK"}:
                return LockNotOwnedError(
                    f"key {key} exists but is not a lock written by this package ({text}); "
                    "use a singleton_lock_prefix that no other data shares",
                    key,
                )
            return LockError(f"lock server error on {key}: {text}", key)
        return exc
