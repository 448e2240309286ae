"""Which Redis holds an app's locks (the URL chosen from the settings), and the redis-py
client that talks to it.

The lock server is one Redis (``redis://``, ``rediss://``, ``unix://``) or the master of a
Sentinel group (``sentinel://host:port;sentinel://host:port;...``, Celery's own form). A Sentinel
URL names the sentinels only: the group's name (``master_name``) and the options of the
sentinel connections (``sentinel_kwargs``, ``min_other_sentinels``) come from transport options
shaped like Celery's ``broker_transport_options`` (:func:`transport_options`). The client is
redis-py's own ``Sentinel(...).master_for(...)``: it asks the sentinels where the master is at
each new connection and reconnects when a master it talks to turns out to be a replica
(``READONLY``), so a worker follows a failover with no code of ours.

A Redis Cluster is named by the URL of any of its nodes. Whether the server is one is asked
once, when the client is made (``INFO cluster``), unless ``singleton_lock_cluster`` says so;
the client is then redis-py's own ``RedisCluster``, which discovers the other nodes and follows
MOVED, ASK and failovers.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any, Mapping, Optional
from urllib.parse import parse_qs, urlsplit

import redis
import redis.sentinel
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from celery_singleton_lock.celery.config.app_settings import celery_setting
from celery_singleton_lock.celery.config.sentinel import (
    SentinelMasterConnection,
    SentinelMasterSSLConnection,
    _Sentinel,
    parse_sentinel_url,
    sentinel_options,
)
from celery_singleton_lock.celery.config.urls import (
    REDIS_SCHEMES,
    as_url,
    is_postgres,
    is_sentinel,
    quorum_urls,
    redact,
    redact_loosely,
)
from celery_singleton_lock.engine import MIN_SERVERS, Client
from celery_singleton_lock.errors import LockBackendUnavailable, LockConfigurationError

log = logging.getLogger("celery_singleton_lock.worker")
DEFAULT_URL = "redis://localhost:6379/0"


#: Where the transport options of a lock URL come from, by where the URL came from.
TRANSPORT_OPTIONS_SETTINGS = {
    "singleton_lock_url": "singleton_lock_transport_options",
    "broker_url": "broker_transport_options",
    "result_backend": "result_backend_transport_options",
}

#: Client defaults: fail within seconds rather than hang a worker slot when Redis is down.
#: Retrying a command is safe: acquire recognises its own token, release and renew are
#: idempotent. ``singleton_lock_redis_options`` overrides any of them.
CLIENT_DEFAULTS: dict[str, Any] = {
    "socket_timeout": 5.0,
    "socket_connect_timeout": 2.0,
    "health_check_interval": 30,
}

#: The first part of the name the package's connections give themselves (``CLIENT SETNAME``).
CLIENT_NAME_PREFIX = "celery-singleton-lock"


def client_name() -> str:
    """The name of this process's connections to the lock server, sent by redis-py as each
    connects (``CLIENT SETNAME``), so that ``CLIENT LIST`` shows who holds what beside
    Celery's own named connections: ``celery-singleton-lock:<host>:<pid>``. Made with the
    client, so a pool child's (which makes its own) carries the child's pid.
    ``singleton_lock_redis_options={"client_name": ...}`` overrides it."""
    return f"{CLIENT_NAME_PREFIX}:{socket.gethostname()}:{os.getpid()}"


def _inherited_url(value: Any) -> Optional[str]:
    """The lock server a broker or backend setting names: all its sentinels for a Sentinel
    URL (a list of them is joined), else its first URL (the others are failover servers)."""
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(part, str) and is_sentinel(part) for part in value):
            value = ";".join(value)
        else:
            value = value[0] if value else None
    if not isinstance(value, str) or not value.strip():
        return None
    if is_sentinel(value):
        return value.strip()
    first = value.split(";")[0].strip()
    return first if urlsplit(first).scheme in REDIS_SCHEMES else None


def transport_options(conf: Any, source: str) -> dict[str, Any]:
    """The transport options of the lock URL that came from ``source`` (see
    :func:`choose_url`): ``singleton_lock_transport_options`` when set, else those of the
    broker or result backend the URL was inherited from.

    Raises:
        LockConfigurationError: the options are not a dict.
    """
    setting = _options_setting(conf, source)
    options = conf.get(setting)
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise LockConfigurationError(f"{setting} must be a dict, got {options!r}")
    return dict(options)


def _options_setting(conf: Any, source: str) -> str:
    """The setting that holds the transport options of a lock URL from ``source``."""
    if conf.get("singleton_lock_transport_options") is not None:
        return "singleton_lock_transport_options"
    return TRANSPORT_OPTIONS_SETTINGS.get(source, "singleton_lock_transport_options")


def choose_url(conf: Any) -> tuple[str, str]:
    """The lock server URL and where it came from (the setting, broker, backend or default).

    Raises:
        LockConfigurationError: ``singleton_lock_url`` is not a usable Redis or Sentinel URL,
            or a Sentinel URL (given or inherited) has no ``master_name`` in its options.
    """
    explicit = as_url(conf.get("singleton_lock_url"))  # a quorum's list: its one-string form
    candidates = (
        [("singleton_lock_url", explicit)]
        if explicit
        else [
            (
                "broker_url",
                _inherited_url(
                    celery_setting(conf, "broker_write_url") or celery_setting(conf, "broker_url")
                ),
            ),
            ("result_backend", _inherited_url(celery_setting(conf, "result_backend"))),
        ]
    )
    for source, url in candidates:
        if not url:
            continue
        if source == "singleton_lock_url" or is_sentinel(url):
            try:
                check_url(
                    url,
                    transport_options(conf, source),
                    options_setting=_options_setting(conf, source),
                )
            except LockConfigurationError as exc:
                raise LockConfigurationError(f"{source}: {exc.message}") from None
        return url, source
    return DEFAULT_URL, "default"


def check_url(
    url: str,
    transport_options: Optional[Mapping[str, Any]] = None,
    *,
    options_setting: str = "singleton_lock_transport_options",
) -> str:
    """``url`` if redis-py would connect where it says, else ``LockConfigurationError``.

    redis-py rejects a non-Redis scheme only with a traceback-worthy ``ValueError`` and
    silently ignores a database path that is not a number (querying db 0 instead). A Sentinel
    URL must also have a ``master_name`` in ``transport_options`` (read from
    ``options_setting``, named in the error).
    """
    if is_postgres(url):
        return check_postgres_url(url)
    servers = quorum_urls(url)
    if servers is not None:
        check_quorum(servers)
        return url
    if is_sentinel(url):
        parse_sentinel_url(url)
        sentinel_options(url, transport_options, options_setting=options_setting)
        return url
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


def check_postgres_url(url: str) -> str:
    """``url`` if it names a PostgreSQL database with ports that are numbers, else
    ``LockConfigurationError`` (the rest is libpq's to judge when it connects). libpq's
    multi-host form, ``host1:port1,host2:port2`` (with ``target_session_attrs=read-write``
    it connects to whichever is the primary, and so follows a failover), is checked host by
    host."""
    try:
        parts = urlsplit(url)
        userinfo, _, hosts = parts.netloc.rpartition("@")
        for host in hosts.split(","):
            # raises ValueError when a port is not a number
            _ = parts._replace(netloc=f"{userinfo}@{host}" if userinfo else host).port
    except ValueError as exc:
        raise LockConfigurationError(
            f"lock server URL {redact_loosely(url)!r} is invalid: {exc}"
        ) from None
    return url


def check_quorum(servers: list[str]) -> None:
    """Each of a quorum's URLs must name one plain Redis server, and there must be 3 or more.

    Raises:
        LockConfigurationError: saying which URL and why.
    """
    if len(servers) < MIN_SERVERS:
        raise LockConfigurationError(
            f"a Redlock quorum needs at least {MIN_SERVERS} independent Redis servers, got "
            f"{len(servers)} URL(s); list 3 or 5, or give one URL for a single server"
        )
    for part in servers:
        if not isinstance(part, str) or is_sentinel(part):
            raise LockConfigurationError(
                f"lock server URL {redact_loosely(str(part))!r} in a Redlock quorum must be "
                "redis://, rediss:// or unix:// of one independent server (no Sentinel, no "
                "Cluster inside a quorum)"
            )
        check_url(part)


def make_client(
    url: str,
    options: Optional[dict[str, Any]] = None,
    transport_options: Optional[Mapping[str, Any]] = None,
    *,
    cluster: Optional[bool] = False,
) -> Client:
    """A redis-py client for ``url`` (TLS and ACL user/password come from the URL).

    For a Sentinel URL: redis-py's ``Sentinel(...).master_for(master_name)`` client, the
    master name and sentinel options taken from ``transport_options``. For a Redis Cluster
    (``cluster`` True, or None and the server says ``cluster_enabled:1``): redis-py's
    ``RedisCluster``, with the same timeouts and retry policy.

    Raises:
        LockConfigurationError: a Sentinel URL that does not parse or has no master name; a
            cluster named by a ``unix://`` URL.
        LockBackendUnavailable: ``cluster`` is None and the server could not be asked.
    """
    settings = {
        **CLIENT_DEFAULTS,
        "retry": Retry(ExponentialBackoff(cap=0.2, base=0.02), 2),
        "client_name": client_name(),
        **(options or {}),
    }
    if not is_sentinel(url):
        if cluster is None:
            cluster = is_cluster(url, settings)
        if cluster:
            if urlsplit(url).scheme == "unix":
                raise LockConfigurationError(
                    f"lock server {redact(url)} is a Redis Cluster, which redis-py reaches "
                    "over TCP only: give the redis:// URL of one of its nodes"
                )
            # the cluster client takes the retry policy itself: its nodes' connections do not
            # retry (a retry there could not follow a slot that moved)
            return RedisCluster.from_url(url, **settings)
        return redis.Redis.from_url(url, **settings)
    where = parse_sentinel_url(url)
    chosen = sentinel_options(url, transport_options)
    credentials = {"username": where.username, "password": where.password}
    # The sentinels get the client's timeouts unless told otherwise (redis-py's own default,
    # which sentinel_kwargs={} would otherwise replace with none: a query could hang).
    sentinel_kwargs = {key: value for key, value in settings.items() if key.startswith("socket_")}
    sentinel_kwargs.update(chosen["sentinel_kwargs"])
    if "connection_class" not in settings:
        # redis-py picks its SSL class from "ssl" only when no class is given
        tls = settings.pop("ssl", False)
        settings["connection_class"] = (
            SentinelMasterSSLConnection if tls else SentinelMasterConnection
        )
    sentinel = _Sentinel(
        where.sentinels,
        min_other_sentinels=chosen["min_other_sentinels"],
        sentinel_kwargs=sentinel_kwargs,
        db=where.db,
        **{key: value for key, value in credentials.items() if value is not None},
        **settings,
    )
    client: redis.Redis = sentinel.master_for(chosen["master_name"])
    return client


def is_cluster(url: str, settings: Mapping[str, Any]) -> bool:
    """True if the server at ``url`` is a node of a Redis Cluster (``INFO cluster``).

    A server that refuses ``INFO`` (an ACL user without ``@dangerous``, a renamed command) is
    taken for a single server, with a WARNING: a cluster must then be named by
    ``singleton_lock_cluster = True``.

    Raises:
        LockBackendUnavailable: the server could not be reached.
    """
    probe = redis.Redis.from_url(url, **settings)
    try:
        enabled = probe.info("cluster").get("cluster_enabled")
    except redis.exceptions.ResponseError as exc:
        log.warning(
            "lock server %s refused INFO (%s): taken for a single server; set "
            "singleton_lock_cluster = True if it is a node of a Redis Cluster",
            redact(url),
            exc,
        )
        return False
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
        # the cause first: naming the cluster question here sent people to
        # singleton_lock_cluster for a server that was down or refused the password
        raise LockBackendUnavailable(
            f"lock server {redact(url)} unavailable when first contacted "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    finally:
        probe.close()
    return str(enabled) == "1"


def cluster_setting(conf: Any) -> Optional[bool]:
    """``singleton_lock_cluster``: True, False, or None (ask the server).

    Raises:
        LockConfigurationError: anything else.
    """
    value = conf.get("singleton_lock_cluster")
    if value is not None and not isinstance(value, bool):
        raise LockConfigurationError(
            f"singleton_lock_cluster must be True, False or None (ask the server), got {value!r}"
        )
    return value


def close_client(client: Client) -> None:
    """Close ``client``'s connections, and those to its sentinels if it has any."""
    client.close()
    manager = getattr(getattr(client, "connection_pool", None), "sentinel_manager", None)
    for sentinel in getattr(manager, "sentinels", ()):
        sentinel.close()
