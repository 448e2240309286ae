"""The contender registry: every lock the benchmarks time, declared once.

A contender says how to build it for the engine-level benchmarks (``engine``, ``quorum``,
``replicas``: a call that takes and releases a free lock, no Celery) and for the worker-level
ones (``celery``, ``fastpath``, ``dedupe``: a no-op task on a Celery app, its lock taken and
released around the body by whatever the contender is), and which keys it leaves behind if
a lock is not released. A benchmark picks contenders by key (:func:`pick`); the paired loop
(``bench/_paired.py``) times them.

Each contender's lock client is built from the benchmark's (engine level) or counts its own
requests (worker level: ``WorkerSetup.connection_class``), so lock round trips are counted
per contender, apart from the broker's traffic.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import partial
from typing import Callable, Dict, List, Optional, Sequence

from celery_singleton_lock.engine import RedisLocker

from ._builds import (
    EngineBuild,
    FStringKeyer,
    PooledLocker,
    WorkerBuild,
    engine_cycle,
    floor_cycle,
    floor_task,
    locked_task,
    metrics_task,
    once_cycle,
    once_task,
    pgbouncer_cycle,
    pgbouncer_task,
    plain_task,
    postgres_cycle,
    postgres_floor_cycle,
    postgres_task,
    python_redis_lock_cycle,
    quorum_cycle,
    redis_py_cycle,
    rule_cycle,
    singleton_cycle,
    singleton_task,
    skipped_task,
    slots_cycle,
    variant_task,
)


@dataclass(frozen=True)
class Contender:
    key: str
    label: str  # worker level
    worker: Optional[WorkerBuild] = None
    engine_label: str = ""
    engine: Optional[EngineBuild] = None
    #: SCAN pattern of its lock keys, from (bench prefix, task name); None: takes no lock
    lock_keys: Optional[Callable[[str, str], str]] = None
    #: the module of a third-party library it needs; without it the contender is n/a (and a
    #: failure of its own, e.g. at enqueue, shows it as n/a instead of stopping the run)
    needs: str = ""

    def missing(self) -> str:
        """Why the contender cannot run here ("" if it can)."""
        if not self.needs:
            return ""
        try:
            importlib.import_module(self.needs)
        except Exception as exc:  # noqa: BLE001  (any import failure: shown as n/a)
            return f"{type(exc).__name__}: {exc}"
        return ""


# -- the registry ----------------------------------------------------------------------------------


def _floor_keys(prefix: str, name: str) -> str:
    return f"{prefix}-floor:*"


def _locked_keys(prefix: str, name: str) -> str:
    return f"{prefix}-lock*"


CONTENDERS = [
    Contender("plain", "plain Celery Task", plain_task),
    Contender(
        "floor",
        "floor: SET NX PX + DEL",
        floor_task,
        engine_label="floor: SET NX PX + DEL",
        engine=floor_cycle,
        lock_keys=_floor_keys,
    ),
    Contender(
        "locked",
        "LockedTask",
        locked_task,
        engine_label="engine: try_acquire + release (renew=True)",
        engine=engine_cycle(),
        lock_keys=_locked_keys,
    ),
    Contender(
        "locked-no-renew",
        "",
        engine_label="engine: try_acquire + release (renew=False)",
        engine=engine_cycle(renew=False),
    ),
    Contender(
        "locked-replica",
        "",
        engine_label="min_replicas=1 (WAIT)",
        engine=engine_cycle(min_replicas=1),
    ),
    Contender("quorum", "", engine_label="Redlock quorum of 3", engine=quorum_cycle),
    # lock_limit: 1 is the mutex (the same script and keys as "locked"); N > 1 one of N slots
    Contender("limit1", "", engine_label="lock_limit=1", engine=engine_cycle(limit=1)),
    Contender("limit1-rule", "", engine_label="lock_limit=1 + live rule", engine=rule_cycle),
    Contender("limit3", "", engine_label="lock_limit=3", engine=slots_cycle(3)),
    Contender("limit10", "", engine_label="lock_limit=10", engine=slots_cycle(10)),
    Contender(
        "limit10-busy", "", engine_label="lock_limit=10, 9 held", engine=slots_cycle(10, busy=9)
    ),
    Contender(
        "locked2", "LockedTask again (A/A)", variant_task(RedisLocker), lock_keys=_locked_keys
    ),
    Contender(
        "metrics",
        "LockedTask, metrics on",
        metrics_task,
        lock_keys=_locked_keys,
        needs="prometheus_client",
    ),
    Contender(
        "pooled",
        "LockedTask, no kept connections",
        variant_task(PooledLocker),
        lock_keys=_locked_keys,
    ),
    Contender(
        "fstring",
        "LockedTask, f-string lock name",
        variant_task(RedisLocker, FStringKeyer),
        lock_keys=_locked_keys,
    ),
    # every call skipped (its lock held by the bench all along): a skip against a no-op run
    Contender(
        "skipped",
        "LockedTask, every call skipped",
        skipped_task,
        # its lock (under <prefix>-held) is held on purpose; a skip writes no key of its own,
        # so nothing may match this (and its lock requests are counted as the others')
        lock_keys=lambda prefix, name: f"{prefix}-held-left:*",
    ),
    Contender(
        "dedupe",
        "LockedTask dedupe_on_enqueue",
        partial(locked_task, dedupe_on_enqueue=True),
        lock_keys=_locked_keys,
    ),
    # PostgreSQL row leases (bench/postgres.py), in a schema of the run's own
    Contender(
        "pg-floor",
        "",
        engine_label="PostgreSQL floor: INSERT ON CONFLICT DO NOTHING + DELETE",
        engine=postgres_floor_cycle,
        needs="psycopg",
    ),
    Contender(
        "postgres",
        "LockedTask, locks in PostgreSQL",
        postgres_task,
        engine_label="PostgresLocker: try_acquire + release",
        engine=postgres_cycle,
        # its locks are rows, not Redis keys: nothing of it may match on the Redis
        lock_keys=lambda prefix, name: f"{prefix}-pg:*",
        needs="psycopg",
    ),
    Contender(
        "pgbouncer",
        "LockedTask, locks in PostgreSQL through PgBouncer",
        pgbouncer_task,
        engine_label="PostgresLocker through PgBouncer (transaction mode)",
        engine=pgbouncer_cycle,
        lock_keys=lambda prefix, name: f"{prefix}-pgb-pg:*",
        needs="psycopg",
    ),
    Contender(
        "redis-py",
        "",
        engine_label="redis-py Lock: acquire + release",
        engine=redis_py_cycle,
    ),
    Contender(
        "python-redis-lock",
        "",
        engine_label="python-redis-lock: acquire + release",
        engine=python_redis_lock_cycle,
        needs="redis_lock",
    ),
    Contender(
        "once",
        "celery-once QueueOnce",
        once_task,
        engine_label="celery-once: raise_or_lock + clear_lock",
        engine=once_cycle,
        lock_keys=lambda prefix, name: f"qo_{name}*",
        needs="celery_once",
    ),
    Contender(
        "singleton",
        "celery-singleton Singleton",
        singleton_task,
        engine_label="celery-singleton: lock + unlock",
        engine=singleton_cycle,
        lock_keys=lambda prefix, name: f"{prefix}-singleton:*",
        needs="celery_singleton",
    ),
]
REGISTRY: Dict[str, Contender] = {c.key: c for c in CONTENDERS}


def pick(keys: Sequence[str], level: str) -> List[Contender]:
    """The contenders of ``keys``, in that order, each buildable at ``level``
    (``"engine"`` or ``"worker"``)."""
    picked = [REGISTRY[key] for key in keys]
    for contender in picked:
        if getattr(contender, level) is None:
            raise ValueError(f"contender {contender.key!r} has no {level}-level build")
    return picked
