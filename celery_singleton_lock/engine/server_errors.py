"""redis-py's exceptions, said as the ``LockError`` family."""

from __future__ import annotations

from typing import Callable, NoReturn, TypeVar

import redis

from celery_singleton_lock.errors import LockBackendUnavailable, LockError, LockNotOwnedError

T = TypeVar("T")

#: Errors that mean "the lock server is not usable right now" rather than a bug of ours.
BACKEND_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.AuthenticationError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.BusyLoadingError,
    # a Redis Cluster without a usable primary for a slot (CLUSTERDOWN, TRYAGAIN during a
    # resharding, no node reachable): redis-py has already retried and refreshed its topology
    redis.exceptions.ClusterError,
    redis.exceptions.TryAgainError,
    redis.exceptions.RedisClusterException,
    # redis-py turns these replies into classes of their own and drops the reply's first
    # word (OOM, NOPERM) from the message, so they must be recognised by class
    *(
        getattr(redis.exceptions, name)
        for name in ("OutOfMemoryError", "NoPermissionError")
        if hasattr(redis.exceptions, name)
    ),
)


def not_a_lock(key: str, detail: str = "") -> LockNotOwnedError:
    """The error for a key at a lock's name that this package did not write."""
    return LockNotOwnedError(
        f"key {key} exists but is not a lock written by this package{detail}; "
        "use a singleton_lock_prefix that no other data shares",
        key,
    )


def translate(exc: Exception, key: str) -> BaseException:
    """The error to raise for ``exc`` about ``key``: a ``LockError``, or ``exc`` if unknown."""
    if isinstance(exc, BACKEND_ERRORS):
        return LockBackendUnavailable(f"lock server unavailable ({type(exc).__name__}: {exc})", key)
    if isinstance(exc, redis.exceptions.ResponseError):
        text = str(exc)
        # A refusal inside a script reads "...@user_script: 16: -OOM command not allowed".
        words = {word.lstrip("-") for word in text.replace(":", " ").split()}
        # NOREPLICAS: min-replicas-to-write refused the write (too few replicas in sync)
        if words & {"OOM", "NOPERM", "NOAUTH", "WRONGPASS", "MISCONF", "READONLY", "NOREPLICAS"}:
            return LockBackendUnavailable(f"lock server refused: {text}", key)
        if words & {"WRONGTYPE", "NOTLOCK"}:
            return not_a_lock(key, f" ({text})")
        return LockError(f"lock server error on {key}: {text}", key)
    return exc


#: What a redis-py call may raise (RedisClusterException, no node reachable or a slot not
#: covered, is not a RedisError).
REDIS_ERRORS = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException)


def call(fn: Callable[[], T], key: str) -> T:
    """``fn()``, one Redis call about ``key``, with redis-py's errors said as ``LockError``."""
    try:
        return fn()
    except REDIS_ERRORS as exc:
        raise_translated(exc, key)


def raise_translated(exc: BaseException, key: str) -> NoReturn:
    """Raise what :func:`translate` makes of ``exc`` (a redis-py error about ``key``)."""
    error = translate(exc, key)  # type: ignore[arg-type]
    if error is exc:
        raise exc
    raise error from exc
