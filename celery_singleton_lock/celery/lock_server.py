"""Which Redis holds an app's locks, and the one locker per app and process that talks to it."""

from __future__ import annotations

import threading
import weakref
from typing import Any, Optional
from urllib.parse import parse_qs, urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from ..engine import RedisLocker
from ..errors import LockConfigurationError
from .options import lock_prefix

REDIS_SCHEMES = ("redis", "rediss", "unix")
DEFAULT_URL = "redis://localhost:6379/0"

#: Client defaults: fail within seconds rather than hang a worker slot when Redis is down.
#: Retrying a command is safe: acquire recognises its own token, release and renew are
#: idempotent. ``singleton_lock_redis_options`` overrides any of them.
CLIENT_DEFAULTS: dict[str, Any] = {
    "socket_timeout": 5.0,
    "socket_connect_timeout": 2.0,
    "health_check_interval": 30,
}


def _first_url(value: Any) -> Optional[str]:
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    if not isinstance(value, str) or not value:
        return None
    return value.split(";")[0].strip()


def _is_redis(url: Optional[str]) -> bool:
    return bool(url) and urlsplit(url).scheme in REDIS_SCHEMES


def _setting(conf: Any, name: str) -> Any:
    # A Celery app's settings read $CELERY_BROKER_URL, $CELERY_BROKER_WRITE_URL and
    # $CELERY_RESULT_BACKEND (what `celery -b` and `--result-backend` set) in their properties
    # of those names; conf.get() sees only what the app configured.
    return getattr(conf, name, None) or conf.get(name)


def choose_url(conf: Any) -> tuple[str, str]:
    """The lock server URL and where it came from (the setting, broker, backend or default)."""
    explicit = conf.get("singleton_lock_url")
    if explicit:
        try:
            return check_url(explicit), "singleton_lock_url"
        except LockConfigurationError as exc:
            raise LockConfigurationError(f"singleton_lock_url: {exc.message}") from None
    broker = _first_url(_setting(conf, "broker_write_url") or _setting(conf, "broker_url"))
    if _is_redis(broker):
        return broker, "broker_url"  # type: ignore[return-value]
    backend = _first_url(_setting(conf, "result_backend"))
    if _is_redis(backend):
        return backend, "result_backend"  # type: ignore[return-value]
    return DEFAULT_URL, "default"


def redact(url: str) -> str:
    """``url`` with its password hidden, for logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def redact_loosely(url: str) -> str:
    """``url`` with its password hidden, even when it does not parse."""
    try:
        return redact(url)
    except ValueError:
        scheme, sep, rest = url.rpartition("://")
        return f"{scheme}{sep}***@{rest.rsplit('@', 1)[1]}" if "@" in rest else url


def check_url(url: str) -> str:
    """``url`` if redis-py would connect where it says, else ``LockConfigurationError``.

    redis-py rejects a non-Redis scheme only with a traceback-worthy ``ValueError`` and
    silently ignores a database path that is not a number (querying db 0 instead).
    """
    shown = redact_loosely(url)
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError when it is not a number
    except ValueError as exc:
        raise LockConfigurationError(f"lock server URL {shown!r} is invalid: {exc}") from None
    if parts.scheme not in REDIS_SCHEMES:
        raise LockConfigurationError(
            f"lock server URL {shown!r} is not a Redis URL; use redis://host:port/db, "
            "rediss://host:port/db (TLS) or unix:///path/to/socket"
        )
    if parts.scheme == "unix" and not parts.path:
        raise LockConfigurationError(f"lock server URL {shown!r} names no socket path")
    databases = parse_qs(parts.query).get("db", [])
    if parts.scheme != "unix" and parts.path.strip("/"):
        databases.append(parts.path.strip("/"))
    for db in databases:
        if not db.isdigit():
            raise LockConfigurationError(
                f"lock server URL {shown!r}: database {db!r} is not a number"
            )
    return url


def make_client(url: str, options: Optional[dict[str, Any]] = None) -> redis.Redis:
    """A redis-py client for ``url`` (TLS and ACL user/password come from the URL)."""
    settings = {
        **CLIENT_DEFAULTS,
        "retry": Retry(ExponentialBackoff(cap=0.2, base=0.02), 2),
        **(options or {}),
    }
    return redis.Redis.from_url(url, **settings)


_lockers: weakref.WeakKeyDictionary[Any, RedisLocker] = weakref.WeakKeyDictionary()
_lockers_lock = threading.Lock()


def locker_for(app: Any) -> RedisLocker:
    """The locker of ``app`` (created on first use; redis-py's pool is fork-safe)."""
    locker = _lockers.get(app)
    if locker is None:
        with _lockers_lock:
            locker = _lockers.get(app)
            if locker is None:
                conf = app.conf
                url, _source = choose_url(conf)
                prefix = lock_prefix(conf)
                client = make_client(url, conf.get("singleton_lock_redis_options"))
                locker = RedisLocker(client, prefix=prefix)
                _lockers[app] = locker
    return locker


def forget_locker(app: Any) -> None:
    """Drop ``app``'s locker, e.g. after its settings changed (tests)."""
    with _lockers_lock:
        locker = _lockers.pop(app, None)
    if locker is not None:
        locker.client.close()


def all_lockers() -> list[RedisLocker]:
    with _lockers_lock:
        return list(_lockers.values())
