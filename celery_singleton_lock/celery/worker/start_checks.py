"""What a worker checks as it starts.

* Configuration (:class:`ConfigurationCheck`): misspelt ``singleton_lock_*`` settings, a lock
  URL that is not Redis, every locked task's options resolved against the settings as they
  are now (they may have changed since the task was registered), and the tasks of each
  ``lock_group`` against one another (:mod:`.group_agreement`). A worker with a bad
  configuration does not start: it logs one CRITICAL line naming the setting or task and exits
  with status 78 (``EX_CONFIG``) before its pool starts and before it says "ready".
* The lock server (:func:`check_lock_servers`, see :mod:`.server_probe`): one it cannot
  use for a reason retrying will not heal (wrong password, TLS mismatch, a Redis older than a
  task's policy needs) refuses the start the same way; one that is down is named in one
  WARNING saying what the tasks do meanwhile.
* Eviction (:func:`report_lock_server`, at ``worker_ready``): the lock server's
  ``maxmemory-policy``. A server that may evict keys can drop a held lock (two executions run
  at once) or, under ``allkeys-*``, a fence counter (fences go backwards).

Why a bootstep and not a ``worker_init`` receiver: Celery's signal dispatch catches and logs
whatever a receiver raises, and at ``worker_init`` logging is not set up yet, so the error
vanished and the worker started anyway. Bootsteps are built after logging is set up and before
anything starts, and an exception raised there is not caught: it ends the worker command.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

import redis
from celery import bootsteps
from celery.exceptions import WorkerTerminate
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_singleton_lock.celery.config.backend_support import (
    capabilities_from_settings,
    refuse_unsupported,
    requested,
    supports,
)
from celery_singleton_lock.celery.config.group_agreement import check_groups
from celery_singleton_lock.celery.config.lockers import locker_for
from celery_singleton_lock.celery.config.options import KNOWN_SETTINGS, LISTED_IN
from celery_singleton_lock.celery.config.resolution import lock_prefix, suggest, unknown_settings
from celery_singleton_lock.celery.config.servers import (
    choose_url,
    close_client,
    cluster_setting,
    make_client,
    transport_options,
)
from celery_singleton_lock.celery.config.urls import is_postgres, quorum_urls, redact
from celery_singleton_lock.celery.observe import metrics
from celery_singleton_lock.celery.task.locked_task import LockedTask
from celery_singleton_lock.celery.worker.server_probe import (
    Unusable,
    probe,
    probe_postgres,
    redis_version,
    unusable_at_start,
    where,
)
from celery_singleton_lock.engine import CLUSTER, SINGLE_SERVER
from celery_singleton_lock.errors import LockConfigurationError, LockError

log = logging.getLogger("celery_singleton_lock.worker")

#: Exit status of a worker refused for its configuration (sysexits.h ``EX_CONFIG``).
EX_CONFIG = getattr(os, "EX_CONFIG", 78)

#: Seconds the eviction check may wait for the lock server (it runs before "ready").
POLICY_CHECK_TIMEOUT = 2.0


def locked_tasks(app: Any) -> list[LockedTask]:
    """The app's registered tasks that take a singleton lock."""
    return [task for task in app.tasks.values() if isinstance(task, LockedTask) and task.name]


def check_configuration(app: Any) -> None:
    """Validate the app's lock settings and every locked task's options.

    Raises:
        LockConfigurationError: naming the setting or task and what to do.
    """
    typos = unknown_settings(app.conf)
    if typos:
        raise LockConfigurationError(
            "unknown setting(s) "
            + ", ".join(suggest(typo, sorted(KNOWN_SETTINGS)) for typo in typos)
            + f"; the settings are listed in {LISTED_IN}"
        )
    choose_url(app.conf)  # raises on a lock URL that is not Redis
    metrics.check_settings(app.conf)
    tasks = locked_tasks(app)
    for task in tasks:
        task.resolve_lock_options()
    check_groups((task.name, task.lock_options) for task in tasks)  # every task registered now
    check_backend_support(app)


def check_backend_support(app: Any) -> None:
    """Refuse a task option the app's lock backend cannot honour, from its capabilities: on a
    Redis Cluster (``singleton_lock_cluster``, else asked of the server) policy ``queue``,
    ``lock_debounce`` and ``lock_min_replicas``; a quorum's refusals come from the settings,
    at registration too. A server that cannot be asked is left to the first acquire, which
    refuses the same way."""
    asking = [(task.name, requested(task.lock_options)) for task in locked_tasks(app)]
    asking = [(name, values) for name, values in asking if values]
    if not asking:
        return  # nothing any backend refuses: no need to ask the server
    capabilities = capabilities_from_settings(app.conf)
    if capabilities is None:
        cluster = cluster_setting(app.conf)
        if cluster is None and not any(
            not supports(CLUSTER, option, value)
            for _, values in asking
            for option, value in values.items()
        ):
            return  # a server of any kind supports them: not worth a round trip now
        if cluster is None:
            try:
                capabilities = locker_for(app).capabilities
            except LockError as exc:
                log.warning("lock server not reachable to check the lock options: %s", exc)
                return
        else:
            capabilities = CLUSTER if cluster else SINGLE_SERVER
    for name, values in asking:
        refuse_unsupported(name, values, capabilities)


def check_lock_servers(app: Any) -> None:
    """Ask each lock server whether it can be used (:func:`.server_probe.probe`).

    Raises:
        LockConfigurationError: one cannot, for a reason retrying will not heal.
    """
    url, source = choose_url(app.conf)
    if is_postgres(url):
        found = probe_postgres(url, lock_prefix(app.conf))
        if found is not None:
            unusable(app, url, found, 1)
        return
    servers = quorum_urls(url) or [url]
    options = app.conf.get("singleton_lock_redis_options")
    transport = transport_options(app.conf, source)
    needing = needs_newer_redis(locked_tasks(app))
    for server in servers:
        found = probe(
            server,
            options,
            transport,
            setting="singleton_lock_url" if source == "default" else source,
        )
        if found is None:
            unusable_at_start.discard(server)  # a worker started earlier in this process
            if needing:  # asked only when a task needs more than any Redis this supports
                refuse_too_old(needing, where(server), redis_version(server, options, transport))
            continue
        unusable(app, server, found, len(servers))


def unusable(app: Any, server: str, found: Unusable, servers: int) -> None:
    """Refuse the start for a lock server the configuration makes unusable; else warn that
    the worker starts without it (one of ``servers``).

    Raises:
        LockConfigurationError: retrying will not heal it.
    """
    if not found.heals:
        raise LockConfigurationError(found.cause)
    unusable_at_start.add(server)
    log.warning(
        "%s; the worker starts, and until it answers %s",
        found.cause,
        meanwhile(locked_tasks(app), servers),
    )


#: A policy whose scripts need a newer Redis than the others (Redis 6.0): the oldest version
#: they run on, and the commands that need it. See docs/reference/supported-versions.md.
REDIS_NEEDED = {
    "replace": ((6, 2), "ZADD GT/LT and LPOS"),
    "restart": ((6, 2), "ZADD GT/LT and LPOS"),
}


def needs_newer_redis(tasks: list[LockedTask]) -> list[tuple[str, str]]:
    """(task name, policy) of the ``tasks`` whose policy is in :data:`REDIS_NEEDED`."""
    return [
        (task.name, task.lock_options.on_duplicate)
        for task in tasks
        if task.lock_options.on_duplicate in REDIS_NEEDED
    ]


def refuse_too_old(
    needing: list[tuple[str, str]], server: str, version: Optional[tuple[int, ...]]
) -> None:
    """Refuse the start if the lock ``server``'s ``version`` is older than a policy of
    ``needing`` (:func:`needs_newer_redis`) needs; a version not known refuses nothing.

    Raises:
        LockConfigurationError: naming the task, the option, the server's version and what
            to do.
    """
    for task, policy in needing:
        minimum, commands = REDIS_NEEDED[policy]
        if version is not None and version < minimum:
            raise LockConfigurationError(
                f"task {task}: on_duplicate={policy!r} needs Redis >= "
                f"{'.'.join(map(str, minimum))} (its scripts use {commands}), but lock server "
                f"{server} runs Redis {'.'.join(map(str, version))}; upgrade the lock server "
                "(or point singleton_lock_url at a newer one), or choose another on_duplicate"
            )


def meanwhile(tasks: list[LockedTask], servers: int) -> str:
    """What the locked ``tasks`` do while a lock server (of ``servers``) does not answer."""
    running = sorted(task.name for task in tasks if task.lock_options.on_backend_error == "run")
    said = (
        f"locks are taken while a majority of the {servers} servers answer; below that, "
        if servers > 1
        else ""
    )
    if len(running) < len(tasks):
        said += "its locked tasks are retried (lock_on_backend_error="
        said += "'retry')" + (", except " if running else "")
    if running:
        said += f"{', '.join(running)}, which run WITHOUT the lock (lock_on_backend_error='run')"
    return said


class ConfigurationCheck(bootsteps.Step):  # type: ignore[misc]
    """Worker bootstep that refuses to start a worker whose lock configuration is invalid."""

    label = "singleton lock configuration"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        if not locked_tasks(parent.app):
            return  # an app that takes no locks is not ours to check (see .wiring)
        try:
            check_configuration(parent.app)
            check_lock_servers(parent.app)
        except LockConfigurationError as exc:
            log.critical("celery-singleton-lock: worker not started: %s", exc)
            # SystemExit: not caught by Celery on the way out of the worker's constructor
            raise WorkerTerminate(EX_CONFIG) from exc


def install_configuration_check(app: Any) -> None:
    """Add :class:`ConfigurationCheck` to the app's worker blueprint.

    Called from ``worker_init``, which Celery sends just before it builds the blueprint from
    ``app.steps["worker"]``.
    """
    app.steps["worker"].add(ConfigurationCheck)


# -- eviction -------------------------------------------------------------------------------


#: What every eviction finding asks for.
EVICTION_FIX = (
    "set maxmemory-policy noeviction on the lock server (or use a lock server of its own)"
)


def eviction_risk(policy: str) -> Optional[tuple[int, str]]:
    """Log level and message (ending with :data:`EVICTION_FIX`) for a lock server's
    ``maxmemory-policy``; None if it is safe (see :func:`eviction_finding`)."""
    finding = eviction_finding(policy)
    return None if finding is None else (finding[0], f"{finding[1]}; {EVICTION_FIX}")


def eviction_finding(policy: str) -> Optional[tuple[int, str]]:
    """Log level and what can go wrong with a lock server's ``maxmemory-policy``; None if it
    is safe.

    Only ``noeviction`` keeps every key: when memory is full Redis refuses writes instead, so
    an acquire fails loudly (``lock_on_backend_error``) rather than a held lock vanishing.
    ``volatile-*`` evicts only keys with a TTL: lock keys and finished-task markers have one,
    fence counters do not, so exclusion can break but fences stay monotonic (WARNING).
    ``allkeys-*`` may evict anything, fence counters included (ERROR).
    """
    if policy == "noeviction":
        return None
    if policy.startswith("volatile-"):
        return logging.WARNING, (
            f"lock server maxmemory-policy is {policy}: when memory is full it evicts keys "
            "that have a TTL, and lock keys have one, so a held lock can vanish and a "
            "duplicate run at the same time (finished-task markers too, so a redelivered "
            "finished task can run again); fence counters have no TTL and are kept, so "
            "fences stay monotonic and a fenced store still refuses the older holder"
        )
    if policy.startswith("allkeys-"):
        return logging.ERROR, (
            f"lock server maxmemory-policy is {policy}: when memory is full it evicts any "
            "key: a held lock can vanish and a duplicate run at the same time, and a fence "
            "counter can be evicted and restart at 1, so fences go backwards: a fenced store "
            "then refuses the new holder and keeps accepting the stale one"
        )
    return logging.WARNING, (
        f"lock server maxmemory-policy is {policy!r}, which this package does not know; "
        "if it evicts keys, held locks and fence counters can be lost"
    )


def read_eviction_policy(
    url: str,
    options: Optional[dict[str, Any]],
    transport: Optional[dict[str, Any]] = None,
) -> str:
    """The ``maxmemory-policy`` of the server at ``url`` (one ``CONFIG GET``, no retries;
    the master's, for a Sentinel URL with its ``transport`` options).

    Raises:
        redis.RedisError: unreachable, refused (``NOPERM``, ``CONFIG`` renamed away) or no
            such setting in the reply.
    """
    client = make_client(
        url,
        {
            **(options or {}),
            "socket_timeout": POLICY_CHECK_TIMEOUT,
            "socket_connect_timeout": POLICY_CHECK_TIMEOUT,
            "retry": Retry(NoBackoff(), 0),
        },
        transport,
    )
    try:
        reply = client.config_get("maxmemory-policy")
    finally:
        close_client(client)
    # str under RESP2; bytes under some protocol and decoding options
    found = {_text(k): _text(v) for k, v in reply.items()} if isinstance(reply, dict) else {}
    policy = found.get("maxmemory-policy")
    if not policy:
        raise redis.RedisError(f"CONFIG GET maxmemory-policy returned {reply!r}")
    return policy


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def report_lock_server(app: Any) -> None:
    """Log which server holds the locks, and whether it may evict them (``worker_ready``)."""
    tasks = locked_tasks(app)
    if not tasks:
        return  # an app that takes no locks is not ours to report on (see .wiring)
    url, source = choose_url(app.conf)
    log.info(
        "singleton locks on %s (from %s), prefix %r, %d locked task(s)",
        redact(url),
        source,
        lock_prefix(app.conf),
        len(tasks),
    )
    if is_postgres(url):
        return  # no eviction in a database
    for server in quorum_urls(url) or [url]:  # each server of a Redlock quorum
        if server not in unusable_at_start:  # said at start, and asking again costs seconds
            report_eviction_policy(app, server, source)


def report_eviction_policy(app: Any, url: str, source: str) -> None:
    """Log whether the lock server at ``url`` may evict locks (see :func:`eviction_risk`)."""
    try:
        policy = read_eviction_policy(
            url,
            app.conf.get("singleton_lock_redis_options"),
            transport_options(app.conf, source),
        )
    except redis.RedisError as exc:
        log.warning(
            "could not check the lock server's maxmemory-policy (%s: %s); make sure it is "
            "noeviction: a server that evicts keys can drop a held lock",
            type(exc).__name__,
            exc,
        )
        return
    risk = eviction_risk(policy)
    if risk is not None:
        level, message = risk
        log.log(level, "%s", message)
