"""``locks doctor``: what makes locks go wrong in production, as seen from here, with the fix.

Each check reads, never writes, and says what it found as :class:`Finding` lines: ``error``
and ``warning`` make the command exit 1, ``info`` lines only inform (counts, checks that need
``-A``). The checks: the eviction policy of every lock server, persistence against what
fencing relies on, Sentinel / Cluster / quorum health, orphaned locks (the holder's worker
node does not answer a ping), stray enqueue markers, parked calls behind a free lock, and the
number of fence counters and finish records. Every SCAN is bounded (:data:`SCAN_LIMIT`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import shlex
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional

import click
import redis
from redis.cluster import RedisCluster
from redis.sentinel import SentinelConnectionPool

from celery_singleton_lock.celery.cli.app_target import CliError, Target
from celery_singleton_lock.celery.cli.lock_listing import describe_holder, is_worker_node
from celery_singleton_lock.celery.cli.lock_release import (
    node_is_alive,
    ping_timeout_option,
    release_command,
)
from celery_singleton_lock.celery.config.resolution import handoff_settings
from celery_singleton_lock.celery.worker.start_checks import (
    EVICTION_FIX,
    eviction_finding,
    locked_tasks,
)
from celery_singleton_lock.engine import Client, KeyspaceReader, PartsReader, slot_of
from celery_singleton_lock.errors import LockConfigurationError, LockError

#: No SCAN of the doctor looks at more than this many matching keys.
SCAN_LIMIT = 100_000
#: Holders of at most this many distinct worker nodes are pinged.
NODES_PINGED = 50
#: Seconds each node has to answer, by default.
PING_TIMEOUT = 1.0
EXIT_UNHEALTHY = 1

_ERRORS = (redis.RedisError, LockError, OSError)


@dataclass
class Finding:
    """One line of the doctor's report."""

    severity: str  #: "error", "warning" or "info"
    check: str
    message: str
    fix: str = ""

    def line(self) -> str:
        fix = f"; fix: {self.fix}" if self.fix else ""
        return f"{self.severity.upper()} {self.check}: {self.message}{fix}"

    @property
    def unhealthy(self) -> bool:
        return self.severity != "info"


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _servers(target: Target) -> list[tuple[str, redis.Redis]]:
    """Every Redis server holding locks, as (label, client): a quorum's servers, a
    Cluster's primaries, or the one server (a Sentinel group's master)."""
    if target.quorum:
        return [(f"quorum server {i + 1}", c) for i, c in enumerate(target.clients)]  # type: ignore[misc]
    client = target.client
    if isinstance(client, RedisCluster):
        return [
            (f"cluster primary {node.name}", client.get_redis_connection(node))
            for node in client.get_primaries()  # type: ignore[no-untyped-call]
        ]
    return [("", client)]  # one server: its findings need no label


def _on(label: str, text: str) -> str:
    return f"{label}: {text}" if label else text


def _config(client: redis.Redis, name: str) -> str:
    reply = client.config_get(name)
    return _text({_text(k): v for k, v in reply.items()}.get(name, ""))


def check_eviction(servers: list[tuple[str, redis.Redis]]) -> list[Finding]:
    found = []
    for label, client in servers:
        try:
            policy = _config(client, "maxmemory-policy")
        except redis.RedisError as exc:
            found.append(
                Finding("warning", "eviction", _on(label, f"cannot read maxmemory-policy ({exc})"))
            )
            continue
        risk = eviction_finding(policy)
        if risk is not None:
            severity = "error" if risk[0] >= logging.ERROR else "warning"
            found.append(Finding(severity, "eviction", _on(label, risk[1]), EVICTION_FIX))
    return found


def check_persistence(servers: list[tuple[str, redis.Redis]], app: Any) -> list[Finding]:
    """Fences are strictly increasing only while the fence counters survive a restart."""
    fenced = [t.name for t in locked_tasks(app) if t.lock_options.fencing] if app else None
    found = []
    for label, client in servers:
        try:
            aof, fsync = _config(client, "appendonly"), _config(client, "appendfsync")
        except redis.RedisError as exc:
            found.append(Finding("warning", "persistence", _on(label, f"cannot read ({exc})")))
            continue
        if aof == "yes" and fsync != "no":
            continue
        what = (
            "appendonly yes but appendfsync no: the last increments of a fence counter can be "
            "lost with the machine"
            if aof == "yes"
            else "appendonly no: a restart loses fence counter increments since the last "
            "snapshot (all of them without one), and held locks"
        )
        fix = "appendonly yes with appendfsync everysec (always to lose none)"
        if fenced:
            message = _on(label, f"{what}, so fences can repeat (tasks with lock_fencing: ")
            found.append(Finding("warning", "persistence", f"{message}{', '.join(fenced)})", fix))
        else:
            scope = "no task uses lock_fencing" if fenced is not None else "give -A to know"
            found.append(Finding("info", "persistence", _on(label, f"{what} ({scope})")))
    return found


def check_topology(target: Target) -> list[Finding]:
    """What the Sentinels, the Cluster or the quorum say of themselves, from here."""
    if target.quorum:
        down = []
        for label, server in _servers(target):
            try:
                server.ping()
            except _ERRORS as exc:
                down.append(f"{label} ({type(exc).__name__})")
        if not down:
            return []
        severity = (
            "error" if len(target.clients) - len(down) <= len(target.clients) // 2 else "warning"
        )
        return [
            Finding(
                severity,
                "quorum",
                f"{len(down)} of {len(target.clients)} servers do not answer: " + ", ".join(down),
                "bring them back: a quorum needs a majority answering to take any lock",
            )
        ]
    client = target.client
    if isinstance(client, RedisCluster):
        return _cluster_health(client)
    pool = getattr(client, "connection_pool", None)
    if isinstance(pool, SentinelConnectionPool):
        return _sentinel_health(pool)
    return []


def _cluster_health(client: RedisCluster) -> list[Finding]:
    found = []
    try:
        info = client.cluster_info()
        state = _text(info.get("cluster_state", "?")) if isinstance(info, dict) else "?"
    except _ERRORS as exc:
        state = f"unreadable ({exc})"
    if state != "ok":
        fix = "fix the cluster (redis-cli --cluster check) before trusting its locks"
        found.append(Finding("error", "cluster", f"cluster_state is {state}", fix))
    for node in client.get_nodes():  # type: ignore[no-untyped-call]
        try:
            client.get_redis_connection(node).ping()
        except _ERRORS as exc:
            fix = "bring the node back or remove it from the cluster"
            found.append(
                Finding("error", "cluster", f"node {node.name} does not answer ({exc})", fix)
            )
    return found


def _sentinel_health(pool: SentinelConnectionPool) -> list[Finding]:
    service = pool.service_name
    found = []
    checked = False
    for sentinel in pool.sentinel_manager.sentinels:
        where = "{host}:{port}".format(**sentinel.connection_pool.connection_kwargs)
        try:
            master = sentinel.sentinel_master(service)
            if not checked:
                sentinel.execute_command("SENTINEL CKQUORUM", service)
                checked = True
        except _ERRORS as exc:
            found.append(
                Finding(
                    "warning" if not isinstance(exc, redis.ResponseError) else "error",
                    "sentinel",
                    f"sentinel {where} about master {service!r}: {exc}",
                    "bring the sentinels back: a failover needs their quorum",
                )
            )
            continue
        flags = _text(master.get("flags", "")) if isinstance(master, dict) else ""
        if "down" in flags:
            fix = "the master is down as this sentinel sees it: check the failover"
            found.append(Finding("error", "sentinel", f"sentinel {where}: flags {flags}", fix))
    return found


#: COUNT of the doctor's SCAN calls (the shared keys on a Cluster, where there is no index):
#: short calls (well under a ms each), many of them in a large database.
SCAN_COUNT = 1000


def _scan(client: Client, match: str, type_: str) -> tuple[list[str], bool]:
    """Keys matching ``match`` of type ``type_``, at most :data:`SCAN_LIMIT` (and whether it
    stopped there)."""
    keys: list[str] = []
    for raw in client.scan_iter(match=match, count=SCAN_COUNT, _type=type_):
        keys.append(_text(raw))
        if len(keys) >= SCAN_LIMIT:
            return keys, True
    return keys, False


def _lock_name(prefix: str, key: str) -> str:
    return key[len(prefix) + 2 : key.rindex("}")]


#: How the suggested commands start when the doctor is not run from the command line.
INVOCATION = "celery locks"


def check_orphans(
    target: Target, app: Any, ping_timeout: float, invocation: str = INVOCATION
) -> list[Finding]:
    """Locks (each slot of a lock_limit) whose holder's worker node does not answer a ping,
    each with the command that releases it (``invocation``: the command up to ``release``)."""
    if app is None:
        return [Finding("info", "orphans", "not checked: give -A to ask worker nodes (a ping)")]
    holders = [h for h in target.inspector.scan() if is_worker_node(h.host)][:SCAN_LIMIT]
    alive: dict[str, bool] = {}
    for node in sorted({h.host for h in holders})[:NODES_PINGED]:
        alive[node] = node_is_alive(app, node, ping_timeout)
    found = []
    for holder in holders:
        if alive.get(holder.host, True):
            continue
        ttl = "no TTL" if holder.ttl is None else f"{holder.ttl:.0f}s left"
        name = _lock_name(target.inspector.prefix, holder.key)
        found.append(
            Finding(
                "warning",
                "orphans",
                f"lock {holder.key} held by {describe_holder(holder)}, whose node does not "
                f"answer a ping ({ttl})",
                f"{release_command(invocation, name, slot_of(holder.key))} (or wait for its TTL)",
            )
        )
    return found


#: A marker whose task has not started after this many seconds is named (info): its message
#: may have been lost (a purged queue), which nothing else would tell.
STALE_MARKER = 600.0


def _marker_age(app: Any, name: str, ttl_left: float) -> Optional[float]:
    """Seconds since the marker of lock ``name`` was written (its task's ``lock_queued_ttl``
    less what is left; a countdown's delay counts as waiting), or None when no task of
    ``app`` takes that name."""
    head = name.rpartition(":")[0]
    task = app.tasks.get(head)
    options = getattr(task, "lock_options", None)
    if options is None:
        return None
    return max(0.0, float(options.queued_ttl) - ttl_left)


def check_markers(target: Target, app: Any, invocation: str = INVOCATION) -> list[Finding]:
    """Enqueue markers (dedupe_on_enqueue) with no TTL, or naming a task that already ran:
    either blocks new calls of its lock name."""
    inspector = target.inspector
    if not isinstance(inspector, KeyspaceReader):  # markers are not keys there (a quorum)
        return []
    client, prefix = target.client, inspector.prefix
    # from the marker index on one server (no SCAN), by SCAN on a Cluster
    keys = list(itertools.islice(inspector.marker_keys(), SCAN_LIMIT))
    if not keys:
        return []
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.get(key)
        pipe.ttl(key)
    replies = pipe.execute()
    found = []
    for key, task_id, ttl in zip(keys, replies[0::2], replies[1::2]):
        why = "it has no TTL" if ttl == -1 else None
        if why is None and app is not None and task_id is not None:
            # a result backend that cannot be asked leaves the marker unjudged
            with contextlib.suppress(Exception):
                if app.AsyncResult(_text(task_id)).ready():
                    why = f"its task {_text(task_id)} already ran"
        if why is None and app is not None and task_id is not None and ttl > 0:
            waited = _marker_age(app, _lock_name(prefix, key), ttl)
            if waited is not None and waited >= STALE_MARKER:
                name = _lock_name(prefix, key)
                found.append(
                    Finding(
                        "info",
                        "markers",
                        f"enqueue marker {key} names task {_text(task_id)}, queued "
                        f"{waited / 60:.0f} min ago and not started: if its message was lost "
                        f"(a purged queue), calls of this lock name are not published for "
                        f"{ttl / 60:.0f} more min",
                        f"{invocation} clear-queued {shlex.quote(name)} (only if it was lost)",
                    )
                )
        if why:
            name = _lock_name(prefix, key)
            found.append(
                Finding(
                    "warning",
                    "markers",
                    f"enqueue marker {key} is stray: {why}; calls of this lock name are not "
                    "published while it is there",
                    f"{invocation} clear-queued {shlex.quote(name)}",
                )
            )
    return found


def _parked_behind_free(inspector: PartsReader) -> dict[str, int]:
    # from the hand-off index (no SCAN): every lock with a parked call is in it
    parked = inspector.parked_locks(SCAN_LIMIT)
    return {name: count for name, count, held in parked if not held}


def check_parked(
    target: Target, app: Any, sleep: Callable[[float], None] = time.sleep
) -> list[Finding]:
    """Calls parked behind a lock that is free: a hand-off sweeper should have sent the oldest.
    Looked at twice, a sweep interval apart, so a hand-off under way is not reported."""
    inspector = target.inspector
    if not isinstance(inspector, PartsReader):  # nothing is parked there (a quorum)
        return []
    first = _parked_behind_free(inspector)
    if not first:
        return []
    interval = handoff_settings(app.conf)[0] if app is not None else 1.0
    sleep(min(interval, 5.0) + 0.5)
    still = _parked_behind_free(inspector)
    return [
        Finding(
            "warning",
            "parked",
            f"{count} call(s) parked behind free lock {name}: no hand-off sweeper sent the "
            "oldest on",
            f"start a worker that registers {name.rsplit(':', 1)[0]} (its sweeper hands parked "
            "calls on)",
        )
        for name, count in sorted(still.items())
        if name in first
    ]


def check_counts(target: Target) -> list[Finding]:
    inspector = target.inspector
    if not isinstance(inspector, KeyspaceReader):  # no shared keys there (a quorum)
        return []
    client, prefix = target.client, inspector.prefix
    counted_by_name = inspector.shared_counts()  # one server: by name, no SCAN
    if counted_by_name is not None:
        counters, records = counted_by_name
        return [
            Finding("info", "keys", f"{counters} fence counters under prefix {prefix!r}"),
            Finding("info", "keys", f"{records} finish records under prefix {prefix!r}"),
        ]
    found = []
    # the shared keys (engine/keys.py): one counter per server or Cluster slot, finish
    # records as task ids in sorted sets (sharded by task id)
    for what, match, type_ in (
        ("fence counters", f"{prefix}:fence*", "string"),
        ("finish records", f"{prefix}:finished*", "zset"),
    ):
        keys, stopped = _scan(client, match, type_)
        counted = len(keys)
        if type_ == "zset" and keys:
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.zcard(key)
            counted = sum(int(size) for size in pipe.execute())
        count = f"at least {counted}" if stopped else str(counted)
        found.append(Finding("info", "keys", f"{count} {what} under prefix {prefix!r}"))
    return found


def check_postgres(target: Target) -> list[Finding]:
    """A PostgreSQL lock server: a standby or a read-only default takes no lock (error);
    ``fsync`` or ``synchronous_commit`` off lets a crash of the server lose committed leases,
    so a lock may be taken twice after it (warning)."""
    settings_of = getattr(target.inspector, "server_settings", None)
    if settings_of is None:
        raise LockConfigurationError(
            f"locks doctor has no checks for the lock server of {target.source}"
        )
    settings: dict[str, str] = settings_of()
    where = f"PostgreSQL {settings.get('server_version', '?')}"
    found = [Finding("info", "server", f"{where}; the locks are row leases in its tables")]
    if settings.get("in_recovery") == "true":
        found.append(
            Finding(
                "error",
                "server",
                f"{where} is a standby (in recovery): it takes no writes, so no lock",
                "point singleton_lock_url at the primary",
            )
        )
    if settings.get("default_transaction_read_only") == "on":
        found.append(
            Finding(
                "error",
                "server",
                "default_transaction_read_only is on: every acquire fails",
                "ALTER ROLE ... SET default_transaction_read_only = off for the lock role",
            )
        )
    for name in ("fsync", "synchronous_commit"):
        if settings.get(name) == "off":
            found.append(
                Finding(
                    "warning",
                    "persistence",
                    f"{name} is off: a crash of PostgreSQL can lose leases (and fences) it "
                    "had committed, so a lock may be taken twice after the restart",
                    f"{name} = on for the lock role or database",
                )
            )
    return found


def run_doctor(
    target: Target, app: Any, ping_timeout: float = PING_TIMEOUT, invocation: str = INVOCATION
) -> list[Finding]:
    """Every check, in the order of the report (``invocation``: how the commands it suggests
    start, e.g. ``celery -A proj locks``).

    Raises:
        LockConfigurationError: the target has no checks here (neither Redis nor PostgreSQL).
    """
    if not target.clients:
        return [
            *check_postgres(target),
            *check_orphans(target, app, ping_timeout, invocation),
        ]
    servers = _servers(target)
    return [
        *check_topology(target),
        *check_eviction(servers),
        *check_persistence(servers, app),
        *check_orphans(target, app, ping_timeout, invocation),
        *check_markers(target, app, invocation),
        *check_parked(target, app),
        *check_counts(target),
    ]


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON list of the findings.")
@ping_timeout_option(
    PING_TIMEOUT, "Seconds each holder's worker node has to answer a ping (orphaned locks)."
)
@click.pass_obj
def doctor(settings: Any, as_json: bool, ping_timeout: float) -> None:
    """Check what makes locks go wrong in production, and say how to fix it.

    One line per finding, ERROR, WARNING or INFO, with its fix: the eviction policy,
    persistence against fencing, Sentinel / Cluster / quorum health, orphaned locks (the
    holder's node does not answer a ping; needs -A), stray enqueue markers, calls parked
    behind a free lock, and the counts of fence counters and finish records.

    Exit status: 0 healthy (INFO lines only), 1 an ERROR or WARNING, 2 the server could not
    be read.
    """
    try:
        target = settings.target()
        try:
            findings = run_doctor(target, settings.user_app, ping_timeout, settings.invocation)
        finally:
            target.close()
    except _ERRORS as exc:
        raise CliError(f"{exc}") from None
    if as_json:
        click.echo(json.dumps([asdict(finding) for finding in findings]))
    else:
        for finding in findings:
            click.echo(finding.line())
    unhealthy = sum(finding.unhealthy for finding in findings)
    click.echo(f"{unhealthy} problem(s) found on {target.server}", err=True)
    if unhealthy:
        raise SystemExit(EXIT_UNHEALTHY)
