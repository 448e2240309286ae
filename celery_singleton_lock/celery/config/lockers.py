"""The one locker per app and process that talks to the app's lock server(s).

Made on first use from the app's settings (:mod:`.servers`); a forked child (a prefork
pool child) makes its own, with clients of its own."""

from __future__ import annotations

import logging
import weakref
from typing import Any, Mapping, Optional

from celery_singleton_lock.celery.config.app_settings import lock_prefix
from celery_singleton_lock.celery.config.servers import (
    choose_url,
    cluster_setting,
    make_client,
    transport_options,
)
from celery_singleton_lock.celery.config.urls import is_postgres, quorum_urls
from celery_singleton_lock.engine import (
    ForkSafeLock,
    LockBackend,
    QuorumLocker,
    RedisLocker,
    postgres_locker,
    reset_in_forked_children,
)
from celery_singleton_lock.errors import LockConfigurationError

log = logging.getLogger("celery_singleton_lock.worker")

_lockers: weakref.WeakKeyDictionary[Any, LockBackend] = weakref.WeakKeyDictionary()
_lockers_lock = ForkSafeLock()
#: Changed whenever a locker is kept or dropped (here, or by a forked child): what was cached
#: from ``locker_for`` (a task's prepared acquire) is that locker still while this is the same.
generation = 0


class _ChildMakesItsOwnLockers:
    """A forked child (a prefork pool child) makes its own lockers, with clients of its own.

    redis-py resets a connection pool it finds in a child under that pool's lock, and since
    redis-py 8 that lock is the one its parent's threads take for every command: the worker's
    main process renews its children's locks and hands locks on from threads of its own, and
    a child forked while one of them held the lock hung on its first acquire, for good.
    """

    def after_fork_in_child(self) -> None:
        global generation
        _lockers.clear()
        generation += 1


_child_lockers = _ChildMakesItsOwnLockers()
reset_in_forked_children(_child_lockers)


def locker_for(app: Any) -> LockBackend:
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
    global generation
    with _lockers_lock:
        locker = _lockers.get(app)
        if locker is None:
            locker = _lockers[app] = made
            generation += 1
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
) -> LockBackend:
    """The locker of the server(s) ``url`` names: a PostgreSQL one for a ``postgresql://``
    URL, a :class:`QuorumLocker` over a client per server for a quorum (see
    :mod:`.urls`), else a ``RedisLocker`` over :func:`make_client`.

    Raises:
        LockConfigurationError: ``singleton_lock_cluster = True`` with a quorum or PostgreSQL;
            a PostgreSQL URL without psycopg installed.
    """
    if is_postgres(url):
        if cluster:
            raise LockConfigurationError(
                "singleton_lock_cluster = True, but singleton_lock_url is a PostgreSQL URL"
            )
        return postgres_locker(url, prefix=prefix)
    servers = quorum_urls(url)
    if servers is None:
        client = make_client(url, options, transport, cluster=cluster)
        return RedisLocker(client, prefix=prefix)
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
    return QuorumLocker(clients, prefix=prefix)  # type: ignore[arg-type]  # plain clients


def close_locker(locker: LockBackend) -> None:
    """Close ``locker``'s connections (every server's, for a quorum)."""
    locker.close()


def forget_locker(app: Any) -> None:
    """Drop ``app``'s locker, e.g. after its settings changed (tests)."""
    global generation
    with _lockers_lock:
        locker = _lockers.pop(app, None)
        generation += 1
    if locker is not None:
        close_locker(locker)


def all_lockers() -> list[LockBackend]:
    with _lockers_lock:
        return list(_lockers.values())
