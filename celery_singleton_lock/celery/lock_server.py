"""Which Redis holds an app's locks, and the one locker per app and process that talks to it.

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
import weakref
from dataclasses import dataclass
from typing import Any, Mapping, Optional
from urllib.parse import parse_qs, urlsplit, urlunsplit

import redis
import redis.sentinel
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from ..engine import RedisLocker
from ..engine.inspect import Client
from ..engine.process import ForkSafeLock, reset_in_forked_children
from ..engine.quorum import MIN_SERVERS, QuorumLocker
from ..errors import LockBackendUnavailable, LockConfigurationError
from .options import celery_setting, lock_prefix
from .quorum import as_url, quorum_urls

log = logging.getLogger("celery_singleton_lock.worker")

REDIS_SCHEMES = ("redis", "rediss", "unix")
SENTINEL_SCHEME = "sentinel"
#: Port of a ``sentinel://host`` part that names none (kombu's default too).
SENTINEL_PORT = 26379
DEFAULT_URL = "redis://localhost:6379/0"

#: redis-py's Sentinel manager (untyped in redis-py 4.x).
_Sentinel: Any = redis.sentinel.Sentinel


class SentinelMasterConnection(redis.sentinel.SentinelManagedConnection):
    """redis-py's connection to a Sentinel group's master, that asks the sentinels again
    whenever it reconnects.

    redis-py's own class asks them only in ``connect()``. In recent redis-py (8.1; not 4.5) a
    disconnected connection reconnects from ``send_packed_command`` through
    ``connect_check_health()`` instead, to the address it had: a connection that the locker
    keeps checked out (see ``engine/pinned.py``) and that was dropped because its master was
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


def is_sentinel(url: str) -> bool:
    """True for Celery's Sentinel form, ``sentinel://host:port;sentinel://host:port;...``."""
    return url.lstrip().lower().startswith(f"{SENTINEL_SCHEME}://")


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


def redact(url: str) -> str:
    """``url`` with its password hidden, for logs (each part of a Sentinel URL or quorum)."""
    servers = quorum_urls(url)
    if servers is not None:
        return ",".join(redact(part) for part in servers)
    if ";" in url and is_sentinel(url):
        return ";".join(redact(part) for part in url.split(";"))
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
        raise LockBackendUnavailable(
            f"lock server {redact(url)} unavailable: could not ask it whether it is a Redis "
            f"Cluster ({type(exc).__name__}: {exc}); set singleton_lock_cluster = True or "
            "False to say it and skip the question"
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


_lockers: weakref.WeakKeyDictionary[Any, RedisLocker] = weakref.WeakKeyDictionary()
_lockers_lock = ForkSafeLock()


class _ChildMakesItsOwnLockers:
    """A forked child (a prefork pool child) makes its own lockers, with clients of its own.

    redis-py resets a connection pool it finds in a child under that pool's lock, and since
    redis-py 8 that lock is the one its parent's threads take for every command: the worker's
    main process renews its children's locks and hands locks on from threads of its own, and
    a child forked while one of them held the lock hung on its first acquire, for good.
    """

    def after_fork_in_child(self) -> None:
        _lockers.clear()


_child_lockers = _ChildMakesItsOwnLockers()
reset_in_forked_children(_child_lockers)


def locker_for(app: Any) -> RedisLocker:
    """The locker of ``app`` in this process (created on first use; see
    :class:`_ChildMakesItsOwnLockers` for a forked child).

    Raises:
        LockBackendUnavailable: the server could not be asked whether it is a Redis Cluster
            (``singleton_lock_cluster`` unset); nothing is kept, the next call asks again.
    """
    locker = _lockers.get(app)
    if locker is not None:
        return locker
    conf = app.conf
    url, source = choose_url(conf)
    # Made outside the lock: asking whether the server is a cluster is a round trip, and a
    # fork while another thread held the lock would leave the child unable to get a locker.
    made = make_locker(
        url,
        conf.get("singleton_lock_redis_options"),
        transport_options(conf, source),
        cluster=cluster_setting(conf),
        prefix=lock_prefix(conf),
    )
    with _lockers_lock:
        locker = _lockers.get(app)
        if locker is None:
            locker = _lockers[app] = made
            return locker
    close_locker(made)  # another thread made the locker meanwhile
    return locker


def make_locker(
    url: str,
    options: Optional[dict[str, Any]],
    transport: Optional[Mapping[str, Any]],
    *,
    cluster: Optional[bool],
    prefix: str,
) -> RedisLocker:
    """The locker of the server(s) ``url`` names: a :class:`QuorumLocker` over a client per
    server for a quorum (see :mod:`.quorum`), else a ``RedisLocker`` over :func:`make_client`.

    Raises:
        LockConfigurationError: ``singleton_lock_cluster = True`` with a quorum.
    """
    servers = quorum_urls(url)
    if servers is None:
        return RedisLocker(make_client(url, options, transport, cluster=cluster), prefix=prefix)
    if cluster:
        raise LockConfigurationError(
            "singleton_lock_cluster = True, but singleton_lock_url lists a Redlock quorum of "
            "independent servers; a quorum's servers cannot be Cluster nodes"
        )
    if len(servers) % 2 == 0:
        log.warning(
            "a Redlock quorum of %d servers tolerates no more failures than one of %d: an odd "
            "count is enough",
            len(servers),
            len(servers) - 1,
        )
    clients = [make_client(part, options, cluster=False) for part in servers]
    return QuorumLocker(clients, prefix=prefix)  # type: ignore[arg-type]


def close_locker(locker: RedisLocker) -> None:
    """Close ``locker``'s connections (every server's, for a quorum)."""
    if isinstance(locker, QuorumLocker):
        locker.close()
    else:
        close_client(locker.client)


def forget_locker(app: Any) -> None:
    """Drop ``app``'s locker, e.g. after its settings changed (tests)."""
    with _lockers_lock:
        locker = _lockers.pop(app, None)
    if locker is not None:
        close_locker(locker)


def all_lockers() -> list[RedisLocker]:
    with _lockers_lock:
        return list(_lockers.values())
