"""A lock server behind Sentinel: ``sentinel://`` URLs (Celery's own form), the options of
the sentinel connections, and the connection class that asks the sentinels again whenever
it reconnects, so that a kept connection follows a failover."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional
from urllib.parse import urlsplit

import redis
import redis.sentinel

from celery_singleton_lock.celery.config.urls import (
    SENTINEL_PORT,
    SENTINEL_SCHEME,
    redact,
    redact_loosely,
)
from celery_singleton_lock.errors import LockConfigurationError

#: redis-py's Sentinel manager (untyped in redis-py 4.x).
_Sentinel: Any = redis.sentinel.Sentinel


class SentinelMasterConnection(redis.sentinel.SentinelManagedConnection):
    """redis-py's connection to a Sentinel group's master, that asks the sentinels again
    whenever it reconnects.

    redis-py's own class asks them only in ``connect()``. In recent redis-py (8.1; not 4.5) a
    disconnected connection reconnects from ``send_packed_command`` through
    ``connect_check_health()`` instead, to the address it had: a connection that the locker
    keeps checked out (see ``engine/redis_server.py``) and that was dropped because its master was
    demoted (``READONLY``) went back to the demoted master at every retry and never reached
    the new one.
    """

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if self._sock is None:
            self.connect()  # type: ignore[no-untyped-call]
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]


class SentinelMasterSSLConnection(
    SentinelMasterConnection, redis.sentinel.SentinelManagedSSLConnection
):
    """:class:`SentinelMasterConnection` over TLS (``singleton_lock_redis_options``
    ``{"ssl": True, ...}``)."""


@dataclass(frozen=True)
class SentinelURL:
    """What a ``sentinel://`` URL says: the sentinels, and the master's db and credentials
    (from its first part, as Celery's result backend reads them)."""

    sentinels: list[tuple[str, int]]
    db: int = 0
    username: Optional[str] = None
    password: Optional[str] = None


def parse_sentinel_url(url: str) -> SentinelURL:
    """Parse ``sentinel://[[user]:password@]host[:port][/db];sentinel://host[:port];...``.

    Raises:
        LockConfigurationError: a part is not ``sentinel://host:port[/db]``.
    """
    sentinels: list[tuple[str, int]] = []
    first: Any = None
    for part in (chunk.strip() for chunk in url.split(";")):
        if not part:
            continue
        shown = redact_loosely(part)
        try:
            parts = urlsplit(part)
            port = parts.port or SENTINEL_PORT
        except ValueError as exc:
            raise LockConfigurationError(f"sentinel URL part {shown!r} is invalid: {exc}") from None
        if parts.scheme != SENTINEL_SCHEME or not parts.hostname:
            raise LockConfigurationError(
                f"sentinel URL part {shown!r} is not sentinel://host:port; separate the "
                "sentinels with ';', each as sentinel://host:port"
            )
        if parts.query:
            raise LockConfigurationError(
                f"sentinel URL part {shown!r} has a query string, which is not read; give "
                "client options in singleton_lock_redis_options"
            )
        db = parts.path.strip("/")
        if db and not db.isdigit():
            raise LockConfigurationError(
                f"sentinel URL part {shown!r}: database {db!r} is not a number"
            )
        sentinels.append((parts.hostname, port))
        first = first or parts
    if first is None:
        raise LockConfigurationError(f"sentinel URL {redact_loosely(url)!r} names no sentinel")
    return SentinelURL(
        sentinels=sentinels,
        db=int(first.path.strip("/") or 0),
        username=first.username or None,
        password=first.password,
    )


def sentinel_options(
    url: str,
    transport_options: Optional[Mapping[str, Any]],
    *,
    options_setting: str = "singleton_lock_transport_options",
) -> dict[str, Any]:
    """The Sentinel settings among ``transport_options``: ``master_name`` (required),
    ``sentinel_kwargs`` and ``min_other_sentinels``.

    Raises:
        LockConfigurationError: no master name, or an option of the wrong type.
    """
    options = dict(transport_options or {})
    master_name = options.get("master_name")
    if not isinstance(master_name, str) or not master_name:
        raise LockConfigurationError(
            f"sentinel URL {redact(url)!r} needs the name of the master to follow: set "
            f"{options_setting} = {{'master_name': 'mymaster'}}"
            + (f" (got master_name={master_name!r})" if master_name is not None else "")
        )
    sentinel_kwargs = options.get("sentinel_kwargs") or {}
    if not isinstance(sentinel_kwargs, Mapping):
        raise LockConfigurationError(
            f"{options_setting}: sentinel_kwargs must be a dict of redis.Redis arguments for "
            f"the connections to the sentinels, got {sentinel_kwargs!r}"
        )
    min_others = options.get("min_other_sentinels", 0)
    if isinstance(min_others, bool) or not isinstance(min_others, int) or min_others < 0:
        raise LockConfigurationError(
            f"{options_setting}: min_other_sentinels must be an integer >= 0, got {min_others!r}"
        )
    return {
        "master_name": master_name,
        "sentinel_kwargs": dict(sentinel_kwargs),
        "min_other_sentinels": min_others,
    }
